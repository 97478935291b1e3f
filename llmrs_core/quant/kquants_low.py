"""The low-bit K-quants Q2_K and Q3_K: quantise and dequantise (Q2_K and Q3_K_M files).

Both split a 256-weight super-block into 16 sub-blocks of 16 weights, each
with a 4- or 6-bit scale under one fp16 super-scale (see :mod:`.kquants`
for Q4_K/Q6_K, which these follow).

==========  ====================  ======================================  =========================
format      bytes / 256 weights   layout (in order)                       weight
==========  ====================  ======================================  =========================
Q2_K        84 (2.625 bits)       scales 16 (4+4 bits); qs 64; d; dmin    (d*sc_j)*q - dmin*m_j, q<4
Q3_K        110 (3.4375 bits)     hmask 32; qs 64; scales 12; d           (d*(s_j-32))*(q-4), q<8
==========  ====================  ======================================  =========================

The bit packing and the quantisers (``make_qkx2_quants``, ``make_q3_quants``):
chapter 6.3 ("The low-bit K-quants Q2_K and Q3_K in full").

Invariant: quantisation is bit-exact with ``quantize_row_q2_K_ref`` and
``quantize_row_q3_K_ref`` (what ``llama_model_quantize`` runs without an
importance matrix): the same float32 operations in the same order, as
:mod:`.kquants` explains.

API::

    quantize_q2_k(x)    float32 [..., n] -> uint8 [..., n // 256 * 84]
    dequantize_q2_k(b)  uint8 (whole blocks) -> float32 [n_blocks * 256]
    quantize_q3_k(x)    float32 [..., n] -> uint8 [..., n // 256 * 110]
    dequantize_q3_k(b)  uint8 (whole blocks) -> float32 [n_blocks * 256]
"""

from __future__ import annotations

import numpy as np

from .kquants import (
    _GROUP_MAX_EPS,
    _fit_min_scale,
    _fp16_bytes,
    _fp16_value,
    _nearest_int,
    _raw_blocks,
    _sum_in_order,
    _super_blocks,
)
from .types import QK_K, GGMLType, type_traits

Q2_K_BYTES = type_traits(GGMLType.Q2_K).type_size  # 84
Q3_K_BYTES = type_traits(GGMLType.Q3_K).type_size  # 110

_F32 = np.float32


def _pack_2bit(q: np.ndarray) -> np.ndarray:
    """Codes ``[nb, 256]`` in 0..3 -> ``[nb, 64]``: weight 128h + 32k + l at bits 2k of byte 32h + l."""
    nb = q.shape[0]
    parts = q.reshape(nb, 2, 4, 32).astype(np.uint8)
    packed = parts[:, :, 0] | (parts[:, :, 1] << 2) | (parts[:, :, 2] << 4) | (parts[:, :, 3] << 6)
    return packed.reshape(nb, 64)


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """``[nb, 64]`` packed bytes -> codes uint8 ``[nb, 256]`` in 0..3 (inverse of :func:`_pack_2bit`)."""
    nb = qs.shape[0]
    shifts = (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]
    return ((qs.reshape(nb, 2, 1, 32) >> shifts) & 3).reshape(nb, 256)


# -- Q2_K ---------------------------------------------------------------------


