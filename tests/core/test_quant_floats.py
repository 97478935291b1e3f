"""FP16 / BF16 / FP8 encode and decode, checked against references no one here wrote.

FP16 against NumPy's float16 (IEEE binary16, round-to-nearest-even); BF16 and
the two FP8 formats against ``ml_dtypes`` (``bfloat16``, ``float8_e4m3fn``,
``float8_e5m2``), whose casts are the non-saturating ones: overflow gives inf,
or NaN for E4M3, which has no inf.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from llmrs_core.quant.floats import (
    BF16,
    FORMATS,
    FP8_E4M3,
    FP8_E5M2,
    FP16,
    FloatFormat,
    decode,
    encode,
    float_format,
    round_trip,
)

NAMES = list(FORMATS)


def reference_dtype(name: str) -> np.dtype:
    if name == "fp16":
        return np.dtype(np.float16)
    ml_dtypes = pytest.importorskip("ml_dtypes")
    types = {
        "bf16": ml_dtypes.bfloat16,
        "fp8_e4m3": ml_dtypes.float8_e4m3fn,
        "fp8_e5m2": ml_dtypes.float8_e5m2,
    }
    return np.dtype(types[name])


def reference_encode(x: np.ndarray, fmt: FloatFormat) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf / NaN is the point
        return x.astype(reference_dtype(fmt.name)).view(fmt.storage_dtype)


def all_patterns(fmt: FloatFormat) -> np.ndarray:
    return np.arange(1 << fmt.bits, dtype=np.uint32).astype(fmt.storage_dtype)


def assert_same_bits(got: np.ndarray, want: np.ndarray, x: np.ndarray, fmt: FloatFormat) -> None:
    """Bit-exact, except that a NaN only has to come back as a NaN of the same sign
    (NumPy keeps part of a NaN's payload; we write the canonical quiet NaN)."""
    nan_in = np.isnan(x)
    bad = (got != want) & ~nan_in
    assert not bad.any(), (
        f"{fmt.name}: {bad.sum()} mismatches, e.g. x={x[bad][:4]} got={got[bad][:4]} want={want[bad][:4]}"
    )
    assert np.isnan(decode(got[nan_in], fmt)).all()
    sign_bit = 1 << (fmt.bits - 1)
    np.testing.assert_array_equal(got[nan_in] & sign_bit, want[nan_in] & sign_bit)


def interesting_float32(fmt: FloatFormat, seed: int) -> np.ndarray:
    """Random float32 that stress every rounding path of ``fmt``."""
    rng = np.random.default_rng(seed)
    n = 200_000
    every_bit_pattern = rng.integers(0, 1 << 32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    # log-uniform magnitudes from below the smallest subnormal to past the largest value
    lo, hi = np.log2(fmt.min_subnormal) - 3, np.log2(fmt.max_finite) + 2
    with np.errstate(over="ignore"):  # for BF16 the top of that range is past float32's: inf
        in_range = (rng.choice([-1.0, 1.0], n) * 2.0 ** rng.uniform(lo, hi, n)).astype(np.float32)
    # float32 subnormals matter for BF16, whose range reaches down into them
    f32_subnormal = rng.integers(0, 1 << 23, 10_000, dtype=np.uint32).view(np.float32)
    # exact ties between neighbouring values of fmt (round-to-nearest-even decides),
    # and one float32 step either side of each tie
    values = np.unique(decode(all_patterns(fmt), fmt).astype(np.float64))
    values = values[np.isfinite(values)]
    step = np.diff(values)
    ties = values[:-1] + step / 2
    ties = np.concatenate([ties, [values[-1] + step[-1] / 2]])  # the tie just above max_finite
    if ties.size > 50_000:
        ties = rng.choice(ties, 50_000, replace=False)
    ties32 = ties.astype(np.float32)
    assert np.array_equal(ties32.astype(np.float64), ties), "ties must be exact in float32"
    near_ties = np.concatenate(
        [ties32, np.nextafter(ties32, np.float32(np.inf)), np.nextafter(ties32, np.float32(-np.inf))]
    )
    m = fmt.min_subnormal
    edges = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e38, -3.4e38, fmt.min_normal, m, m / 2, m * 0.75]
    specials = np.array([*edges, fmt.max_finite, -fmt.max_finite], dtype=np.float32)
    return np.concatenate([every_bit_pattern, in_range, f32_subnormal, near_ties, -near_ties, specials])


def test_fp16_against_numpy_float16():
    x = interesting_float32(FP16, seed=1)
    assert_same_bits(encode(x, FP16), reference_encode(x, FP16), x, FP16)


def test_fp16_all_patterns_decode_and_re_encode():
    bits = all_patterns(FP16)
    values = decode(bits, FP16)
    np.testing.assert_array_equal(values, bits.view(np.float16).astype(np.float32))
    back = encode(values, FP16)
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(back[finite], bits[finite])
    assert np.isnan(decode(back[~finite], FP16)).all()


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "fp8_e5m2"])
def test_encode_against_ml_dtypes(name):
    fmt = FORMATS[name]
    x = interesting_float32(fmt, seed=2)
    assert_same_bits(encode(x, fmt), reference_encode(x, fmt), x, fmt)


