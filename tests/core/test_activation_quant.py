"""ggml's activation quantisation (kernels/cpu/activations.py) against a NumPy model of ggml's x86 C.

The model below is written from ``quantize_row_q8_0``/``quantize_row_q8_1`` (ggml-cpu/arch/x86/
quants.c, AVX2 branch) and ``quantize_row_q8_K_ref`` (ggml-quants.c), in whole-array NumPy
float32 operations: scale, ``127 / max`` and the products are single IEEE roundings there as
here, ``_mm256_round_ps(_MM_ROUND_NEAREST)`` and ``nearest_int`` are NumPy's ``rint`` (halves to
even), and ``GGML_CPU_FP32_TO_FP16`` is NumPy's float16 cast (F16C, halves to even). The Numba
quantiser must give the same codes and the same scale bits.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrs_core.kernels.cpu import activations
from llmrs_core.quant.types import GGMLType

pytestmark = pytest.mark.core


def ggml_q8_0(x: np.ndarray, with_sum: bool):
    """``x [T, n]`` -> codes int8 ``[T, n]``, fp16 ``d`` and (``with_sum``) fp16 ``s`` ``[T, n / 32]`` as float32."""
    b = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv).astype(np.int32)
    d16 = d.astype(np.float16).astype(np.float32)[..., 0]
    s = (d[..., 0] * q.sum(-1).astype(np.float32)).astype(np.float16).astype(np.float32)
    return q.astype(np.int8).reshape(x.shape), d16, s if with_sum else d16 * q.sum(-1).astype(np.float32)


def ggml_q8_k(x: np.ndarray):
    """``x [T, n]`` -> codes int8 ``[T, n]`` and float32 ``d`` ``[T, n / 256]``."""
    b = x.reshape(x.shape[0], -1, 256)
    first = np.abs(b).argmax(-1)[..., None]  # argmax keeps the first of equal magnitudes, as ggml's `>`
    signed = np.take_along_axis(b, first, -1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = np.where(signed != 0, np.float32(-127) / signed, np.float32(0)).astype(np.float32)
        q = np.minimum(127, np.rint(b * iscale)).astype(np.int8)
        d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    return q.reshape(x.shape), d[..., 0]


def activations_like_llamas(rng: np.random.Generator, t_count: int, cols: int, scale: float) -> np.ndarray:
    x = (scale * rng.standard_normal((t_count, cols))).astype(np.float32)
    x[0, :32] = 0  # an all-zero block
    x[:, 7] *= 30  # an outlier channel, as real activations have
    if cols >= 64:  # values on halves of the step: ggml rounds them to even
        x[-1, 32:64] = np.arange(-16, 16, dtype=np.float32) * np.float32(0.5) * np.float32(127 / 8)
    return x


@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 3), st.sampled_from([1.0, 1e-3, 300.0, 1e-6]))
@settings(max_examples=40, deadline=None)
def test_q8_0_and_q8_1_are_ggmls(seed, t_count, superblocks, scale):
    x = activations_like_llamas(np.random.default_rng(seed), t_count, 256 * superblocks, scale)
    for scheme in ("q8_0", "q8_1"):
        xq, xd, xs = activations.quantize_activations(x, scheme, 32)
        q, d, s = ggml_q8_0(x, with_sum=scheme == "q8_1")
        np.testing.assert_array_equal(xq, q, f"{scheme}: codes differ from ggml's (127 / max, halves to even)")
        np.testing.assert_array_equal(xd, d, f"{scheme}: the scale is not ggml's fp16 max / 127")
        np.testing.assert_array_equal(xs, s, f"{scheme}: s differs from ggml's")
    xq16, xd16, xs16 = activations.quantize_activations(x, "q8_0", 16)  # Q8_0 in a 16-value layout
    np.testing.assert_array_equal(xq16, xq)
    np.testing.assert_array_equal(xd16, np.repeat(xd, 2, axis=1))
    sums = xq16.reshape(t_count, -1, 16).sum(-1, dtype=np.int32).astype(np.float32)
    np.testing.assert_array_equal(xs16, xd16 * sums)


@given(st.integers(0, 2**32 - 1), st.integers(1, 5), st.integers(1, 3), st.sampled_from([1.0, 1e-3, 300.0]),
       st.sampled_from([32, 16]), st.booleans())
@settings(max_examples=40, deadline=None)
def test_q8_k_is_ggmls(seed, t_count, superblocks, scale, block, tie):
    x = activations_like_llamas(np.random.default_rng(seed), t_count, 256 * superblocks, scale)
    if tie:  # +max and -max in one super-block: ggml keeps the first, and the codes' signs follow it
        x[:, 40], x[:, 3] = np.abs(x[:, 7]), -np.abs(x[:, 7])
    xq, xd, xs = activations.quantize_activations(x, "q8_k", block)
    q, d = ggml_q8_k(x)
    np.testing.assert_array_equal(xq, q, "codes differ from ggml's Q8_K (-127 / signed max, halves to even)")
    per = 256 // block
    np.testing.assert_array_equal(xd, np.repeat(d, per, axis=1), "the scale is not ggml's 1 / iscale")
    sums = q.reshape(t_count, -1, block).sum(-1, dtype=np.int32).astype(np.float32)
    np.testing.assert_array_equal(xs, xd * sums, "s must be d times the block's code sum")


def test_fp16_rounding_covers_subnormals_and_overflow():
    """The scale's fp16 rounding must be F16C's everywhere, including tiny and huge blocks."""
    values = np.array([1e-9, 3e-6, 6.1e-5, 65519, 65520, 7e4, 0.1, 1 / 3], np.float32)
    x = np.zeros((len(values), 32), np.float32)
    x[:, 0] = values * 127  # max / 127 = the value
    with np.errstate(over="ignore"):
        _, xd, _ = activations.quantize_activations(x, "q8_0")
        np.testing.assert_array_equal(xd[:, 0], (x[:, 0] / np.float32(127)).astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("scheme", ["q8_0", "q8_1", "q8_k"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_value_becomes_its_blocks_scale(scheme, bad):
    x = np.ones((2, 512), np.float32)
    x[0, 300] = bad
    xq, xd, _ = activations.quantize_activations(x, scheme)
    hit = 300 // 32
    group = range(8 * (hit // 8), 8 * (hit // 8) + 8) if scheme == "q8_k" else [hit]
    for b in range(16):
        assert np.isfinite(xd[0, b]) == (b not in group), f"{scheme}: block {b}"
    assert np.isfinite(xd[1]).all() and not xq[0, 32 * hit:32 * hit + 32].any()


def test_each_weight_type_names_llamas_vec_dot_type():
    assert activations.activation_scheme("Q4_K") == "q8_k" == activations.activation_scheme("Q6_K+Q4_K")
    assert activations.activation_scheme("IQ4_XS") == "q8_k" and activations.activation_scheme("IQ4_NL") == "q8_0"
    assert activations.activation_scheme("Q4_1") == "q8_1" and activations.activation_scheme("Q5_0") == "q8_0"
    assert activations.activation_scheme("Q4_K+Q4_0") is None, "one product quantises its input one way"
    assert activations.activation_scheme("F16") is None and activations.activation_scheme("nonsense") is None
    assert set(activations.ACTIVATION_SCHEME) <= set(GGMLType)


def test_bad_shapes_and_schemes_are_refused():
    with pytest.raises(ValueError, match="blocks of 256"):
        activations.quantize_activations(np.zeros((1, 96), np.float32), "q8_k")
    with pytest.raises(ValueError, match="unknown activation scheme"):
        activations.quantize_activations(np.zeros((1, 32), np.float32), "q4")
