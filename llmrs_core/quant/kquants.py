"""The K-quant block formats Q4_K, Q5_K and Q6_K: quantise and dequantise (chapter 6).

Why: Q4_1 pays 5 bits per weight for its fp16 scale and minimum per 32. A
super-block of 256 keeps fine scales (per 32 or 16 weights) that are small
integers times one fp16 super-scale: local scales at 6 or 8 bits each.

==========  ====================  ====================================  =======================
format      bytes / 256 weights   layout (byte offsets)                 weight
==========  ====================  ====================================  =======================
Q4_K        144 (4.5 bits)        d, dmin fp16; scales 12; qs 128       (d*sc_j)*q - dmin*m_j
Q5_K        176 (5.5 bits)        Q4_K's, with qh 32 before qs          same, q in 0..31
Q6_K        210 (6.5625 bits)     ql 128; qh 64; scales int8 x16; d     (d*sc_j)*(q - 32)
==========  ====================  ====================================  =======================

Q4_K/Q5_K: 8 sub-blocks of 32 (6-bit sc_j, m_j); Q6_K: 16 of 16 (int8 sc_j). The
bit packing and the quantisers' search: chapter 6.3 ("The K-quant layouts...").

Invariant: bit-exact with ggml's ``quantize_row_q4_K_ref``/``..._q6_K_ref`` (C's float32
order, sums left to right, ggml's ``nearest_int``); dequantise as ``gguf.quants`` does.

API::

    quantize_q4_k(x)    float32 [..., n] -> uint8 [..., n // 256 * 144]
    dequantize_q4_k(b)  uint8 (whole blocks) -> float32 [n_blocks * 256]
    quantize_q5_k(x)    float32 [..., n] -> uint8 [..., n // 256 * 176]
    dequantize_q5_k(b)  uint8 (whole blocks) -> float32 [n_blocks * 256]
    quantize_q6_k(x)    float32 [..., n] -> uint8 [..., n // 256 * 210]
    dequantize_q6_k(b)  uint8 (whole blocks) -> float32 [n_blocks * 256]
"""

from __future__ import annotations

import numpy as np

from .types import QK_K, GGMLType, type_traits

Q4_K_BYTES = type_traits(GGMLType.Q4_K).type_size  # 144
Q5_K_BYTES = type_traits(GGMLType.Q5_K).type_size  # 176
Q6_K_BYTES = type_traits(GGMLType.Q6_K).type_size  # 210

_F32 = np.float32
_ROUND_MAGIC = _F32(12582912.0)  # 1.5 * 2**23, see _nearest_int
_GROUP_MAX_EPS = _F32(1e-15)  # below this largest |x|, ggml treats a sub-block as all zero


# -- helpers ------------------------------------------------------------------


def _nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: float32 -> int32, rounding half to even.

    Adding 1.5 * 2**23 leaves a float whose unit in the last place is 1, so
    the addition itself rounds ``v`` to an integer, which then sits in the
    low mantissa bits. Done on the bits exactly as ggml does, so that even
    out-of-range values (possible mid-search) give ggml's answer.
    """
    bits = (v.astype(_F32, copy=False) + _ROUND_MAGIC).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def _sum_in_order(a: np.ndarray) -> np.ndarray:
    """``[n, rows]`` -> ``[rows]``: each column summed first to last in float32.

    The C reference accumulates ``s += a[i]`` one element at a time; float
    addition is not associative, so pairwise summation (``np.sum`` along a
    contiguous axis) may differ in the last bit. Looping over the 16 or 32
    positions of a sub-block, each step vectorised over every sub-block,
    keeps ggml's order and stays fast.
    """
    acc = a[0].copy()
    for row in a[1:]:
        acc += row
    return acc


def _super_blocks(x: np.ndarray, name: str) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 256) -> ``[n_blocks, 256]``."""
    x = np.asarray(x, dtype=_F32)
    if x.ndim == 0 or x.shape[-1] % QK_K:
        got = "a scalar" if x.ndim == 0 else f"shape {x.shape}"
        raise ValueError(
            f"{name} packs rows in super-blocks of {QK_K} values, so the last axis must be a "
            f"multiple of {QK_K}; got {got}"
        )
    return np.ascontiguousarray(x).reshape(-1, QK_K)