@pytest.mark.parametrize("name", NAMES)
def test_decode_every_pattern_against_reference(name):
    fmt = FORMATS[name]
    bits = all_patterns(fmt)
    got = decode(bits, fmt)
    want = bits.view(reference_dtype(name)).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)  # NaN == NaN here
    # signs too, which assert_array_equal does not see for zeros
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


@pytest.mark.parametrize("name", ["bf16", "fp8_e4m3", "fp8_e5m2"])
def test_saturate_is_clip_then_convert(name):
    """Saturating conversion = clamp to +-max_finite (infinities included), then the
    ordinary conversion; NaN stays NaN."""
    fmt = FORMATS[name]
    x = interesting_float32(fmt, seed=3)
    clipped = np.clip(x, -fmt.max_finite, fmt.max_finite).astype(np.float32)
    assert_same_bits(encode(x, fmt, saturate=True), reference_encode(clipped, fmt), x, fmt)


def test_fp16_saturate_never_gives_inf():
    x = np.array([65504.0, 65519.0, 65520.0, 1e9, np.inf, -np.inf], dtype=np.float32)
    # 65520 is the tie between 65504 and the next step (65536 = inf): even is inf
    np.testing.assert_array_equal(
        decode(encode(x, FP16), FP16), [65504, 65504, np.inf, np.inf, np.inf, -np.inf]
    )
    np.testing.assert_array_equal(
        round_trip(x, FP16, saturate=True), [65504, 65504, 65504, 65504, 65504, -65504]
    )


def test_fp8_hand_checked_patterns():
    e4m3 = np.array([448.0, 464.0, 465.0, np.inf, -np.inf, np.nan, -0.0, 2.0**-9, 2.0**-10], dtype=np.float32)
    # 464 ties between 448 (S.1111.110, even) and the NaN slot: 448; above it overflows to NaN
    assert encode(e4m3, FP8_E4M3).tolist() == [0x7E, 0x7E, 0x7F, 0x7F, 0xFF, 0x7F, 0x80, 0x01, 0x00]
    saturated = encode(e4m3, FP8_E4M3, saturate=True)
    assert saturated.tolist() == [0x7E, 0x7E, 0x7E, 0x7E, 0xFE, 0x7F, 0x80, 0x01, 0x00]
    e5m2 = np.array([57344.0, 61440.0, np.inf, np.nan, 2.0**-16], dtype=np.float32)
    # 61440 ties between 57344 (mantissa 11, odd) and inf: even wins, so inf
    assert encode(e5m2, FP8_E5M2).tolist() == [0x7B, 0x7C, 0x7C, 0x7E, 0x01]
    assert encode(e5m2, FP8_E5M2, saturate=True).tolist() == [0x7B, 0x7B, 0x7B, 0x7E, 0x01]


