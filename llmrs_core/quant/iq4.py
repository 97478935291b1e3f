"""IQ4_NL and IQ4_XS: 4-bit codes on a non-uniform grid (IQ4_XS files; IQ4_NL for narrow rows).

The 16 levels are not evenly spaced: ``IQ4_VALUES`` (ggml's
``kvalues_iq4nl``) = -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89
113, closer together near zero where most weights of a trained layer lie.
A weight is ``scale * IQ4_VALUES[code]``.

==========  =====================  ==========================================  ===========================
format      bytes                  layout (in order)                           weight
==========  =====================  ==========================================  ===========================
IQ4_NL      18 / 32 (4.5 bits)     d fp16; qs 16 (byte j: j low, j+16 high)    d * IQ4_VALUES[q]
IQ4_XS      136 / 256 (4.25 bits)  d; scales_h u16; scales_l 4; qs 8 x 16      (d*(s_j-32))*IQ4_VALUES[q]
==========  =====================  ==========================================  ===========================

IQ4_XS has 8 sub-blocks of 32 with 6-bit scales s_j. The bit packing and the
quantiser's search: chapter 6.3 ("IQ4_NL and IQ4_XS in full").

Invariant: quantisation is bit-exact with ggml's ``quantize_row_iq4_nl_impl``
as ``llama_model_quantize`` calls it without an importance matrix (``ntry = 7``,
what model files are made with; ``quantize_row_iq4_nl_ref``'s ``ntry = -1`` is
a different search), each level chosen by ``best_index_int8``.

API::

    quantize_iq4_nl(x)    float32 [..., n] (n % 32 == 0)  -> uint8 [..., n // 32 * 18]
    dequantize_iq4_nl(b)  in :mod:`.dequant` (the 32-weight formats live there)
    quantize_iq4_xs(x)    float32 [..., n] (n % 256 == 0) -> uint8 [..., n // 256 * 136]
    dequantize_iq4_xs(b)  uint8 (whole blocks) -> float32 [n_blocks * 256]
"""

from __future__ import annotations

import numpy as np

from .dequant import IQ4_VALUES, unpack_nibbles
from .kquants import (
    _GROUP_MAX_EPS,
    _fp16_bytes,
    _fp16_value,
    _nearest_int,
    _raw_blocks,
    _sum_in_order,
    _super_blocks,
)
from .types import QK_K, GGMLType, type_traits

IQ4_NL_BYTES = type_traits(GGMLType.IQ4_NL).type_size  # 18
IQ4_XS_BYTES = type_traits(GGMLType.IQ4_XS).type_size  # 136

_F32 = np.float32
_LEVELS = IQ4_VALUES.astype(_F32)
NTRY = 7  # the search width llama_model_quantize uses


