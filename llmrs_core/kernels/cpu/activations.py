"""ggml's activation quantisation on x86: what the int8 products multiply the weights by (chapter 8).

llama.cpp never multiplies quantised weights by float activations on the CPU. Each weight type
names a ``vec_dot_type``, and the activations are rounded to it first:

* **Q8_0** (Q4_0, Q5_0, Q8_0, IQ4_NL), per 32 values: ``d = max|x| / 127`` stored as fp16,
  codes ``rint(x * (127 / max|x|))`` (round half to even: ``_mm256_round_ps``);
* **Q8_1** (Q4_1, Q5_1): the same codes and ``d``, and ``s = fp16(d * sum(codes))`` with the
  float32 ``d`` before its fp16 rounding;
* **Q8_K** (Q2_K to Q6_K, IQ4_XS), per 256 values: ``max`` is the first value of largest
  magnitude, *with its sign*; ``iscale = -127 / max``, codes ``min(127, rint(iscale * x))`` and
  ``d = 1 / iscale`` in float32 (``quantize_row_q8_K_ref``, which x86 runs; the AVX2 4-row
  variant llama.cpp uses for prompts gives the same products).

Rounding the activations exactly as llama.cpp does is what makes the engine's int8 products
agree with llama.cpp's to float32 rounding instead of to the 8-bit step (about 1/254 of a block's
largest value), and so its greedy tokens too.

The kernels (``int8``) read every scheme in one layout, per block of the *weight's* scale
(``block``: 32, or 16 for Q6_K and Q3_K): ``xq`` int8 ``[T, cols]``, ``xd`` float32
``[T, cols / block]`` (a Q8_K super-block's ``d`` repeated for its blocks) and ``xs`` float32
``[T, cols / block]``, ``xd`` times the block's code sum, which the affine Q4 form's offset term
multiplies (for Q8_1, ggml's fp16 ``s``).

A block holding a NaN or an infinity takes it as its scale (and zero codes), so that damaged
weights upstream show in the products instead of being rounded into finite codes.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ...quant.types import GGMLType

#: the activation quantisation (``vec_dot_type``) llama.cpp's CPU backend uses for each weight type
ACTIVATION_SCHEME: dict[GGMLType, str] = {
    GGMLType.Q4_0: "q8_0", GGMLType.Q5_0: "q8_0", GGMLType.Q8_0: "q8_0", GGMLType.IQ4_NL: "q8_0",
    GGMLType.Q4_1: "q8_1", GGMLType.Q5_1: "q8_1",
    GGMLType.Q2_K: "q8_k", GGMLType.Q3_K: "q8_k", GGMLType.Q4_K: "q8_k", GGMLType.Q5_K: "q8_k",
    GGMLType.Q6_K: "q8_k", GGMLType.IQ4_XS: "q8_k",
}
#: values per activation scale of each scheme
SCHEME_BLOCK = {"q8_0": 32, "q8_1": 32, "q8_k": 256}
#: each scheme as the compiled kernels take it
SCHEME_CODE = {"q8_0": 0, "q8_1": 1, "q8_k": 2}


def activation_scheme(source: str) -> str | None:
    """The scheme of a matrix whose ``source`` names its GGML type (``"Q4_K"``, or ``"Q4_K+Q4_K"`` for a
    fused one), or None when it has none or its parts' schemes differ."""
    schemes = set()
    for name in source.split("+"):
        try:
            schemes.add(ACTIVATION_SCHEME.get(GGMLType[name]))
        except KeyError:
            return None
    return schemes.pop() if len(schemes) == 1 else None


_INF_BITS = np.uint32(0x7F800000)


@njit(cache=True)
def _fp16(v):
    """float32 ``v`` rounded to the nearest fp16 value (halves to even, as F16C's ``vcvtps2ph``),
    returned as float32. Subnormal halves keep a step of 2^-24; beyond 65504 is infinity."""
    if not abs(v) < np.inf:
        return v
    _, e = math.frexp(float(v))
    step = 2.0 ** max(e - 11, -24)  # 11 significant bits; the subnormal range's fixed step
    r = np.rint(float(v) / step) * step  # powers of two: exact scalings
    if abs(r) > 65504.0:
        return np.float32(np.inf) if r > 0 else np.float32(-np.inf)
    return np.float32(r)


@njit(cache=True)
def _top_bits(bits, t, start, stop):
    """The largest ``|x|`` of ``x[t, start:stop]`` as float32 bits (sign cleared). Non-finite values'
    bit patterns lie above every finite one, so a NaN or infinity wins."""
    top = np.uint32(0)
    for j in range(start, stop):
        v = bits[t, j] & np.uint32(0x7FFFFFFF)
        top = v if v > top else top
    return top