def test_format_table_numbers():
    assert (FP16.max_finite, FP16.min_normal, FP16.min_subnormal) == (65504.0, 2.0**-14, 2.0**-24)
    bf16_max = (2 - 2**-7) * 2.0**127
    assert (BF16.max_finite, BF16.min_normal, BF16.min_subnormal) == (bf16_max, 2.0**-126, 2.0**-133)
    assert (FP8_E4M3.max_finite, FP8_E4M3.min_normal, FP8_E4M3.min_subnormal) == (448.0, 2.0**-6, 2.0**-9)
    assert (FP8_E5M2.max_finite, FP8_E5M2.min_normal, FP8_E5M2.min_subnormal) == (57344.0, 2.0**-14, 2.0**-16)
    assert [f.bits for f in (FP16, BF16, FP8_E4M3, FP8_E5M2)] == [16, 16, 8, 8]
    assert FP8_E4M3.bias == 7 and not FP8_E4M3.has_inf and FP8_E5M2.has_inf


@pytest.mark.parametrize("name", NAMES)
def test_format_table_matches_reference_finfo(name):
    fmt = FORMATS[name]
    ref = reference_dtype(name)
    if name == "fp16":
        info = np.finfo(ref)
    else:
        info = pytest.importorskip("ml_dtypes").finfo(ref)
    assert fmt.max_finite == float(info.max)
    assert fmt.min_normal == float(info.smallest_normal)
    assert fmt.min_subnormal == float(info.smallest_subnormal)
    assert fmt.epsilon == float(info.eps)


@pytest.mark.parametrize("name", NAMES)
def test_shapes_dtypes_and_signed_zero(name):
    fmt = FORMATS[name]
    x = np.array([[0.0, -0.0, 1.0], [-2.5, 0.5, -0.0]], dtype=np.float32)
    bits = encode(x, fmt)
    assert bits.shape == x.shape and bits.dtype == fmt.storage_dtype
    y = decode(bits, fmt)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(x))
    assert encode(np.float32(1.0), fmt).shape == ()


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    x=hnp.arrays(
        np.float32, st.integers(1, 64), elements=st.floats(width=32, allow_nan=False, allow_infinity=False)
    ),
)
def test_round_trip_is_the_nearest_value(name, x):
    """Within range, storing loses at most half a step: relative 2**-(M+1), or
    half the smallest subnormal near zero; storing twice changes nothing; and
    rounding keeps order."""
    fmt = FORMATS[name]
    x = x[np.abs(x) <= fmt.max_finite]
    y = round_trip(x, fmt)
    err = np.abs(y.astype(np.float64) - x.astype(np.float64))
    bound = np.maximum(np.abs(x.astype(np.float64)) * 2.0 ** -(fmt.mantissa_bits + 1), fmt.min_subnormal / 2)
    assert (err <= bound).all()
    np.testing.assert_array_equal(round_trip(y, fmt), y)
    order = np.argsort(x, kind="stable")
    assert (np.diff(y[order]) >= 0).all()


def test_float_format_generic_layout():
    # a made-up E3M2 with no inf: the computation is the same as for the real ones
    e3m2 = float_format("e3m2fn", 3, 2, has_inf=False)
    assert (e3m2.bias, e3m2.max_finite, e3m2.min_normal, e3m2.min_subnormal) == (3, 24.0, 0.25, 0.0625)
    assert e3m2.bits == 6 and e3m2.storage_dtype == np.uint8
    values = decode(np.arange(32, dtype=np.uint8), e3m2)  # the positive half: 0.000.00 .. 0.111.11
    assert np.isnan(values[31]) and values[30] == 24.0 and values[1] == 0.0625
    np.testing.assert_array_equal(encode(values[:31], e3m2), np.arange(31))
    assert encode(np.float32(-24.0), e3m2) == 0b1_111_10


def test_bad_input_is_rejected():
    with pytest.raises(ValueError, match="unknown float format 'fp7'"):
        encode(np.zeros(3, np.float32), "fp7")
    with pytest.raises(ValueError, match="floating-point input"):
        encode(np.arange(3), FP16)
    with pytest.raises(ValueError, match="out of range for 8-bit fp8_e4m3"):
        decode(np.array([0, 256]), FP8_E4M3)
    with pytest.raises(ValueError, match="integer bit patterns"):
        decode(np.array([1.0]), FP16)
    with pytest.raises(ValueError, match="at most 16 bits"):
        float_format("fp24", 8, 15)
    with pytest.raises(ValueError, match="exponent bits"):
        float_format("wide", 11, 4)
