"""Exercise 6.6 — Implementing INT4 Quantization.

References: values computed by hand below, and llama.cpp's gguf-py for the
Q4_0 / Q4_1 block bytes (they must be identical). Wrong bytes or values are
compared with the engine's quantiser and dequantiser (equal to llama.cpp's)
computed with each known mistake, so the message names the one they match. The
audit, one test per likely mistake: the scale from max instead of absmax (or
over 128); an asymmetric range not widened to include 0; swapped nibbles; no
sign extension; Q4 nibbles in pack_int4's order; Q4_1's d over 16 steps; the
Q4_0 offset (in the quantiser or the dequantiser) or Q4_1's m forgotten; a Q4_0
block of zeros given code 0. The learner's integer codes and scales equal the
engine's up to rounding (:func:`integer.disagreement`), as the notebook shows them.
"""

from __future__ import annotations

import numpy as np
import pytest

from llmrs_core.quant import dequant, ggml_blocks, integer
from llmrs_core.testing import assert_matches, plant

gguf = pytest.importorskip("gguf")


def test_ex6_6_symmetric_scale_is_absmax_over_qmax(ex):
    x = np.array([-1.27, 0.0, 0.5, 1.0], dtype=np.float32)
    q = ex.quantize_int(x, bits=8)
    scale = np.asarray(q.scales)
    assert scale.shape == (), f"one scale per tensor: shape (), got {scale.shape}"
    assert float(scale) != pytest.approx(1.0 / 127), (
        f"scale {float(scale):.6g} = max(x) / 127: the symmetric scale comes from the largest *magnitude*, "
        "max|x| = 1.27 here (the most negative value), so that no value is clipped"
    )
    assert float(scale) != pytest.approx(1.27 / 128), (
        f"scale {float(scale):.6g} = max|x| / 128: symmetric int8 codes go from -127 to 127, so divide by qmax = 127"
    )
    assert float(scale) == pytest.approx(0.01), f"max|x| = 1.27 over qmax = 127: scale 0.01; yours {float(scale):.6g}"


def test_ex6_6_symmetric_int8_by_hand(ex):
    x = np.array([-1.27, 0.0, 0.5, 1.0], dtype=np.float32)
    q = ex.quantize_int(x, bits=8)
    # max |x| = 1.27 -> scale 0.01; codes = rint(x / 0.01)
    assert q.codes.tolist() == [-127, 0, 50, 100], f"codes rint(x / 0.01) are [-127, 0, 50, 100]; yours {q.codes.tolist()}"
    assert q.codes.dtype == np.int8, f"symmetric codes are int8, got {q.codes.dtype}"
    assert q.zero_points is None, "the symmetric scheme has no zero points (None)"
    np.testing.assert_allclose(q.dequantize(), x, atol=0.005 + 1e-7)


def test_ex6_6_asymmetric_int4_by_hand(ex):
    x = np.array([0.0, 1.5, 3.0, 7.5], dtype=np.float32)
    q = ex.quantize_int(x, bits=4, symmetric=False)
    # range [0, 7.5] over codes 0..15 -> scale 0.5, zero point 0
    assert q.scales == pytest.approx(0.5) and int(q.zero_points) == 0
    assert q.codes.tolist() == [0, 3, 6, 15] and q.codes.dtype == np.uint8


def test_ex6_6_asymmetric_range_includes_zero(ex):
    x = np.array([1.0, 2.5, 4.0, 8.5], dtype=np.float32)  # all positive
    q = ex.quantize_int(x, bits=4, symmetric=False)
    scale = float(np.asarray(q.scales))
    assert scale != pytest.approx(0.5), (
        "scale 0.5 = (8.5 - 1.0) / 15: widen [min, max] to include 0 first ([0, 8.5], scale 8.5 / 15), so that 0.0 "
        "(padding, ReLU zeros) is stored exactly and the zero point is a code in 0..15"
    )
    assert scale == pytest.approx(8.5 / 15) and int(q.zero_points) == 0, (
        f"over [0, 8.5]: scale 8.5 / 15 and zero point 0; yours {scale:.6g} and {q.zero_points}"
    )


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


def on_a_grid() -> np.ndarray:
    """float32 [64, 256] dequantised from Q4_1 blocks (by llama.cpp's gguf-py), as SmolLM2's weights are:
    values on a grid, some of them exactly half-way between two integer codes (ties)."""
    x = (np.random.default_rng(2).standard_normal((64, 256)) * 0.05).astype(np.float32)
    q41 = gguf.GGMLQuantizationType.Q4_1
    return gguf.quants.dequantize(gguf.quants.quantize(x, q41), q41).reshape(x.shape)


SCHEMES = [(bits, symmetric, granularity, group_size) for bits in (8, 4) for symmetric in (True, False)
           for granularity, group_size in (("tensor", None), ("channel", None), ("group", 64), ("group", 32))]