@njit(cache=True)
def _non_finite(top, t, start, stop, block, xq, xd, xs):
    """A range holding a NaN or an infinity: zero codes, that value as every block's scale."""
    word = np.empty(1, np.uint32)
    word[0] = top
    bad = word.view(np.float32)[0]
    for j in range(start, stop):
        xq[t, j] = 0
    for b in range(start // block, stop // block):
        xd[t, b] = bad
        xs[t, b] = bad


@njit(cache=True)
def _q8_0_row(x, bits, t, with_sum, block, xq, xd, xs):
    """Row ``t`` as Q8_0 (``with_sum``: Q8_1) per 32 values; ``block`` (32 or 16) is the layout's."""
    word = np.empty(1, np.uint32)
    as_float = word.view(np.float32)
    per = 32 // block
    for b in range(x.shape[1] // 32):
        top = _top_bits(bits, t, 32 * b, 32 * b + 32)
        if top >= _INF_BITS:
            _non_finite(top, t, 32 * b, 32 * b + 32, block, xq, xd, xs)
            continue
        word[0] = top
        amax = as_float[0]
        d = amax / np.float32(127)
        inv = np.float32(127) / amax if amax != 0 else np.float32(0)
        total = 0
        for j in range(32 * b, 32 * b + 32):
            q = np.int32(np.rint(x[t, j] * inv))
            xq[t, j] = q
            total += q
        d16 = _fp16(d)
        s = _fp16(d * np.float32(total)) if with_sum else d16 * np.float32(total)
        for k in range(per):  # a layout of 16-value blocks: split the sum between the halves
            xd[t, b * per + k] = d16
            if per == 1:
                xs[t, b] = s
            else:
                part = 0
                for j in range(32 * b + block * k, 32 * b + block * (k + 1)):
                    part += xq[t, j]
                xs[t, b * per + k] = d16 * np.float32(part)


@njit(cache=True)
def _q8_k_row(x, bits, t, block, xq, xd, xs):
    """Row ``t`` as Q8_K per 256 values (``quantize_row_q8_K_ref``), in blocks of ``block``."""
    for sb in range(x.shape[1] // 256):
        start = 256 * sb
        top = _top_bits(bits, t, start, start + 256)
        if top >= _INF_BITS:
            _non_finite(top, t, start, start + 256, block, xq, xd, xs)
            continue
        amax = np.float32(0)
        signed_max = np.float32(0)
        for j in range(start, start + 256):
            a = abs(x[t, j])
            if a > amax:  # the first of the largest magnitude, as ggml's loop keeps it
                amax = a
                signed_max = x[t, j]
        if amax == 0:
            for j in range(start, start + 256):
                xq[t, j] = 0
            for b in range(start // block, (start + 256) // block):
                xd[t, b] = 0
                xs[t, b] = 0
            continue
        iscale = np.float32(-127) / signed_max
        d = np.float32(1) / iscale
        for b in range(start // block, (start + 256) // block):
            total = 0
            for j in range(block * b, block * (b + 1)):
                q = min(127, np.int32(np.rint(iscale * x[t, j])))
                xq[t, j] = q
                total += q
            xd[t, b] = d
            xs[t, b] = d * np.float32(total)


@njit(cache=True)
def _quantize_row(x, t, scheme, block, xq, xd, xs):
    bits = x.view(np.uint32)
    if scheme == 2:
        _q8_k_row(x, bits, t, block, xq, xd, xs)
    else:
        _q8_0_row(x, bits, t, scheme == 1, block, xq, xd, xs)


@njit(cache=True)
def _quantize_serial(x, scheme, block, xq, xd, xs):
    for t in range(x.shape[0]):
        _quantize_row(x, t, scheme, block, xq, xd, xs)


@njit(parallel=True, cache=True)
def _quantize_parallel(x, scheme, block, xq, xd, xs):
    for t in prange(x.shape[0]):
        _quantize_row(x, t, scheme, block, xq, xd, xs)


#: from this many rows on, the activations are quantised on Numba's threads (a row each);
#: fewer cost less than waking the pool
PARALLEL_QUANTIZE_ROWS = 4


def quantize_activations(x: np.ndarray, scheme: str, block: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``x [T, cols]`` float32 (C-contiguous) -> ``(xq int8 [T, cols], xd [T, cols / block],
    xs [T, cols / block])`` by ``scheme`` (``"q8_0"``, ``"q8_1"``, ``"q8_k"``), laid out per ``block``
    (32 or 16) values. ``cols`` must be a multiple of the scheme's block (32 or 256).

    Compiled without ``fastmath``: every division, product and rounding is IEEE float32, as in
    ggml's C.
    """
    if scheme not in SCHEME_CODE:
        raise ValueError(f"unknown activation scheme {scheme!r}; known: {sorted(SCHEME_CODE)}")
    t_count, cols = x.shape
    if cols % SCHEME_BLOCK[scheme] or SCHEME_BLOCK[scheme] % block:
        raise ValueError(f"{scheme} quantises rows in blocks of {SCHEME_BLOCK[scheme]}; got {cols} columns "
                         f"laid out in blocks of {block}")
    return quantized(x, SCHEME_CODE[scheme], block)


@njit(cache=True)
def quantized(x, scheme, block):
    """:func:`quantize_activations` for compiled callers, without its checks: ``scheme`` is the
    scheme's :data:`SCHEME_CODE`, ``x`` C-contiguous float32 ``[T, cols]``."""
    t_count, cols = x.shape
    xq = np.empty((t_count, cols), np.int8)
    xd = np.empty((t_count, cols // block), np.float32)
    xs = np.empty((t_count, cols // block), np.float32)
    if t_count >= PARALLEL_QUANTIZE_ROWS:
        _quantize_parallel(x, scheme, block, xq, xd, xs)
    else:
        _quantize_serial(x, scheme, block, xq, xd, xs)
    return xq, xd, xs


__all__ = ["ACTIVATION_SCHEME", "SCHEME_BLOCK", "SCHEME_CODE", "activation_scheme", "quantize_activations", "quantized"]
