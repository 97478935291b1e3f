"""Exercise 6.6 — Implementing INT4 Quantization.

References: values computed by hand below, and llama.cpp's gguf-py for the
Q4_0 / Q4_1 block bytes (they must be identical).
"""

from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")


def test_ex6_6_symmetric_int8_by_hand(ex):
    x = np.array([-1.27, 0.0, 0.5, 1.0], dtype=np.float32)
    q = ex.quantize_int(x, bits=8)
    # max |x| = 1.27 -> scale 0.01; codes = rint(x / 0.01)
    assert q.scales.shape == () and q.scales == pytest.approx(0.01)
    assert q.codes.tolist() == [-127, 0, 50, 100] and q.codes.dtype == np.int8
    assert q.zero_points is None
    np.testing.assert_allclose(q.dequantize(), x, atol=0.005 + 1e-7)


def test_ex6_6_asymmetric_int4_by_hand(ex):
    x = np.array([0.0, 1.5, 3.0, 7.5], dtype=np.float32)
    q = ex.quantize_int(x, bits=4, symmetric=False)
    # range [0, 7.5] over codes 0..15 -> scale 0.5, zero point 0
    assert q.scales == pytest.approx(0.5) and int(q.zero_points) == 0
    assert q.codes.tolist() == [0, 3, 6, 15] and q.codes.dtype == np.uint8


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("granularity, group_size", [("tensor", None), ("channel", None), ("group", 32)])
def test_ex6_6_error_is_at_most_half_a_step(ex, bits, symmetric, granularity, group_size):
    x = np.random.default_rng(bits + symmetric).standard_normal((8, 64)).astype(np.float32)
    q = ex.quantize_int(x, bits=bits, symmetric=symmetric, granularity=granularity, group_size=group_size)
    want_scales = {"tensor": (), "channel": (8,), "group": (8, 2)}[granularity]
    assert q.scales.shape == want_scales, f"{granularity}: scales shape {q.scales.shape}, want {want_scales}"
    step = np.broadcast_to(np.repeat(q.scales.reshape(8, -1), 64 // q.scales.reshape(8, -1).shape[1], axis=1)
                           if granularity != "tensor" else q.scales, x.shape)
    err = np.abs(q.dequantize() - x)
    assert np.all(err <= step / 2 + 1e-6), "every value must be within half a quantisation step"


def test_ex6_6_groups_beat_outliers(ex):
    x = np.random.default_rng(0).standard_normal((4, 128)).astype(np.float32)
    x[0, 5] = 100.0  # one outlier
    err = {
        g: np.sqrt(np.mean((ex.quantize_int(x, bits=4, granularity=g, group_size=32 if g == "group" else None)
                            .dequantize() - x) ** 2))
        for g in ("tensor", "channel", "group")
    }
    assert err["group"] < err["channel"] < err["tensor"], f"RMS errors {err}: smaller blocks should isolate the outlier"


def test_ex6_6_zeros_and_bad_input(ex):
    q = ex.quantize_int(np.zeros(16, np.float32), bits=4)
    assert np.all(q.dequantize() == 0) and not np.any(np.isnan(q.dequantize()))
    with pytest.raises(ValueError):
        ex.quantize_int(np.array([1.0, np.nan], np.float32))
    with pytest.raises(ValueError):
        ex.quantize_int(np.zeros((2, 30), np.float32), bits=4, granularity="group", group_size=32)


def test_ex6_6_nibble_packing(ex):
    codes = np.array([1, 2, 15, 0], dtype=np.uint8)
    packed = ex.pack_int4(codes)
    assert packed.tolist() == [0x21, 0x0F], "element 2i in the low nibble, 2i+1 in the high nibble"
    np.testing.assert_array_equal(ex.unpack_int4(packed, signed=False), codes)
    signed = np.array([-8, 7, -1, 0], dtype=np.int8)
    np.testing.assert_array_equal(ex.unpack_int4(ex.pack_int4(signed), signed=True), signed)
    with pytest.raises(ValueError):
        ex.pack_int4(np.array([1, 2, 3], dtype=np.uint8))


DATA = {
    "normal": np.random.default_rng(1).standard_normal((16, 128)).astype(np.float32),
    "cubed": (np.random.default_rng(2).standard_normal((16, 128)) ** 3).astype(np.float32),
    "zeros": np.zeros((2, 64), np.float32),
    "one-sided": np.abs(np.random.default_rng(3).standard_normal((4, 64))).astype(np.float32),
}


@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
@pytest.mark.parametrize("name", DATA)
def test_ex6_6_ggml_blocks_match_llamacpp(ex, kind, name):
    x = DATA[name]
    qtype = gguf.GGMLQuantizationType.Q4_0 if kind == "q4_0" else gguf.GGMLQuantizationType.Q4_1
    ours = getattr(ex, f"quantize_{kind}")(x)
    theirs = gguf.quants.quantize(x, qtype)
    assert ours.shape == theirs.shape, f"{kind}: {ours.shape} bytes, reference {theirs.shape}"
    if not np.array_equal(ours, theirs):
        block = int(np.flatnonzero((ours != theirs).reshape(-1, 18 if kind == "q4_0" else 20).any(axis=1))[0])
        pytest.fail(f"{kind} ({name}): block {block} differs from llama.cpp's bytes")
    back = getattr(ex, f"dequantize_{kind}")(ours)
    np.testing.assert_array_equal(back, gguf.quants.dequantize(theirs, qtype).reshape(-1))
