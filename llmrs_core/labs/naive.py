"""The naive Q4 matvec, one row at a time: the baseline the fast kernels are measured against (chapter 8).

The same arithmetic as ``matmul.q4_matvec`` — per block ``d * sum(q x) + m * sum(x)``
— with the loops in GGUF's order: row, block, byte. Its inner loop is a
reduction along one row, which LLVM can only partly vectorise; section 8.1 of
the notebook shows the difference in the assembly and the timings.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..kernels.cpu.matmul import block_sums
from ..kernels.cpu.packing import PackedMatrix


def row_major(w: PackedMatrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``w`` back in GGUF's order, row by row and block by block.

    Returns ``qs`` uint8 ``[rows, nb, 16]`` (the same bytes, GGUF's nibble order) and
    ``d``, ``m`` float32 ``[rows, nb]`` — the scales kept apart as float32, so that only
    the order of the loops differs from the interleaved layout.
    """
    if w.kind != "q4":
        raise ValueError(f"row_major: a q4 matrix is needed, this one is {w.kind!r}")
    qs = np.ascontiguousarray(np.moveaxis(w.qs, 3, 1).reshape(-1, w.qs.shape[1], 16)[: w.rows])
    d = np.ascontiguousarray(np.moveaxis(w.d, 2, 1).reshape(-1, w.d.shape[1])[: w.rows])
    m = np.ascontiguousarray(np.moveaxis(w.m, 2, 1).reshape(-1, w.m.shape[1])[: w.rows])
    return qs, d, m


@njit(fastmath=True)
def q4_naive_kernel(qs, d, m, x):
    """``W x -> [rows]`` one row at a time, from the row-major arrays of :func:`row_major`.

    The same arithmetic as the fast kernels — per block ``d * sum(q x) + m * sum(x)`` —
    but the inner loop walks along *one row*: its 16 bytes are a reduction into a
    single sum, which the CPU can only partly vectorise.
    """
    rows, nb = d.shape
    xsum = block_sums(x.reshape(1, x.shape[0]))[0]
    out = np.empty(rows, np.float32)
    for r in range(rows):
        acc = np.float32(0)
        for b in range(nb):
            s = np.float32(0)
            for j in range(16):
                q = qs[r, b, j]
                s += np.float32(q & 15) * x[32 * b + j] + np.float32(q >> 4) * x[32 * b + 16 + j]
            acc += d[r, b] * s + m[r, b] * xsum[b]
        out[r] = acc
    return out


def q4_matvec_naive(w: PackedMatrix, x: np.ndarray) -> np.ndarray:
    """``W x -> [rows]`` float32 with :func:`q4_naive_kernel` (re-orders ``w`` on every call)."""
    qs, d, m = row_major(w)
    return q4_naive_kernel(qs, d, m, np.ascontiguousarray(x, dtype=np.float32))


__all__ = ["q4_matvec_naive", "q4_naive_kernel", "row_major"]