def test_ex6_6_agrees_with_the_engine_up_to_rounding(ex):
    """What the notebook shows: your codes, scales and zero points are the engine's, up to the scale's float32
    rounding (one ulp either way) and the codes it moves at a tie."""
    x = on_a_grid()
    for bits, symmetric, granularity, group_size in SCHEMES:
        kw = dict(bits=bits, symmetric=symmetric, granularity=granularity, group_size=group_size)
        problem = integer.disagreement(x, ex.quantize_int(x, **kw), integer.quantize(x, **kw))
        assert problem is None, (
            f"quantize_int(x, {', '.join(f'{k}={v!r}' for k, v in kw.items())}) differs from the engine's beyond "
            f"rounding: {problem}"
        )


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
    assert np.asarray(packed).tolist() != [0x12, 0xF0], (
        "pack_int4([1, 2, 15, 0]) gave [0x12, 0xF0]: the nibbles are swapped — element 2i goes in the low "
        "nibble of byte i, 2i + 1 in the high nibble: [0x21, 0x0F]"
    )
    assert np.asarray(packed).tolist() == [0x21, 0x0F], "element 2i in the low nibble, 2i+1 in the high nibble"
    np.testing.assert_array_equal(ex.unpack_int4(packed, signed=False), codes)
    with pytest.raises(ValueError):
        ex.pack_int4(np.array([1, 2, 3], dtype=np.uint8))


def test_ex6_6_unpack_sign_extends(ex):
    signed = np.array([-8, 7, -1, 0], dtype=np.int8)
    back = np.asarray(ex.unpack_int4(ex.pack_int4(signed), signed=True))
    assert back.tolist() != [8, 7, 15, 0], (
        "unpack_int4(..., signed=True) gave the raw nibbles [8, 7, 15, 0]: sign-extend them, 8..15 -> -8..-1 "
        "(two's complement in 4 bits)"
    )
    assert back.tolist() == signed.tolist() and back.dtype == np.int8, (
        f"signed codes {signed.tolist()} packed and unpacked came back as {back.tolist()} ({back.dtype}); expected int8"
    )


DATA = {
    "normal": np.random.default_rng(1).standard_normal((16, 128)).astype(np.float32),
    "cubed": (np.random.default_rng(2).standard_normal((16, 128)) ** 3).astype(np.float32),
    "zeros": np.zeros((2, 64), np.float32),
    "one-sided": np.abs(np.random.default_rng(3).standard_normal((4, 64))).astype(np.float32),
}


def interleaved_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)


def swapped_nibbles(q: np.ndarray) -> np.ndarray:
    return (q[:, 16:] | (q[:, :16] << 4)).astype(np.uint8)


INTERLEAVED = "with elements 2i and 2i + 1 in byte i (pack_int4's order) instead of elements j and j + 16"
SWAPPED = "with the nibbles swapped (element j in the high nibble, j + 16 in the low)"
ZERO_BLOCK = ("with code 0 for a block of zeros: ggml takes 1 / d as 0 there, so trunc(0 + 8.5) gives code 8, "
              "bytes 0x88 (it dequantises to 0 * (8 - 8) = 0)")
NO_OFFSET = ("without the offset: where llama.cpp's code is 8..15 yours is 8 lower, so you computed "
             "trunc(x * (1 / d) + 0.5) and forgot the + 8 (trunc(x * (1 / d) + 8.5) maps -8d..7d to codes 0..15)")


