"""Fused dequantise-and-multiply kernels over packed weights (chapter 8, sections 8.1-8.4).

``y = x @ W.T`` for ``x [T, cols]`` and a :class:`~.packing.PackedMatrix`
``W [rows, cols]``, without ever writing ``W`` out as floats:

* **T = 1 (decode)**: :func:`q4_matvec` / :func:`q8_matvec`: per block of 32 weights
  ``w = d q + m``, ``d * sum(q x) + m * sum(x)``, the block sums of ``x`` computed once
  per call; the innermost loop runs over 32 interleaved rows (chapter 8.1 derives it).
* **small T (a decode batch)**: up to :data:`ROWS_AS_MATVECS` rows, one
  matvec each; then :func:`q4_matmul_small` / :func:`q8_matmul_small`
  unpack a block of codes once into a little float tile (in L1) and reuse it
  for all T rows of ``x``, four rows at a time: each weight byte is still
  read from memory once.
* **large T (prompt processing)**: :func:`dequantize_rows` expands a band of
  rows to float32 and BLAS's sgemm does the arithmetic (its cost: chapter 8.4).
* **int8 decode** (a matrix with an ``int8`` copy, up to :data:`INT8_ROWS`
  rows): ``x`` is quantised to 8 bits and multiplied with integer dot products
  (``int8.matmul_int8``, llama.cpp's arithmetic); the backend makes the copies
  where the CPU target has AVX2, unless told ``exact=True``.

The product kernels are ``parallel=True``: ``prange`` splits the groups of 32
rows across Numba's threads (``numba.set_num_threads``); the dequantisation
for BLAS is serial (see ``_dequantize_q4_groups``). ``fastmath`` lets LLVM
reorder the float sums, which is what vectorising a reduction needs; results
differ from NumPy's in the last bits only.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .int8 import matmul_int8
from .packing import BLOCK, LANES, PackedMatrix

#: up to this many rows of ``x`` go through the small-batch kernels; more go to BLAS.
#: Measured on SmolLM2's whole forward pass (2 threads): the kernels win up to about 40
#: rows (24 rows: 397 vs 280 tokens/s), BLAS from about 48 (64 rows: 507 vs 423), because
#: dequantising every matrix for BLAS costs as much as a few dozen rows of products.
SMALL_BATCH = 40
#: up to this many rows, one matvec per row beats unpacking a tile (measured on SmolLM2's matrices)
ROWS_AS_MATVECS = 4
#: rows dequantised per BLAS band (bounds the float32 scratch: 4096 x cols floats)
BAND_ROWS = 4096
#: up to this many rows of ``x`` go through the int8 kernels, for a matrix that has their copy
#: (``PackedMatrix.int8``, made by the backend where ``int8.int8_unavailable()`` is None).
#: Past that the rival is BLAS on dequantised bands. Measured on whole SmolLM2 prompts
#: (tokens/s, int8 kernels against BLAS; Intel Xeon with AVX-512 VNNI): 2 threads, 64 tokens
#: 552 vs 189, 128: 514 vs 263, 256: 464 vs 380, 384: 411 vs 388, 512: 355 vs 374; 1 thread,
#: 128 tokens 286 vs 204, 256: 254 vs 292. 128 keeps the int8 kernels where they won on both.
INT8_ROWS = 128

_F32 = np.float32


@njit(fastmath=True, cache=True)
def block_sums(x):
    """``x [T, cols]`` -> ``[T, cols / 32]``: the sum of each 32-value block (for the ``m`` term)."""
    t_count, cols = x.shape
    nb = cols // 32
    out = np.empty((t_count, nb), np.float32)
    for t in range(t_count):
        for b in range(nb):
            s = np.float32(0)
            for j in range(32):
                s += x[t, 32 * b + j]
            out[t, b] = s
    return out


@njit(parallel=True, fastmath=True, cache=True)
def q4_matvec(qs, d, m, x):
    """``W x -> [G*LANES]`` for one vector ``x [cols]`` and Q4-form weights (``qs`` uint8 ``[G, nb, 16, LANES]``)."""
    groups, nb = qs.shape[0], qs.shape[1]
    lanes = qs.shape[3]
    xsum = block_sums(x.reshape(1, x.shape[0]))[0]
    out = np.empty(groups * lanes, np.float32)
    sixteen = np.float32(16)
    for g in prange(groups):
        acc = np.zeros(lanes, np.float32)
        lo = np.empty(lanes, np.float32)  # sum of low-nibble codes x x, per row
        hi = np.empty(lanes, np.float32)  # the same for the high nibbles
        for b in range(nb):
            lo[:] = 0
            hi[:] = 0
            # Four bytes per pass, written out by hand: the sums of four products
            # stay in registers, and lo/hi are loaded and stored once per four
            # bytes instead of once per byte (1.4x faster than one per pass;
            # eight per pass runs out of registers and is slower).
            for j in range(0, 16, 4):
                xl0, xl1, xl2, xl3 = x[32 * b + j], x[32 * b + j + 1], x[32 * b + j + 2], x[32 * b + j + 3]
                xh0, xh1 = x[32 * b + 16 + j], x[32 * b + 17 + j]
                xh2, xh3 = x[32 * b + 18 + j], x[32 * b + 19 + j]
                for lane in range(lanes):
                    # u8 -> f32 directly; the low nibble as q - 16 * (q >> 4) keeps
                    # everything in 32-bit lanes (an `&` would widen to int64 in Numba)
                    h0 = np.float32(qs[g, b, j, lane] >> 4)
                    h1 = np.float32(qs[g, b, j + 1, lane] >> 4)
                    h2 = np.float32(qs[g, b, j + 2, lane] >> 4)
                    h3 = np.float32(qs[g, b, j + 3, lane] >> 4)
                    lo[lane] += ((np.float32(qs[g, b, j, lane]) - sixteen * h0) * xl0
                                 + (np.float32(qs[g, b, j + 1, lane]) - sixteen * h1) * xl1
                                 + (np.float32(qs[g, b, j + 2, lane]) - sixteen * h2) * xl2
                                 + (np.float32(qs[g, b, j + 3, lane]) - sixteen * h3) * xl3)
                    hi[lane] += h0 * xh0 + h1 * xh1 + h2 * xh2 + h3 * xh3
            xs = xsum[b]
            for lane in range(lanes):
                acc[lane] += d[g, b, lane] * (lo[lane] + hi[lane]) + m[g, b, lane] * xs
        for lane in range(lanes):
            out[g * lanes + lane] = acc[lane]
    return out


@njit(parallel=True, fastmath=True, cache=True)
def q8_matvec(qs, d, x):
    """``W x -> [G*LANES]`` for Q8-form weights (``w = d q``, ``qs`` int8 ``[G, nb, bs, LANES]``, ``bs`` 32 or 16)."""
    groups, nb, bs = qs.shape[0], qs.shape[1], qs.shape[2]
    lanes = qs.shape[3]
    out = np.empty(groups * lanes, np.float32)
    for g in prange(groups):
        acc = np.zeros(lanes, np.float32)
        blk = np.empty(lanes, np.float32)
        for b in range(nb):
            blk[:] = 0
            for j in range(0, bs, 4):  # four codes per pass, as in q4_matvec
                x0, x1, x2, x3 = x[bs * b + j], x[bs * b + j + 1], x[bs * b + j + 2], x[bs * b + j + 3]
                for lane in range(lanes):
                    blk[lane] += (np.float32(qs[g, b, j, lane]) * x0 + np.float32(qs[g, b, j + 1, lane]) * x1
                                  + np.float32(qs[g, b, j + 2, lane]) * x2 + np.float32(qs[g, b, j + 3, lane]) * x3)
            for lane in range(lanes):
                acc[lane] += d[g, b, lane] * blk[lane]
        for lane in range(lanes):
            out[g * lanes + lane] = acc[lane]
    return out


@njit(parallel=True, fastmath=True, cache=True)
def q4_matmul_small(qs, d, m, x):
    """``x @ W.T -> [T, G*LANES]`` for a few rows ``x [T, cols]`` and Q4-form weights.

    A block's codes are unpacked once into a float tile ``[32, LANES]`` (in
    L1) and used for every row of ``x``: each weight byte is read from memory
    once per call. The rows go four at a time (:func:`_tile_dot4`).
    """
    groups, nb = qs.shape[0], qs.shape[1]
    lanes = qs.shape[3]
    t_count = x.shape[0]
    xs4 = _four_rows(x)
    xsum = block_sums(xs4)
    out = np.empty((t_count, groups * lanes), np.float32)
    for g in prange(groups):
        tile = np.empty((32, lanes), np.float32)
        acc = np.zeros((xs4.shape[0], lanes), np.float32)
        blk = np.empty((4, lanes), np.float32)
        for b in range(nb):
            for j in range(16):
                for lane in range(lanes):
                    h = np.float32(qs[g, b, j, lane] >> 4)
                    tile[j, lane] = np.float32(qs[g, b, j, lane]) - np.float32(16) * h
                    tile[16 + j, lane] = h
            for t0 in range(0, xs4.shape[0], 4):
                _tile_dot4(tile, xs4, t0, b, blk)
                for k in range(4):
                    xs = xsum[t0 + k, b]
                    for lane in range(lanes):
                        acc[t0 + k, lane] += d[g, b, lane] * blk[k, lane] + m[g, b, lane] * xs
        for t in range(t_count):
            for lane in range(lanes):
                out[t, g * lanes + lane] = acc[t, lane]
    return out


@njit(cache=True)
def _four_rows(x):
    """``x [T, cols]``, padded with zero rows to a multiple of 4."""
    pad = (-x.shape[0]) % 4
    out = np.zeros((x.shape[0] + pad, x.shape[1]), np.float32)
    out[: x.shape[0]] = x
    return out


@njit(fastmath=True, cache=True, inline="always")
def _tile_dot4(tile, x, t0, b, blk):
    """``blk[k, lane] = sum_j tile[j, lane] * x[t0 + k, bs b + j]`` for k < 4, a tile of ``bs`` codes.

    Four rows of ``x`` times four codes per pass: each tile value loaded is
    used four times, and the four rows' sums are independent chains — 1.3 to
    1.6 times faster than one row at a time (measured at T = 8 to 40).
    """
    blk[:] = 0
    bs = tile.shape[0]
    for j in range(0, bs, 4):
        c = bs * b + j
        a0, a1, a2, a3 = x[t0, c], x[t0, c + 1], x[t0, c + 2], x[t0, c + 3]
        b0, b1, b2, b3 = x[t0 + 1, c], x[t0 + 1, c + 1], x[t0 + 1, c + 2], x[t0 + 1, c + 3]
        c0, c1, c2, c3 = x[t0 + 2, c], x[t0 + 2, c + 1], x[t0 + 2, c + 2], x[t0 + 2, c + 3]
        e0, e1, e2, e3 = x[t0 + 3, c], x[t0 + 3, c + 1], x[t0 + 3, c + 2], x[t0 + 3, c + 3]
        for lane in range(tile.shape[1]):
            w0, w1, w2, w3 = tile[j, lane], tile[j + 1, lane], tile[j + 2, lane], tile[j + 3, lane]
            blk[0, lane] += w0 * a0 + w1 * a1 + w2 * a2 + w3 * a3
            blk[1, lane] += w0 * b0 + w1 * b1 + w2 * b2 + w3 * b3
            blk[2, lane] += w0 * c0 + w1 * c1 + w2 * c2 + w3 * c3
            blk[3, lane] += w0 * e0 + w1 * e1 + w2 * e2 + w3 * e3


@njit(parallel=True, fastmath=True, cache=True)
def q8_matmul_small(qs, d, x):
    """Q8-form counterpart of :func:`q4_matmul_small`."""
    groups, nb, bs = qs.shape[0], qs.shape[1], qs.shape[2]
    lanes = qs.shape[3]
    t_count = x.shape[0]
    xs4 = _four_rows(x)
    out = np.empty((t_count, groups * lanes), np.float32)
    for g in prange(groups):
        tile = np.empty((bs, lanes), np.float32)
        acc = np.zeros((xs4.shape[0], lanes), np.float32)
        blk = np.empty((4, lanes), np.float32)
        for b in range(nb):
            for j in range(bs):
                for lane in range(lanes):
                    tile[j, lane] = np.float32(qs[g, b, j, lane])
            for t0 in range(0, xs4.shape[0], 4):
                _tile_dot4(tile, xs4, t0, b, blk)
                for k in range(4):
                    for lane in range(lanes):
                        acc[t0 + k, lane] += d[g, b, lane] * blk[k, lane]
        for t in range(t_count):
            for lane in range(lanes):
                out[t, g * lanes + lane] = acc[t, lane]
    return out


# Serial on purpose: these run between BLAS calls, and a Numba parallel region
# there wakes Numba's pool while OpenBLAS's threads are still spinning — on
# 2 cores that cost 5 ms per matrix, 25 times the dequantisation itself.
@njit(fastmath=True, cache=True)
def _dequantize_q4_groups(qs, d, m, g0, g1, out):
    lanes = qs.shape[3]
    for g in range(g0, g1):
        for lane in range(lanes):  # one output row at a time: contiguous writes
            r = (g - g0) * lanes + lane
            for b in range(qs.shape[1]):
                scale, offset = d[g, b, lane], m[g, b, lane]
                for j in range(16):
                    h = np.float32(qs[g, b, j, lane] >> 4)
                    out[r, 32 * b + j] = scale * (np.float32(qs[g, b, j, lane]) - np.float32(16) * h) + offset
                    out[r, 32 * b + 16 + j] = scale * h + offset


@njit(fastmath=True, cache=True)
def _dequantize_q8_groups(qs, d, g0, g1, out):
    lanes, bs = qs.shape[3], qs.shape[2]
    for g in range(g0, g1):
        for lane in range(lanes):
            r = (g - g0) * lanes + lane
            for b in range(qs.shape[1]):
                scale = d[g, b, lane]
                for j in range(bs):
                    out[r, bs * b + j] = scale * np.float32(qs[g, b, j, lane])


def dequantize_rows(w: PackedMatrix, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
    """Rows ``start:stop`` of ``w`` as float32 ``[stop - start, cols]`` (``start``, ``stop`` multiples of LANES,
    or ``stop == rows``)."""
    if w.kind == "f32":
        return w.qs[start:stop]
    g0, g1 = start // LANES, -(-stop // LANES)
    buf = np.empty(((g1 - g0) * LANES, w.cols), np.float32) if out is None else out[: (g1 - g0) * LANES]
    if w.kind == "q4":
        _dequantize_q4_groups(w.qs, w.d, w.m, g0, g1, buf)
    else:
        _dequantize_q8_groups(w.qs, w.d, g0, g1, buf)
    return buf[: stop - start]


def matmul(x: np.ndarray, w: PackedMatrix, scratch: np.ndarray | None = None) -> np.ndarray:
    """``x [T, cols] @ W.T -> [T, rows]`` float32, choosing the kernel by ``T`` and ``w.kind``.

    ``scratch`` (float32 ``[BAND_ROWS, cols]``), if given, holds the dequantised
    band of the prompt-processing path instead of a fresh allocation.
    """
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.cols:
        raise ValueError(f"matmul: x has shape {x.shape}, the weight expects [T, {w.cols}]")
    t_count = x.shape[0]
    if w.kind == "f32":
        return x @ w.qs.T
    if w.int8 is not None and t_count <= INT8_ROWS:
        return matmul_int8(x, w.int8)
    if t_count <= ROWS_AS_MATVECS:
        out = np.empty((t_count, w.rows), np.float32)
        for t in range(t_count):
            row = q4_matvec(w.qs, w.d, w.m, x[t]) if w.kind == "q4" else q8_matvec(w.qs, w.d, x[t])
            out[t] = row[: w.rows]
        return out
    if t_count <= SMALL_BATCH:
        out = q4_matmul_small(w.qs, w.d, w.m, x) if w.kind == "q4" else q8_matmul_small(w.qs, w.d, x)
        return out[:, : w.rows]
    # prompt processing: dequantise a band of rows, let sgemm multiply
    out = np.empty((t_count, w.rows), np.float32)
    for start in range(0, w.rows, BAND_ROWS):
        stop = min(start + BAND_ROWS, w.rows)
        band = dequantize_rows(w, start, stop, scratch)
        np.matmul(x, band.T, out=out[:, start:stop])
    return out


def matmul_rowwise(x: np.ndarray, w: PackedMatrix) -> np.ndarray:
    """``x [T, cols] @ W.T -> [T, rows]`` for a Q4- or Q8-form ``w``, each row of ``x`` computed
    alone whatever ``T`` is: the small-batch kernels at every length (a row's sums do not
    depend on the rows beside it, nor on their number), never BLAS or the matvec. The int8
    path's products for a matrix without an int8 copy (Q6_K), where batch invariance matters
    more than the speed of a long prompt (``backends.numba_backend``)."""
    if w.kind not in ("q4", "q8"):
        raise ValueError(f"matmul_rowwise multiplies Q4- or Q8-form weights, not {w.kind!r}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.cols:
        raise ValueError(f"matmul_rowwise: x has shape {x.shape}, the weight expects [T, {w.cols}]")
    out = q4_matmul_small(w.qs, w.d, w.m, x) if w.kind == "q4" else q8_matmul_small(w.qs, w.d, x)
    return out[:, : w.rows]


__all__ = [
    "BAND_ROWS", "BLOCK", "INT8_ROWS", "ROWS_AS_MATVECS", "SMALL_BATCH", "block_sums", "dequantize_rows", "matmul",
    "matmul_rowwise",
    "q4_matmul_small", "q4_matvec", "q8_matmul_small", "q8_matvec",
]
