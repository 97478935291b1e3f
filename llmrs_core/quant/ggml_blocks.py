"""Quantising to GGML's 32-weight block formats, and multiplying straight from blocks (chapter 6).

The byte layouts are in :mod:`llmrs_core.quant.dequant`. Quantisation
follows ggml's reference functions (``quantize_row_q8_0_ref`` and friends) so
that our bytes equal llama.cpp's:

* **Q8_0** (symmetric, 8.5 bits/weight): ``d = max|x| / 127``; ``q = round(x / d)``,
  rounding halves away from zero (C's ``roundf``).
* **Q4_0** (symmetric, 4.5 bits): ``d = m / -8`` where ``m`` is the weight of
  largest magnitude *with its sign*, so that ``m`` maps exactly to code 0 and
  the 16 codes cover ``[-8d, 7d]``; ``q = min(15, trunc(x / d + 8.5))``.
* **Q4_1** (asymmetric, 5 bits): ``d = (max - min) / 15``, ``m = min``;
  ``q = min(15, trunc((x - min) / d + 0.5))``.
* **Q5_0** (symmetric, 5.5 bits): Q4_0 with 32 levels: ``d = m / -16``;
  ``q = min(31, trunc(x / d + 16.5))`` (``quantize_row_q5_0_ref``).
* **Q5_1** (asymmetric, 6 bits): Q4_1 with 32 levels: ``d = (max - min) / 31``;
  ``q = trunc((x - min) / d + 0.5)`` (``quantize_row_q5_1_ref``: no clamp).

The scales are stored as fp16, but quantisation multiplies by ``1 / d`` in
float32, as ggml does (0 where ``d`` is 0: a Q4_0 block of zeros gets code 8,
bytes 0x88). Shapes: ``x`` is float32 ``[..., n]`` with ``n`` a
multiple of 32; the result is ``uint8 [..., n / 32 * type_size]``.
"""

from __future__ import annotations

import numpy as np

from .types import GGMLType, type_traits

BLOCK = 32


def _as_blocks(x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 0 or x.shape[-1] % BLOCK:
        raise ValueError(f"the last axis ({x.shape[-1] if x.ndim else 'scalar'}) must be a multiple of {BLOCK}")
    if not np.all(np.isfinite(x)):
        raise ValueError("cannot quantise NaN or infinite values")
    return x.reshape(-1, BLOCK), x.shape


def _inverse(d: np.ndarray) -> np.ndarray:
    """``1 / d``, and 0 where ``d`` is 0 (an all-zero block quantises to zeros)."""
    with np.errstate(divide="ignore"):
        return np.where(d == 0, np.float32(0), np.float32(1) / d).astype(np.float32)


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's ``roundf``: halves go away from zero (NumPy's ``round`` goes to even)."""
    return np.sign(v) * np.floor(np.abs(v) + np.float32(0.5))


def _first_min_max(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[n, 32]`` -> the first smallest and first largest value, ``[n, 1]`` each: as ggml's loop
    finds them, so that the sign of a zero (stored in Q4_1/Q5_1's fp16 ``m``) is ggml's."""
    lo = np.take_along_axis(blocks, blocks.argmin(axis=1)[:, None], axis=1)
    hi = np.take_along_axis(blocks, blocks.argmax(axis=1)[:, None], axis=1)
    return lo, hi


def _fp16_bytes(v: np.ndarray) -> np.ndarray:
    return v.astype(np.float16).view(np.uint8).reshape(v.shape[0], 2)


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """``[n, 32]`` codes 0..15 -> ``[n, 16]`` bytes: element j low nibble, element j + 16 high."""
    return (q[:, :16] | (q[:, 16:] << 4)).astype(np.uint8)


