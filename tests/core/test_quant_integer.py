"""INT8 / INT4 quantisation: hand-computed cases, error bounds, and the granularity story."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from llmrs_core.quant.integer import (
    QuantizedTensor,
    max_abs_error,
    pack_int4,
    quantization_error,
    quantize,
    rmse,
    sqnr_db,
    unpack_int4,
)

SCHEMES = [
    dict(bits=bits, symmetric=sym, granularity=gran, group_size=32 if gran == "group" else None)
    for bits in (8, 4)
    for sym in (True, False)
    for gran in ("tensor", "channel", "group")
]


def scheme_id(s: dict) -> str:
    return f"int{s['bits']}-{'sym' if s['symmetric'] else 'asym'}-{s['granularity']}"


def per_element_scale(q: QuantizedTensor) -> np.ndarray:
    """Each value's scale, broadcast to the codes' shape."""
    s = q.scheme
    if s.granularity == "tensor":
        return np.broadcast_to(q.scales, q.shape)
    if s.granularity == "channel":
        return np.broadcast_to(q.scales.reshape(-1, *[1] * (len(q.shape) - 1)), q.shape)
    return np.repeat(q.scales, s.group_size, axis=-1)


def test_symmetric_int8_per_tensor_by_hand():
    x = np.array([31.75, -31.75, 1.0, 0.125, 0.375, -0.6, 10.0], dtype=np.float32)
    q = quantize(x, bits=8)
    # max |x| = 31.75 and symmetric int8 uses codes -127..127, so
    # scale = 31.75 / 127 = 0.25 exactly.
    assert q.scales.shape == () and q.scales == np.float32(0.25) and q.zero_points is None
    # code = round(x / 0.25): 127, -127, 4; 0.125/0.25 = 0.5 and 0.375/0.25 = 1.5 are
    # ties, and round-half-to-even sends them to 0 and 2; -0.6/0.25 = -2.4 -> -2; 10/0.25 = 40
    assert q.codes.dtype == np.int8
    assert q.codes.tolist() == [127, -127, 4, 0, 2, -2, 40]
    np.testing.assert_array_equal(q.dequantize(), [31.75, -31.75, 1.0, 0.0, 0.5, -0.5, 10.0])
    # the worst error is the tie 0.125 -> 0: exactly half a step
    assert max_abs_error(x, q) == 0.125


def test_asymmetric_int4_by_hand():
    x = np.array([-2.0, 5.5, 1.0, 0.0], dtype=np.float32)
    q = quantize(x, bits=4, symmetric=False)
    # range [-2, 5.5] spans 7.5 and asymmetric int4 has codes 0..15: scale = 7.5 / 15 = 0.5;
    # zero point = 0 - (-2) / 0.5 = 4, so code = x / 0.5 + 4
    assert q.scales == np.float32(0.5) and q.zero_points == 4
    assert q.codes.dtype == np.uint8 and q.codes.tolist() == [0, 15, 6, 4]
    np.testing.assert_array_equal(q.dequantize(), x)  # all on the grid: exact


def test_code_ranges_and_shapes():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(6, 64)).astype(np.float32)
    for s, (lo, hi) in zip(SCHEMES, [(-127, 127)] * 3 + [(-128, 127)] * 3 + [(-7, 7)] * 3 + [(0, 15)] * 3):
        q = quantize(w, **s)
        assert q.codes.shape == w.shape
        assert q.codes.min() == lo or q.codes.max() == hi, scheme_id(s)  # the extreme value hits an end
        assert lo <= q.codes.min() and q.codes.max() <= hi, scheme_id(s)
        want_scales = {"tensor": (), "channel": (6,), "group": (6, 2)}[s["granularity"]]
        assert q.scales.shape == want_scales and q.scales.dtype == np.float32
        assert (q.zero_points is None) == s["symmetric"]
        out = q.dequantize()
        assert out.shape == w.shape and out.dtype == np.float32


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
@settings(max_examples=40, deadline=None)
@given(
    x=hnp.arrays(
        np.float32,
        st.tuples(st.integers(1, 4), st.sampled_from([32, 64])),
        elements=st.floats(-1e4, 1e4, width=32),
    )
)
def test_error_is_at_most_half_a_step(scheme, x):
    q = quantize(x, **scheme)
    err = np.abs(q.dequantize().astype(np.float64) - x.astype(np.float64))
    step = per_element_scale(q).astype(np.float64)
    # half a step, plus float32 rounding in scale * code
    assert (err <= step / 2 * (1 + 1e-5) + 1e-6 * np.abs(x) + 1e-44).all()
    assert not np.isnan(q.dequantize()).any()


def outlier_weights() -> np.ndarray:
    """Weights like a real layer (std 0.02) with a few large outliers, as LLMs have."""
    rng = np.random.default_rng(1234)
    w = rng.normal(0.0, 0.02, size=(64, 256)).astype(np.float32)
    w[3, 17], w[40, 200], w[41, 5] = 2.0, -1.5, 0.9
    return w


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("symmetric", [True, False])
def test_finer_granularity_contains_outliers(bits, symmetric):
    w = outlier_weights()
    err = {
        gran: rmse(w, quantize(w, bits=bits, symmetric=symmetric, granularity=gran, group_size=gs))
        for gran, gs in [("tensor", None), ("channel", None), ("group", 32)]
    }
    # per tensor, the outlier sets everyone's step; per channel, only its row's;
    # per group, only its 32 neighbours'
    assert err["group"] < err["channel"] < err["tensor"]
    assert err["group"] < 0.5 * err["tensor"]


def test_asymmetric_wins_on_one_sided_data():
    rng = np.random.default_rng(7)
    x = np.maximum(rng.normal(size=(32, 128)), 0).astype(np.float32)  # post-ReLU: nothing below 0
    for bits in (8, 4):
        sym = quantize(x, bits=bits, symmetric=True)
        asym = quantize(x, bits=bits, symmetric=False)
        # symmetric wastes its negative codes: asymmetric has about twice the resolution
        assert rmse(x, asym) < 0.6 * rmse(x, sym)
        assert asym.zero_points == asym.scheme.qmin  # 0.0 sits at the bottom code


def test_about_six_db_per_bit():
    """For uniform data on [-1, 1] the noise of a step s is s^2 / 12, so SQNR grows by
    20 log10(s4 / s8) = 20 log10(127 / 7) ~ 25.2 dB from int4 to int8."""
    x = np.random.default_rng(3).uniform(-1, 1, size=200_000).astype(np.float32)
    x[0] = 1.0  # pin max |x| so both scales are exactly 1/qmax
    gain = sqnr_db(x, quantize(x, bits=8)) - sqnr_db(x, quantize(x, bits=4))
    assert abs(gain - 20 * math.log10(127 / 7)) < 0.3


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
def test_all_zero_input_gives_zeros_without_nan(scheme):
    x = np.zeros((4, 64), dtype=np.float32)
    with np.errstate(all="raise"):  # no 0/0 anywhere
        q = quantize(x, **scheme)
        out = q.dequantize()
    np.testing.assert_array_equal(out, x)
    assert (q.scales == 0).all()
    e = quantization_error(x, q)
    assert e.max_abs == 0.0 and e.rmse == 0.0 and e.sqnr_db == math.inf


@pytest.mark.parametrize("scheme", SCHEMES, ids=scheme_id)
def test_zero_and_constant_groups_mixed_with_ordinary_ones(scheme):
    x = np.random.default_rng(5).normal(size=(4, 64)).astype(np.float32)
    x[1] = 0.0  # a whole row of zeros: its channel and groups have scale 0
    x[2] = -3.0  # a constant row
    out = quantize(x, **scheme).dequantize()
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[1], 0.0)
    if scheme["granularity"] != "tensor":
        # the constant is the block's extreme, so it lands on an end code exactly (up to float rounding)
        np.testing.assert_allclose(out[2], -3.0, rtol=1e-6)


def test_quantization_error_by_hand():
    x = np.array([1.0, -1.0, 1.0, -1.0])
    x_hat = np.array([1.1, -1.0, 1.0, -1.0])
    e = quantization_error(x, x_hat)
    # noise power 0.01 over 4 values: RMSE sqrt(0.01 / 4) = 0.05; SQNR = 10 log10(4 / 0.01) = 26.02 dB
    assert e.max_abs == pytest.approx(0.1) and e.rmse == pytest.approx(0.05)
    assert e.sqnr_db == pytest.approx(10 * math.log10(400))
    with pytest.raises(ValueError, match="shapes differ"):
        quantization_error(x, x_hat[:3])


def test_pack_order_and_ggml_note():
    # element 2i in the low nibble, 2i+1 in the high nibble: [1, 2] -> 0x21
    assert pack_int4(np.array([1, 2], dtype=np.uint8)).tolist() == [0x21]
    # signed codes are two's complement nibbles: -1 = 0xF, -8 = 0x8
    assert pack_int4(np.array([-1, -8, 7, 0], dtype=np.int8)).tolist() == [0x8F, 0x07]
    assert unpack_int4(np.array([0x8F, 0x07], dtype=np.uint8), signed=True).tolist() == [-1, -8, 7, 0]
    assert unpack_int4(np.array([0x8F], dtype=np.uint8), signed=False).tolist() == [15, 8]


@settings(max_examples=50, deadline=None)
@given(
    signed=st.booleans(),
    shape=st.tuples(st.integers(0, 3), st.integers(1, 8).map(lambda n: 2 * n)),
    data=st.data(),
)
def test_pack_unpack_round_trip(signed, shape, data):
    dtype, lo, hi = (np.int8, -8, 7) if signed else (np.uint8, 0, 15)
    codes = data.draw(hnp.arrays(dtype, shape, elements=st.integers(lo, hi)))
    packed = pack_int4(codes)
    assert packed.dtype == np.uint8 and packed.shape == (*shape[:-1], shape[-1] // 2)
    back = unpack_int4(packed, signed=signed)
    assert back.dtype == dtype
    np.testing.assert_array_equal(back, codes)


def test_packed_int4_quantised_weights_round_trip():
    w = outlier_weights()
    for symmetric in (True, False):
        q = quantize(w, bits=4, symmetric=symmetric, granularity="group", group_size=32)
        np.testing.assert_array_equal(unpack_int4(pack_int4(q.codes), signed=symmetric), q.codes)
        # 4 bits per weight plus one float32 scale (and a zero point) per 32
        assert q.nbytes == w.size // 2 + (w.size // 32) * (4 if symmetric else 5)


def test_bad_input_raises_clear_errors():
    w = np.ones((4, 32), dtype=np.float32)
    with pytest.raises(ValueError, match="group_size 5 does not divide the last axis"):
        quantize(w, granularity="group", group_size=5)
    with pytest.raises(ValueError, match="positive integer group_size"):
        quantize(w, granularity="group")
    with pytest.raises(ValueError, match="only for granularity 'group'"):
        quantize(w, granularity="channel", group_size=32)
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        quantize(w, bits=3)
    with pytest.raises(ValueError, match="granularity must be"):
        quantize(w, granularity="row")
    with pytest.raises(ValueError, match=r"per-channel .* \[out, in\]"):
        quantize(np.ones(8), granularity="channel")
    for bad in (np.nan, np.inf, -np.inf):
        x = w.copy()
        x[2, 7] = bad
        with pytest.raises(ValueError, match="non-finite values: 1 of them, first at flat index 71"):
            quantize(x)
    with pytest.raises(ValueError, match=r"beyond \+-1e\+38"):
        quantize(np.array([3e38, 1.0], dtype=np.float32))
    with pytest.raises(ValueError, match="empty"):
        quantize(np.zeros((0, 4)))
    with pytest.raises(ValueError, match=r"must lie in \[-8, 7\]"):
        pack_int4(np.array([8, 0], dtype=np.int8))
    with pytest.raises(ValueError, match="even-length last axis"):
        pack_int4(np.zeros(3, dtype=np.uint8))
    with pytest.raises(ValueError, match="uint8"):
        unpack_int4(np.zeros(2, dtype=np.int8), signed=True)