def _raw_blocks(raw: np.ndarray, block_bytes: int, name: str) -> np.ndarray:
    """Raw bytes (any shape) -> uint8 ``[n_blocks, block_bytes]``."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if raw.size % block_bytes:
        raise ValueError(
            f"{raw.size} bytes is not a whole number of {name} super-blocks ({block_bytes} bytes each)"
        )
    return raw.reshape(-1, block_bytes)


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    """Values ``[n]`` -> ``[n, 2]`` little-endian fp16 bytes (rounded to nearest even, as ggml does)."""
    return v.astype("<f2").view(np.uint8).reshape(-1, 2)


def _fp16_value(b: np.ndarray) -> np.ndarray:
    """``[n, 2]`` fp16 bytes -> float32 ``[n]``."""
    return np.ascontiguousarray(b).view("<f2").reshape(-1).astype(_F32)


# -- Q4_K ---------------------------------------------------------------------


def _fit_min_scale(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int,
                   use_mad: bool = False):
    """Weighted least-squares grid ``x ~ scale * q + min`` per column (ggml's ``make_qkx2_quants``).

    Candidates are ranked by the weighted squared error, or with ``use_mad``
    (Q2_K) by the weighted absolute error; the fit itself is least squares.

    ``x``, ``w``: float32 ``[n, rows]`` (one sub-block per column, ``w`` the
    importance of each value). Returns ``(scale [rows], neg_min [rows],
    q [n, rows] uint8 in 0..nmax)``; ``neg_min = -min >= 0``.
    """
    lo = x.min(axis=0)
    lo = np.where(lo > 0, _F32(0), lo)  # the grid always reaches 0, so the min is never positive
    hi = x.max(axis=0)
    flat = hi == lo  # all values equal and <= 0 (e.g. all zero): codes 0, scale 0, min = that value
    lo_start = lo

    sum_w = _sum_in_order(w)
    sum_x = _sum_in_order(w * x)

    # The C code divides by zero or overflows on degenerate columns and later
    # ignores the result; NumPy would warn about the same harmless values.
    with np.errstate(all="ignore"):
        iscale = _F32(nmax) / (hi - lo)
        scale = _F32(1) / iscale
        q = np.clip(_nearest_int(iscale * (x - lo)), 0, nmax)
        diff = scale * q.astype(_F32) + lo - x
        best_err = _sum_in_order(w * (np.abs(diff) if use_mad else diff * diff))

        for step in range(nstep + 1):
            # Stretch the grid a little (rmin + rdelta*step extra levels) and refit.
            # ``lo`` is the best min found so far: ggml moves the grid with it.
            stretch = _F32(rmin) + _F32(rdelta) * _F32(step) + _F32(nmax)
            iscale = stretch / (hi - lo)
            q_try = np.clip(_nearest_int(iscale * (x - lo)), 0, nmax)
            qf = q_try.astype(_F32)
            wq = w * qf
            sum_q = _sum_in_order(wq)
            sum_q2 = _sum_in_order(wq * qf)
            sum_xq = _sum_in_order(wq * x)
            # normal equations of min_{s,m} sum w (s*q + m - x)^2
            det = sum_w * sum_q2 - sum_q * sum_q
            s_try = (sum_w * sum_xq - sum_x * sum_q) / det
            m_try = (sum_q2 * sum_x - sum_q * sum_xq) / det
            pos = m_try > 0  # a positive min is not allowed: refit the scale alone with min 0
            m_try = np.where(pos, _F32(0), m_try)
            s_try = np.where(pos, sum_xq / sum_q2, s_try)
            diff = s_try * qf + m_try - x
            err = _sum_in_order(w * (np.abs(diff) if use_mad else diff * diff))

            better = (det > 0) & (err < best_err)
            q = np.where(better, q_try, q)
            best_err = np.where(better, err, best_err)
            scale = np.where(better, s_try, scale)
            lo = np.where(better, m_try, lo)

    # ggml returns before the search for a flat column; the search ran on it anyway, so undo it
    scale = np.where(flat, _F32(0), scale)
    lo = np.where(flat, lo_start, lo)
    q = np.where(flat, 0, q)
    return scale, -lo, q.astype(np.uint8)


def _quantize_k_min(blocks: np.ndarray, nmax: int, rmin: float, nstep: int):
    """The scale-and-min search shared by Q4_K (nmax 15) and Q5_K (nmax 31).

    ``blocks``: float32 ``[nb, 256]``. Each 32-weight sub-block is fitted by
    :func:`_fit_min_scale` (weights ``rms + |x|``, stretches ``rmin + 0.1 k``,
    k = 0..nstep); the 8 scales and 8 mins become 6-bit codes against the
    largest of each, and the codes are recomputed with the rounded scales.
    Returns ``(d, dmin)`` fp16 ``[nb]``, ``(sc, mn)`` uint8 ``[nb, 8]`` and
    the codes uint8 ``[nb, 8, 32]`` in 0..nmax, as ``quantize_row_q{4,5}_K_ref``.
    """
    nb = blocks.shape[0]
    # position-major: [32, nb*8], one column per 32-weight sub-block
    xs = np.ascontiguousarray(blocks.reshape(nb * 8, 32).T)

    # importance of each value: the sub-block's rms plus its own magnitude
    rms = np.sqrt(_sum_in_order(xs * xs) / _F32(32))
    w = rms + np.abs(xs)
    scale, neg_min, q = _fit_min_scale(xs, w, nmax=nmax, rmin=rmin, rdelta=0.1, nstep=nstep)
    scale = scale.reshape(nb, 8)
    neg_min = neg_min.reshape(nb, 8)

    # Quantise the 8 scales and 8 mins to 6 bits against the largest of each.
    max_scale = np.where(scale > 0, scale, _F32(0)).max(axis=1, keepdims=True)
    max_min = np.where(neg_min > 0, neg_min, _F32(0)).max(axis=1, keepdims=True)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, _F32(63) / max_scale, _F32(0))
        inv_min = np.where(max_min > 0, _F32(63) / max_min, _F32(0))
    # ggml stores the int in a uint8 before clamping to 63, so a negative one wraps modulo 256
    sc = np.minimum((_nearest_int(inv_scale * scale) & 0xFF).astype(np.uint8), 63)
    mn = np.minimum((_nearest_int(inv_min * neg_min) & 0xFF).astype(np.uint8), 63)
    d = (max_scale[:, 0] / _F32(63)).astype("<f2")
    dmin = (max_min[:, 0] / _F32(63)).astype("<f2")

    # Recompute the codes with the scales as they will be decoded.
    d_sub = d.astype(_F32)[:, None] * sc.astype(_F32)  # [nb, 8]
    m_sub = dmin.astype(_F32)[:, None] * mn.astype(_F32)
    xb = blocks.reshape(nb, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q_new = np.clip(_nearest_int((xb + m_sub[..., None]) / d_sub[..., None]), 0, nmax)
    q = q.T.reshape(nb, 8, 32)
    # a sub-block whose scale rounded to 0 keeps the codes of its own fit, as in ggml
    q = np.where(d_sub[..., None] != 0, q_new, q).astype(np.uint8)
    return d, dmin, sc, mn, q


def _pack_k_scales(out: np.ndarray, d, dmin, sc: np.ndarray, mn: np.ndarray) -> None:
    """Write ``d``, ``dmin`` and the 12 bytes of 6-bit scales/mins (bytes 0..15 of Q4_K and Q5_K)."""
    out[:, 0:2] = _fp16_bytes(d)
    out[:, 2:4] = _fp16_bytes(dmin)
    out[:, 4:8] = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    out[:, 8:12] = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    out[:, 12:16] = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)


def quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 256) -> uint8 ``[..., n // 256 * 144]`` Q4_K blocks.

    Bit-exact with ggml's ``quantize_row_q4_K_ref``. Raises ``ValueError``
    if the last axis is not a whole number of super-blocks.
    """
    xin = np.asarray(x)
    blocks = _super_blocks(xin, "Q4_K")
    nb = blocks.shape[0]
    d, dmin, sc, mn, q = _quantize_k_min(blocks, nmax=15, rmin=-1.0, nstep=20)
    out = np.empty((nb, Q4_K_BYTES), dtype=np.uint8)
    _pack_k_scales(out, d, dmin, sc, mn)
    pairs = q.reshape(nb, 4, 2, 32)  # chunk c: sub-blocks 2c (low nibble) and 2c+1 (high)
    out[:, 16:] = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).reshape(nb, 128)
    return out.reshape(*xin.shape[:-1], xin.shape[-1] // QK_K * Q4_K_BYTES)


def quantize_q5_k(x: np.ndarray) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 256) -> uint8 ``[..., n // 256 * 176]`` Q5_K blocks.

    Bit-exact with ggml's ``quantize_row_q5_K_ref``: Q4_K's search with 32
    levels (stretches -0.5 + 0.1 k, k = 0..15). Layout in the module docstring.
    """
    xin = np.asarray(x)
    blocks = _super_blocks(xin, "Q5_K")
    nb = blocks.shape[0]
    d, dmin, sc, mn, q = _quantize_k_min(blocks, nmax=31, rmin=-0.5, nstep=15)
    out = np.empty((nb, Q5_K_BYTES), dtype=np.uint8)
    _pack_k_scales(out, d, dmin, sc, mn)
    pairs = q.reshape(nb, 4, 2, 32)  # chunk c: sub-blocks 2c and 2c+1
    high = pairs >> 4  # [nb, 4, 2, 32]: the fifth bits
    shifts = (2 * np.arange(4, dtype=np.uint8)[:, None] + np.arange(2, dtype=np.uint8)[None, :])[None, :, :, None]
    out[:, 16:48] = (high << shifts).sum(axis=(1, 2), dtype=np.uint8)  # bit 2c + k: sub-block 2c + k
    low = pairs & 0x0F
    out[:, 48:] = (low[:, :, 0] | (low[:, :, 1] << 4)).reshape(nb, 128)
    return out.reshape(*xin.shape[:-1], xin.shape[-1] // QK_K * Q5_K_BYTES)


def _q4_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[nb, 12]`` packed bytes -> 6-bit scales and mins, each uint8 ``[nb, 8]``."""
    lo_sc, lo_m, rest = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = np.concatenate([lo_sc & 0x3F, (rest & 0x0F) | ((lo_sc >> 6) << 4)], axis=1)
    mn = np.concatenate([lo_m & 0x3F, (rest >> 4) | ((lo_m >> 6) << 4)], axis=1)
    return sc, mn


def dequantize_q4_k(raw: np.ndarray) -> np.ndarray:
    """Q4_K bytes (any shape, a whole number of 144-byte blocks) -> float32 ``[n_blocks * 256]``.

    Bit-exact with ggml's ``dequantize_row_q4_K`` and ``gguf.quants.dequantize``.
    """
    q, d_sub, m_sub = q4_k_affine(raw)
    return (d_sub[:, None] * q.astype(_F32) + m_sub[:, None]).reshape(-1)


def q4_k_affine(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K bytes as 32-weight sub-blocks ``w = d * q + m``: codes uint8 ``[n_sub, 32]``, ``d``, ``m`` ``[n_sub]``.

    ``d = d_super * sc`` and ``m = -dmin * min``, float32 (exact: 11 by 6 significant bits). The
    Numba kernels (chapter 8) read Q4_K through this form, the same one as Q4_1's.
    """
    q, d, dmin, sc, mn = q4_k_parts(raw)
    return q, (d[:, None] * sc.astype(_F32)).reshape(-1), (-dmin[:, None] * mn.astype(_F32)).reshape(-1)


def q4_k_parts(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Q4_K bytes as stored: codes uint8 ``[n_sub, 32]``, ``d`` and ``dmin`` float32 ``[n_super]``, the
    sub-blocks' 6-bit ``sc`` and ``mn`` uint8 ``[n_super, 8]`` (``w = d sc q - dmin mn``)."""
    b = _raw_blocks(raw, Q4_K_BYTES, "Q4_K")
    nb = b.shape[0]
    sc, mn = _q4_k_scales(b[:, 4:16])
    qs = b[:, 16:].reshape(nb, 4, 1, 32)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(nb * 8, 32)
    return q, _fp16_value(b[:, 0:2]), _fp16_value(b[:, 2:4]), sc, mn


def dequantize_q5_k(raw: np.ndarray) -> np.ndarray:
    """Q5_K bytes (any shape, a whole number of 176-byte blocks) -> float32 ``[n_blocks * 256]``.

    Bit-exact with ggml's ``dequantize_row_q5_K`` and ``gguf.quants.dequantize``.
    """
    q, d_sub, m_sub = q5_k_affine(raw)
    return (d_sub[:, None] * q.astype(_F32) + m_sub[:, None]).reshape(-1)


def q5_k_affine(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q5_K bytes as 32-weight sub-blocks ``w = d * q + m``: codes uint8 ``[n_sub, 32]`` in 0..31,
    ``d = d_super * sc`` and ``m = -dmin * min`` float32 ``[n_sub]`` (as :func:`q4_k_affine`)."""
    b = _raw_blocks(raw, Q5_K_BYTES, "Q5_K")
    nb = b.shape[0]
    sc, mn = _q4_k_scales(b[:, 4:16])
    d_sub = _fp16_value(b[:, 0:2])[:, None] * sc.astype(_F32)  # [nb, 8]
    m_sub = _fp16_value(b[:, 2:4])[:, None] * mn.astype(_F32)
    qs = b[:, 48:].reshape(nb, 4, 1, 32)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(nb, 8, 32)
    bit = ((b[:, None, 16:48] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1)  # [nb, 8, 32]
    return (low | (bit << 4)).reshape(nb * 8, 32), d_sub.reshape(-1), -m_sub.reshape(-1)


# -- Q6_K ---------------------------------------------------------------------


def _fit_symmetric(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric grid ``x ~ scale * q`` per column, q in ``-nmax..nmax-1`` (ggml's ``make_qx_quants``).

    ``x``: float32 ``[n, rows]``, fitted with weights ``x**2``. Returns
    ``(scale [rows], q [n, rows] int16 in 0..2*nmax-1)``, the codes offset by
    ``nmax``; an all-zero column gets scale 0 and codes 0.
    """
    rows = np.arange(x.shape[1])
    peak = x[np.abs(x).argmax(axis=0), rows]  # signed value of the largest |x| (first, as in ggml)
    zero = np.abs(peak) < _GROUP_MAX_EPS
    w = x * x
    wx = w * x

    def fit(stretch: np.float32):
        # the grid maps the peak to -stretch (so -nmax is the level it lands on)
        iscale = -stretch / peak
        q = np.clip(_nearest_int(iscale * x), -nmax, nmax - 1)
        qf = q.astype(_F32)
        return q, _sum_in_order(wx * qf), _sum_in_order(w * qf * qf)

    # all-zero columns divide by zero here; they are overwritten at the end
    with np.errstate(divide="ignore", invalid="ignore"):
        q, sum_xq, sum_q2 = fit(_F32(nmax))
        scale = np.where(sum_q2 != 0, sum_xq / sum_q2, _F32(0))
        best = scale * sum_xq
        for step in range(-9, 10):
            if step == 0:
                continue
            q_try, sxq, sq2 = fit(_F32(nmax) + _F32(0.1) * _F32(step))
            # sxq^2 / sq2 is the error reduction of the fitted scale: keep the largest
            better = (sq2 > 0) & (sxq * sxq > best * sq2)
            q = np.where(better, q_try, q)
            scale = np.where(better, sxq / sq2, scale)
            best = np.where(better, scale * sxq, best)

    scale = np.where(zero, _F32(0), scale)
    q = np.where(zero, 0, q + nmax)
    return scale, q.astype(np.int16)


def quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """float32 ``[..., n]`` (n a multiple of 256) -> uint8 ``[..., n // 256 * 210]`` Q6_K blocks.

    Bit-exact with ggml's ``quantize_row_q6_K_ref``. Raises ``ValueError``
    if the last axis is not a whole number of super-blocks.
    """
    xin = np.asarray(x)
    blocks = _super_blocks(xin, "Q6_K")
    nb = blocks.shape[0]
    xs = np.ascontiguousarray(blocks.reshape(nb * 16, 16).T)  # [16, nb*16]: a column per sub-block
    scale, q = _fit_symmetric(xs, nmax=32)
    scale = scale.reshape(nb, 16)

    # the scale of largest magnitude, signed, first one on ties (as in ggml)
    peak = scale[np.arange(nb), np.abs(scale).argmax(axis=1)][:, None]
    empty = np.abs(peak[:, 0]) < _GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = _F32(-128) / peak  # maps the peak scale to -128
        d = (_F32(1) / iscale[:, 0]).astype("<f2")
        sc = (np.minimum(_nearest_int(iscale * scale), 127) & 0xFF).astype(np.uint8).view(np.int8)

        # Recompute the codes with the scales as they will be decoded.
        d_sub = d.astype(_F32)[:, None] * sc.astype(_F32)  # [nb, 16]
        q_new = np.clip(_nearest_int(blocks.reshape(nb, 16, 16) / d_sub[..., None]), -32, 31) + 32
    q = q.T.reshape(nb, 16, 16)
    q = np.where(d_sub[..., None] != 0, q_new, q).astype(np.uint8)  # scale 0: keep the fit's codes

    out = np.empty((nb, Q6_K_BYTES), dtype=np.uint8)
    quarters = q.reshape(nb, 2, 4, 32)  # half h, quarter k, position l: code 128h + 32k + l
    lo, hi = quarters & 0x0F, quarters >> 4
    ql = np.concatenate([lo[:, :, 0] | (lo[:, :, 2] << 4), lo[:, :, 1] | (lo[:, :, 3] << 4)], axis=2)
    qh = hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = sc.view(np.uint8)
    out[:, 208:210] = _fp16_bytes(d)
    out[empty] = 0  # ggml zeroes a block whose every sub-block is (nearly) zero
    return out.reshape(*xin.shape[:-1], xin.shape[-1] // QK_K * Q6_K_BYTES)


def dequantize_q6_k(raw: np.ndarray) -> np.ndarray:
    """Q6_K bytes (any shape, a whole number of 210-byte blocks) -> float32 ``[n_blocks * 256]``.

    Bit-exact with ggml's ``dequantize_row_q6_K`` and ``gguf.quants.dequantize``.
    """
    q, d_sub = q6_k_symmetric(raw)
    return (d_sub[:, None] * q.astype(_F32)).reshape(-1)


def q6_k_symmetric(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q6_K bytes as 16-weight sub-blocks ``w = d * q``: codes int8 ``[n_sub, 16]`` (``q - 32``, in
    -32..31) and ``d = d_super * sc`` float32 ``[n_sub]`` (exact: 11 by 8 significant bits). The
    Numba kernels (chapter 8) read Q6_K through this form, Q8_0's with 16-weight blocks.
    """
    q, d, sc = q6_k_parts(raw)
    return q, (d[:, None] * sc.astype(_F32)).reshape(-1)


def q6_k_parts(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Q6_K bytes as stored: codes int8 ``[n_sub, 16]`` (``q - 32``), ``d`` float32 ``[n_super]`` and
    the sub-blocks' scales int8 ``[n_super, 16]`` (``w = d sc q``)."""
    b = _raw_blocks(raw, Q6_K_BYTES, "Q6_K")
    nb = b.shape[0]
    ql = b[:, 0:128].reshape(nb, 2, 2, 32)  # half h, byte group g, position l
    qh = b[:, 128:192].reshape(nb, 2, 1, 32)
    lo = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # quarters 0,1 (low nibbles), 2,3 (high)
    hi = (qh >> np.array([0, 2, 4, 6], dtype=np.uint8)[:, None]) & 0x03
    q = ((lo | (hi << 4)).astype(np.int8) - np.int8(32)).reshape(nb * 16, 16)
    return q, _fp16_value(b[:, 208:210]), b[:, 192:208].view(np.int8)