def _out_shape(shape: tuple[int, ...], ggml_type: GGMLType) -> tuple[int, ...]:
    return (*shape[:-1], shape[-1] // BLOCK * type_traits(ggml_type).type_size)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    blocks, shape = _as_blocks(x)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    q = _round_half_away(blocks * _inverse(d)).astype(np.int8)
    out = np.concatenate([_fp16_bytes(d), q.view(np.uint8)], axis=1)
    return out.reshape(_out_shape(shape, GGMLType.Q8_0))


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    blocks, shape = _as_blocks(x)
    biggest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    biggest = np.where(biggest == 0, np.float32(0), biggest)  # ggml keeps +0.0 for a block of zeros
    d = biggest / np.float32(-8)
    codes = np.trunc(blocks * _inverse(d) + np.float32(8.5))
    q = np.minimum(codes, 15).astype(np.uint8)
    out = np.concatenate([_fp16_bytes(d), _pack_nibbles(q)], axis=1)
    return out.reshape(_out_shape(shape, GGMLType.Q4_0))


def quantize_q4_1(x: np.ndarray) -> np.ndarray:
    blocks, shape = _as_blocks(x)
    lo, hi = _first_min_max(blocks)
    d = (hi - lo) / np.float32(15)
    codes = np.trunc((blocks - lo) * _inverse(d) + np.float32(0.5))
    q = np.minimum(codes, 15).astype(np.uint8)
    out = np.concatenate([_fp16_bytes(d), _fp16_bytes(lo), _pack_nibbles(q)], axis=1)
    return out.reshape(_out_shape(shape, GGMLType.Q4_1))


def _pack_five_bits(q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``[n, 32]`` codes 0..31 -> (``qh`` uint8 ``[n, 4]``, ``qs`` uint8 ``[n, 16]``).

    ``qs`` holds the low nibbles as Q4_0 does; bit ``j`` of the little-endian
    uint32 ``qh`` is the fifth bit of element ``j``.
    """
    qh = (((q.astype(np.uint32) >> 4) & 1) << np.arange(BLOCK, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
    return qh.astype("<u4").view(np.uint8).reshape(-1, 4), _pack_nibbles(q & 0x0F)


def quantize_q5_0(x: np.ndarray) -> np.ndarray:
    blocks, shape = _as_blocks(x)
    biggest = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    biggest = np.where(biggest == 0, np.float32(0), biggest)  # ggml keeps +0.0 for a block of zeros
    d = biggest / np.float32(-16)
    # (int8_t)(x*id + 16.5): a truncation toward zero, always >= 0 here since x*id >= -16
    codes = np.trunc(blocks * _inverse(d) + np.float32(16.5))
    q = np.minimum(codes, 31).astype(np.uint8)
    qh, qs = _pack_five_bits(q)
    out = np.concatenate([_fp16_bytes(d), qh, qs], axis=1)
    return out.reshape(_out_shape(shape, GGMLType.Q5_0))


def quantize_q5_1(x: np.ndarray) -> np.ndarray:
    blocks, shape = _as_blocks(x)
    lo, hi = _first_min_max(blocks)
    d = (hi - lo) / np.float32(31)
    # ggml does not clamp to 31 here: (x - min) / d <= 31 up to rounding, and +0.5 truncates below 32
    q = np.trunc((blocks - lo) * _inverse(d) + np.float32(0.5)).astype(np.uint8)
    qh, qs = _pack_five_bits(q)
    out = np.concatenate([_fp16_bytes(d), _fp16_bytes(lo), qh, qs], axis=1)
    return out.reshape(_out_shape(shape, GGMLType.Q5_1))


def quantize(x: np.ndarray, ggml_type: GGMLType | int | str) -> np.ndarray:
    """Float32 ``[..., n]`` -> stored bytes of ``ggml_type`` (every type ``registry.supported("quantize")`` lists).

    The function for each type is found in :mod:`.registry`; an unsupported
    type raises ``NotImplementedError`` naming it and the supported ones.
    """
    from .registry import quantizer  # here, not at the top: the registry imports this module
    from .types import type_by_name

    t = type_by_name(ggml_type) if isinstance(ggml_type, str) else GGMLType(ggml_type)
    return quantizer(t)(np.asarray(x, dtype=np.float32))


def matvec(raw: np.ndarray, ggml_type: GGMLType | int, shape: tuple[int, int], x: np.ndarray,
           rows_per_chunk: int = 256) -> np.ndarray:
    """``W @ x`` for a quantised ``W [rows, cols]`` without dequantising all of ``W``.

    Works a chunk of rows at a time on the blocks themselves. For Q4_1, with
    ``w = d q + m`` in each block ``b``: ``w_b . x_b = d (q_b . x_b) + m sum(x_b)``,
    so the per-block sums of ``x`` are computed once and reused by every row;
    Q8_0 and Q4_0 need only ``d (q_b . x_b)``. Other types fall back to
    dequantising one chunk of rows at a time. ``x`` is ``[cols]`` or ``[cols, B]``.
    """
    from .dequant import dequantize, fp16_field, unpack_nibbles

    t = GGMLType(ggml_type)
    rows, cols = shape
    x = np.asarray(x, dtype=np.float32)
    xb = x.reshape(cols // BLOCK, BLOCK, *x.shape[1:])  # [n_blocks, 32, (B)]
    raw = np.asarray(raw, dtype=np.uint8).reshape(rows, -1)
    size = type_traits(t).type_size
    out = np.empty((rows, *x.shape[1:]), dtype=np.float32)
    for start in range(0, rows, rows_per_chunk):
        chunk = raw[start : start + rows_per_chunk]
        n = chunk.shape[0]
        if t in (GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1):
            blocks = chunk.reshape(-1, size)
            d = fp16_field(blocks, 0).reshape(n, -1)  # [n, n_blocks]
            if t is GGMLType.Q8_0:
                q = blocks[:, 2:].view(np.int8).astype(np.float32)
            else:
                packed = blocks[:, 4:] if t is GGMLType.Q4_1 else blocks[:, 2:]
                q = unpack_nibbles(packed).astype(np.float32)
                if t is GGMLType.Q4_0:
                    q -= 8
            q = q.reshape(n, -1, BLOCK)  # [n, n_blocks, 32]
            partial = np.einsum("rbk,bk...->rb...", q, xb)  # q_b . x_b per row and block
            y = np.einsum("rb,rb...->r...", d, partial)
            if t is GGMLType.Q4_1:
                m = fp16_field(blocks, 2).reshape(n, -1)
                y += np.einsum("rb,b...->r...", m, xb.sum(axis=1))
        else:
            w = dequantize(chunk.reshape(-1), t, (n, cols))
            y = w @ x
        out[start : start + n] = y
    return out