def quantize_q2_k(x: np.ndarray) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 256) -> uint8 ``[..., n // 256 * 84]`` Q2_K blocks.

    Bit-exact with ggml's ``quantize_row_q2_K_ref``.
    """
    xin = np.asarray(x)
    blocks = _super_blocks(xin, "Q2_K")
    nb = blocks.shape[0]
    xs = np.ascontiguousarray(blocks.reshape(nb * 16, 16).T)  # [16, nb*16]: a column per sub-block
    scale, neg_min, q = _fit_min_scale(xs, np.abs(xs), nmax=3, rmin=-0.5, rdelta=0.1, nstep=15, use_mad=True)
    scale = scale.reshape(nb, 16)
    neg_min = neg_min.reshape(nb, 16)

    max_scale = np.maximum(scale.max(axis=1), _F32(0))[:, None]  # ggml starts both maxima at 0
    max_min = np.maximum(neg_min.max(axis=1), _F32(0))[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        l_sc = _nearest_int((_F32(15) / max_scale) * scale)
        l_mn = _nearest_int((_F32(15) / max_min) * neg_min)
    # the ints are stored in a uint8 as they are: no clamp in ggml
    sc_byte = np.where(max_scale > 0, l_sc & 0xFF, 0)
    sc_byte = np.where(max_min > 0, sc_byte | ((l_mn << 4) & 0xFF), sc_byte).astype(np.uint8)
    d = np.where(max_scale[:, 0] > 0, max_scale[:, 0] / _F32(15), _F32(0)).astype("<f2")
    dmin = np.where(max_min[:, 0] > 0, max_min[:, 0] / _F32(15), _F32(0)).astype("<f2")

    # Recompute the codes with the scales as they will be decoded.
    d_sub = d.astype(_F32)[:, None] * (sc_byte & 0x0F).astype(_F32)
    m_sub = dmin.astype(_F32)[:, None] * (sc_byte >> 4).astype(_F32)
    xb = blocks.reshape(nb, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q_new = np.clip(_nearest_int((xb + m_sub[..., None]) / d_sub[..., None]), 0, 3)
    q = q.T.reshape(nb, 16, 16)
    q = np.where(d_sub[..., None] != 0, q_new, q)  # scale 0: keep the fit's codes, as ggml does

    out = np.empty((nb, Q2_K_BYTES), dtype=np.uint8)
    out[:, 0:16] = sc_byte
    out[:, 16:80] = _pack_2bit(q.reshape(nb, 256))
    out[:, 80:82] = _fp16_bytes(d)
    out[:, 82:84] = _fp16_bytes(dmin)
    return out.reshape(*xin.shape[:-1], xin.shape[-1] // QK_K * Q2_K_BYTES)


def dequantize_q2_k(raw: np.ndarray) -> np.ndarray:
    """Q2_K bytes (any shape, a whole number of 84-byte blocks) -> float32 ``[n_blocks * 256]``.

    Bit-exact with ggml's ``dequantize_row_q2_K``.
    """
    q, d_sub, m_sub = q2_k_affine(raw)
    return (d_sub[:, None] * q.astype(_F32) + m_sub[:, None]).reshape(-1)


def q2_k_affine(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q2_K bytes as 16-weight sub-blocks ``w = d * q + m``: codes uint8 ``[n_sub, 16]`` in 0..3,
    ``d = d_super * (sc & 15)`` and ``m = -dmin * (sc >> 4)`` float32 ``[n_sub]``."""
    b = _raw_blocks(raw, Q2_K_BYTES, "Q2_K")
    nb = b.shape[0]
    sc = b[:, 0:16]
    d_sub = _fp16_value(b[:, 80:82])[:, None] * (sc & 0x0F).astype(_F32)  # [nb, 16]
    m_sub = _fp16_value(b[:, 82:84])[:, None] * (sc >> 4).astype(_F32)
    q = _unpack_2bit(b[:, 16:80]).reshape(nb * 16, 16).astype(np.uint8)
    return q, d_sub.reshape(-1), -m_sub.reshape(-1)


# -- Q3_K ---------------------------------------------------------------------


def _fit_q3(x: np.ndarray, nmax: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """ggml's ``make_q3_quants(16, 4, x, L, true)`` per column of ``x`` float32 ``[16, cols]``.

    Returns ``(scale [cols], codes [16, cols] int32 in 0..2 nmax - 1)``; an
    all-zero column gets scale 0 and codes 0.
    """
    cols = np.arange(x.shape[1])
    peak = x[np.abs(x).argmax(axis=0), cols]
    zero = np.abs(peak) < _GROUP_MAX_EPS
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _F32(-nmax) / peak
        lv = np.clip(_nearest_int(iscale * x), -nmax, nmax - 1)  # [16, cols]
        lf = lv.astype(_F32)
        sumlx = _sum_in_order(wx * lf)
        suml2 = _sum_in_order(w * lf * lf)
        active = ~zero
        for _ in range(5):
            changed = np.zeros(x.shape[1], dtype=bool)
            for i in range(x.shape[0]):  # one code at a time: each move changes the sums the next sees
                li = lv[i].astype(_F32)
                slx = sumlx - wx[i] * li
                sl2 = suml2 - w[i] * li * li
                new = np.clip(_nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1)
                nf = new.astype(_F32)
                slx_new = slx + wx[i] * nf
                sl2_new = sl2 + w[i] * nf * nf
                accept = (active & (slx > 0) & (new != lv[i]) & (sl2_new > 0)
                          & (slx_new * slx_new * suml2 > sumlx * sumlx * sl2_new))
                lv[i] = np.where(accept, new, lv[i])
                sumlx = np.where(accept, slx_new, sumlx)
                suml2 = np.where(accept, sl2_new, suml2)
                changed |= accept
            active &= changed  # ggml stops a sub-block's sweeps once one changes nothing
            if not active.any():
                break
        scale = np.where(suml2 > 0, sumlx / suml2, _F32(0))
    scale = np.where(zero, _F32(0), scale).astype(_F32)
    codes = np.where(zero, 0, lv + nmax)
    return scale, codes


def quantize_q3_k(x: np.ndarray) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 256) -> uint8 ``[..., n // 256 * 110]`` Q3_K blocks.

    Bit-exact with ggml's ``quantize_row_q3_K_ref``.
    """
    xin = np.asarray(x)
    blocks = _super_blocks(xin, "Q3_K")
    nb = blocks.shape[0]
    xs = np.ascontiguousarray(blocks.reshape(nb * 16, 16).T)
    scale, q = _fit_q3(xs)
    scale = scale.reshape(nb, 16)

    # the scale of largest magnitude, signed, first on ties; 0 if every scale is 0
    peak = scale[np.arange(nb), np.abs(scale).argmax(axis=1)][:, None]
    has = peak[:, 0] != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _F32(-32) / peak
        # int8_t l = nearest_int(...): in range here since |scale| <= |peak|
        lq = np.clip(_nearest_int(iscale * scale).astype(np.int8), -32, 31).astype(np.int32) + 32
        d = np.where(has, _F32(1) / iscale[:, 0], _F32(0)).astype("<f2")
    s6 = np.where(has[:, None], lq, 0).astype(np.uint8)  # [nb, 16] 6-bit scales (all 0 without a peak)

    # Recompute the codes with the scales as they will be decoded.
    d_sub = d.astype(_F32)[:, None] * (s6.astype(np.int32) - 32).astype(_F32)
    xb = blocks.reshape(nb, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        q_new = np.clip(_nearest_int(xb / d_sub[..., None]), -4, 3) + 4
    q = q.T.reshape(nb, 16, 16)
    q = np.where(d_sub[..., None] != 0, q_new, q).reshape(nb, 256).astype(np.uint8)

    out = np.empty((nb, Q3_K_BYTES), dtype=np.uint8)
    high = (q >> 2).reshape(nb, 8, 32)  # bit k of hmask[l]: weight 32k + l
    out[:, 0:32] = (high << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1, dtype=np.uint8)
    out[:, 32:96] = _pack_2bit(q & 3)
    lo4, hi2 = s6 & 0x0F, s6 >> 4
    out[:, 96:104] = lo4[:, :8] | (lo4[:, 8:] << 4)
    out[:, 104:108] = (hi2.reshape(nb, 4, 4) << (2 * np.arange(4, dtype=np.uint8))[None, :, None]).sum(
        axis=1, dtype=np.uint8)
    out[:, 108:110] = _fp16_bytes(d)
    return out.reshape(*xin.shape[:-1], xin.shape[-1] // QK_K * Q3_K_BYTES)


def q3_k_symmetric(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q3_K bytes as 16-weight sub-blocks ``w = d * q``: codes int8 ``[n_sub, 16]`` (``q - 4``, in
    -4..3) and ``d = d_super * (s - 32)`` float32 ``[n_sub]``: Q6_K's kernel form holds it exactly."""
    q, d, sc = q3_k_parts(raw)
    return q, (d[:, None] * sc.astype(_F32)).reshape(-1)


def q3_k_parts(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q3_K bytes as stored: codes int8 ``[n_sub, 16]`` (``q - 4``), ``d`` float32 ``[n_super]`` and the
    sub-blocks' scales ``s - 32`` int8 ``[n_super, 16]`` (``w = d (s - 32) q``)."""
    b = _raw_blocks(raw, Q3_K_BYTES, "Q3_K")
    nb = b.shape[0]
    low = _unpack_2bit(b[:, 32:96])
    high = ((b[:, None, 0:32] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).reshape(nb, 256)
    q = (low | (high << 2)).astype(np.int8) - np.int8(4)
    sb = b[:, 96:108]
    lo4 = np.concatenate([sb[:, :8] & 0x0F, sb[:, :8] >> 4], axis=1)  # [nb, 16]
    hi2 = (sb[:, None, 8:12] >> (2 * np.arange(4, dtype=np.uint8))[None, :, None]) & 3  # [nb, 4 (j//4), 4 (j%4)]
    s6 = lo4 | (hi2.reshape(nb, 16) << 4)
    return q.reshape(nb * 16, 16), _fp16_value(b[:, 108:110]), (s6.astype(np.int16) - 32).astype(np.int8)


def dequantize_q3_k(raw: np.ndarray) -> np.ndarray:
    """Q3_K bytes (any shape, a whole number of 110-byte blocks) -> float32 ``[n_blocks * 256]``.

    Bit-exact with ggml's ``dequantize_row_q3_K``.
    """
    q, d_sub = q3_k_symmetric(raw)
    return (d_sub[:, None] * q.astype(_F32)).reshape(-1)


__all__ = ["dequantize_q2_k", "dequantize_q3_k", "q3_k_symmetric", "quantize_q2_k", "quantize_q3_k"]