def block_variants(kind: str, x: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``(description, bytes)``: the engine's quantiser (equal to llama.cpp's) with each known mistake."""
    ref = getattr(ggml_blocks, f"quantize_{kind}")
    out = [(INTERLEAVED, plant(ref, _pack_nibbles=interleaved_nibbles)(x)),
           (SWAPPED, plant(ref, _pack_nibbles=swapped_nibbles)(x))]
    if kind == "q4_0":
        out += [
            ("with m the largest value (max) instead of the value of largest magnitude, with its sign",
             plant(ref, ("np.abs(blocks).argmax(axis=1)", "blocks.argmax(axis=1)"))(x)),
            ("with d = max|x| / 8 (the magnitude without its sign, so d is never negative)",
             plant(ref, ("d = biggest / np.float32(-8)", "d = np.abs(biggest) / np.float32(8)"))(x)),
            ("rounding with np.rint(x / d) + 8 instead of trunc(x / d + 8.5)",
             plant(ref, ("np.trunc(blocks * _inverse(d) + np.float32(8.5))", "np.rint(blocks * _inverse(d)) + 8"))(x)),
            (ZERO_BLOCK, plant(ref, ("q = np.minimum(codes, 15)", "q = np.where(d == 0, 0, np.minimum(codes, 15))"))(x)),
        ]
    else:
        out += [
            ("with d = (max - min) / 16 instead of / 15 (15 steps between codes 0 and 15)",
             plant(ref, ("d = (hi - lo) / np.float32(15)", "d = (hi - lo) / np.float32(16)"))(x)),
            ("rounding with np.rint instead of trunc(... + 0.5)",
             plant(ref, ("np.trunc((blocks - lo) * _inverse(d) + np.float32(0.5))", "np.rint((blocks - lo) * _inverse(d))"))(x)),
        ]
    return out


def forgot_the_offset(ours: np.ndarray, theirs: np.ndarray) -> bool:
    """Q4_0 codes computed as trunc(x * (1 / d) + 0.5), without the + 8, under the right d's.

    Told by the low nibbles of elements 0..15 (whatever was done with the negative codes, the low nibble of
    byte j is element j's code's low four bits) where llama.cpp's code is 8..15, i.e. x * (1 / d) >= -0.5:
    there trunc(x * id + 0.5) is llama.cpp's code minus 8, except at the opposite extreme x = -m (code
    min(15, 16) = 15, yet 8 without the offset) and where float32 rounds the two sums across the edge of a
    code. So nearly everywhere, not everywhere: 90% of those nibbles are asked for."""
    a, b = ours.reshape(-1, 18), theirs.reshape(-1, 18)
    if not np.array_equal(a[:, :2], b[:, :2]):
        return False
    low_a, low_b = a[:, 2:] & 0x0F, b[:, 2:] & 0x0F
    upper = low_b >= 8
    return bool(upper.any()) and float(np.mean(low_a[upper] == low_b[upper] - 8)) > 0.9


def first_block_difference(ours: np.ndarray, theirs: np.ndarray, kind: str) -> str:
    """Where two byte arrays of blocks first differ, in the block's own fields."""
    size, header = (18, 2) if kind == "q4_0" else (20, 4)
    a, b = ours.reshape(-1, size), theirs.reshape(-1, size)
    block = int(np.flatnonzero((a != b).any(axis=1))[0])
    byte = int(np.flatnonzero(a[block] != b[block])[0])
    if byte < header:
        field = "d" if byte < 2 else "m"
        at = 0 if field == "d" else 2
        mine, want = (float(r[block, at : at + 2].view(np.float16)[0]) for r in (a, b))
        return f"block {block}: its fp16 {field} is {mine:.6g}, llama.cpp's {want:.6g}"
    j = byte - header
    return (f"block {block}: nibble byte {j} (elements {j} and {j + 16}) is 0x{a[block, byte]:02x}, "
            f"llama.cpp's 0x{b[block, byte]:02x}")


@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
@pytest.mark.parametrize("name", DATA)
def test_ex6_6_ggml_blocks_match_llamacpp(ex, kind, name):
    x = DATA[name]
    qtype = gguf.GGMLQuantizationType.Q4_0 if kind == "q4_0" else gguf.GGMLQuantizationType.Q4_1
    ours = np.asarray(getattr(ex, f"quantize_{kind}")(x))
    theirs = gguf.quants.quantize(x, qtype)
    assert ours.shape == theirs.shape, f"{kind}: {ours.shape} bytes, reference {theirs.shape}"
    if np.array_equal(ours, theirs):
        return
    for description, variant in block_variants(kind, x):
        if np.array_equal(ours, variant) and not np.array_equal(variant, theirs):
            pytest.fail(f"your {kind} bytes ({name}) equal llama.cpp's computed {description}", pytrace=False)
    if kind == "q4_0" and forgot_the_offset(ours, theirs):
        pytest.fail(f"your {kind} bytes ({name}) are llama.cpp's {NO_OFFSET}", pytrace=False)
    pytest.fail(f"your {kind} bytes ({name}) differ from llama.cpp's; first at {first_block_difference(ours, theirs, kind)}",
                pytrace=False)


def dequant_variants(kind: str, raw: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """``(description, values)``: the engine's dequantiser with each known mistake."""
    ref = getattr(dequant, f"dequantize_{kind}")

    def interleaved(qs):
        return np.stack([qs & 0x0F, qs >> 4], axis=-1).reshape(len(qs), 32)

    out = [("reading elements 2i and 2i + 1 from byte i (pack_int4's order) instead of elements j and j + 16",
            plant(ref, unpack_nibbles=interleaved)(raw))]
    if kind == "q4_0":
        out.append(("without the offset: d * q instead of d * (q - 8)", plant(ref, (" - np.int8(8)", ""))(raw)))
    else:
        out.append(("without m: d * q instead of d * q + m", plant(ref, (" + fp16_field(b, 2)", ""))(raw)))
    return out


@pytest.mark.parametrize("kind", ["q4_0", "q4_1"])
@pytest.mark.parametrize("name", DATA)
def test_ex6_6_dequantize_matches_llamacpp(ex, kind, name):
    qtype = gguf.GGMLQuantizationType.Q4_0 if kind == "q4_0" else gguf.GGMLQuantizationType.Q4_1
    raw = gguf.quants.quantize(DATA[name], qtype)
    back = getattr(ex, f"dequantize_{kind}")(raw)
    assert_matches(back, gguf.quants.dequantize(raw, qtype).reshape(-1), dequant_variants(kind, raw),
                   what=f"your dequantize_{kind} ({name})", axes=("element",), tol=0.0)