def best_index(v: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8(16, kvalues_iq4nl, v)``: the index of the nearest level (float32 compare).

    Below the first level 0, above the last 15; between two levels the lower
    one only if strictly nearer.
    """
    v = v.astype(_F32, copy=False)
    mu = np.clip(np.searchsorted(_LEVELS, v, side="right"), 1, 15)  # first level > v
    lower = np.where(v - _LEVELS[mu - 1] < _LEVELS[mu] - v, mu - 1, mu)
    return np.where(v <= _LEVELS[0], 0, np.where(v >= _LEVELS[15], 15, lower))


def _fit_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per 32-weight block (columns of ``x`` float32 ``[32, cols]``): ``(scale [cols], codes [32, cols],
    zero [cols])``, the scale fitted as in ``quantize_row_iq4_nl_impl``; ``zero``: max |x| < 1e-15
    (scale 0; ggml leaves its codes unset, and every caller re-picks them)."""
    cols = np.arange(x.shape[1])
    peak = x[np.abs(x).argmax(axis=0), cols]
    zero = np.abs(peak) < _GROUP_MAX_EPS
    w = x * x

    def sums(inv: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        codes = best_index(inv * x)
        v = _LEVELS[codes]
        wv = w * v
        return codes, _sum_in_order(wv * x), _sum_in_order(wv * v)

    with np.errstate(divide="ignore", invalid="ignore"):
        d = -peak / _F32(IQ4_VALUES[0])  # ntry > 0: the peak maps to +127's side
        codes, sumqx, sumq2 = sums(_F32(1) / d)
        d = np.where(sumq2 > 0, sumqx / sumq2, _F32(0))
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            _, sqx, sq2 = sums(_F32(itry + int(IQ4_VALUES[0])) / peak)
            better = (sq2 > 0) & (sqx * sqx > best * sq2)
            d = np.where(better, sqx / sq2, d)
            best = np.where(better, d * sqx, best)
    return np.where(zero, _F32(0), d).astype(_F32), codes, zero


def _pack(codes: np.ndarray) -> np.ndarray:
    """Codes ``[n, 32]`` -> ``[n, 16]`` bytes: weight j low nibble, weight j + 16 high."""
    return (codes[:, :16] | (codes[:, 16:] << 4)).astype(np.uint8)


def _inverse(d: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.where(d != 0, _F32(1) / d, _F32(0)).astype(_F32)


def quantize_iq4_nl(x: np.ndarray) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 32) -> uint8 ``[..., n // 32 * 18]`` IQ4_NL blocks.

    Bit-exact with ggml's ``quantize_iq4_nl`` without an importance matrix.
    """
    xin = np.asarray(x, dtype=_F32)
    if xin.ndim == 0 or xin.shape[-1] % 32:
        raise ValueError(f"IQ4_NL packs rows in blocks of 32 values; got shape {xin.shape}")
    blocks = np.ascontiguousarray(xin).reshape(-1, 32)
    scale, _, _ = _fit_blocks(np.ascontiguousarray(blocks.T))
    codes = best_index(_inverse(scale)[:, None] * blocks)
    out = np.concatenate([_fp16_bytes(scale), _pack(codes)], axis=1)
    return out.reshape(*xin.shape[:-1], xin.shape[-1] // 32 * IQ4_NL_BYTES)


def quantize_iq4_xs(x: np.ndarray) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 256) -> uint8 ``[..., n // 256 * 136]`` IQ4_XS blocks.

    Bit-exact with ggml's ``quantize_iq4_xs`` without an importance matrix.
    """
    xin = np.asarray(x)
    blocks = _super_blocks(xin, "IQ4_XS")
    nb = blocks.shape[0]
    sub = blocks.reshape(nb * 8, 32)
    scale, _, _ = _fit_blocks(np.ascontiguousarray(sub.T))
    scale = scale.reshape(nb, 8)
    peak = scale[np.arange(nb), np.abs(scale).argmax(axis=1)]  # first largest |scale|, signed
    d = -peak / _F32(32)  # -0.0 for an all-zero super-block, as in ggml
    ls = np.clip(_nearest_int(_inverse(d)[:, None] * scale), -32, 31)
    dl = d[:, None] * ls.astype(_F32)  # the unrounded d, as ggml re-picks the codes
    codes = best_index(_inverse(dl).reshape(-1, 1) * sub)  # [nb*8, 32]
    s6 = (ls + 32).astype(np.uint16)

    out = np.empty((nb, IQ4_XS_BYTES), dtype=np.uint8)
    out[:, 0:2] = _fp16_bytes(d)
    scales_h = ((s6 >> 4) << (2 * np.arange(8, dtype=np.uint16))).sum(axis=1, dtype=np.uint16)
    out[:, 2:4] = scales_h.astype("<u2").view(np.uint8).reshape(nb, 2)
    low = (s6 & 0x0F).astype(np.uint8)
    out[:, 4:8] = low[:, 0::2] | (low[:, 1::2] << 4)
    out[:, 8:] = _pack(codes).reshape(nb, 128)
    return out.reshape(*xin.shape[:-1], xin.shape[-1] // QK_K * IQ4_XS_BYTES)


def iq4_xs_symmetric(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IQ4_XS bytes as 32-weight sub-blocks ``w = d * v``: the levels int8 ``[n_sub, 32]`` and
    ``d = d_super * (s - 32)`` float32 ``[n_sub]``: Q8_0's kernel form holds it exactly."""
    b = _raw_blocks(raw, IQ4_XS_BYTES, "IQ4_XS")
    nb = b.shape[0]
    scales_h = np.ascontiguousarray(b[:, 2:4]).view("<u2")  # [nb, 1]
    high = (scales_h >> (2 * np.arange(8, dtype=np.uint16))) & 3  # [nb, 8]
    sl = b[:, 4:8]
    low = np.stack([sl & 0x0F, sl >> 4], axis=2).reshape(nb, 8)
    s6 = (low | (high << 4)).astype(np.int32)
    d_sub = _fp16_value(b[:, 0:2])[:, None] * (s6 - 32).astype(_F32)
    v = IQ4_VALUES[unpack_nibbles(b[:, 8:].reshape(nb * 8, 16))]
    return v, d_sub.reshape(-1)


def dequantize_iq4_xs(raw: np.ndarray) -> np.ndarray:
    """IQ4_XS bytes (any shape, whole 136-byte blocks) -> float32 ``[n_blocks * 256]`` (``dequantize_row_iq4_xs``)."""
    v, d_sub = iq4_xs_symmetric(raw)
    return (d_sub[:, None] * v.astype(_F32)).reshape(-1)


__all__ = ["best_index", "dequantize_iq4_xs", "iq4_xs_symmetric", "quantize_iq4_nl", "quantize_iq4_xs"]
