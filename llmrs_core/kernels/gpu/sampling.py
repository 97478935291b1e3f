"""Greedy sampling on the device: the argmax of each row of logits (chapter 9).

A decode step then copies one integer per sequence to the host, not 49,152 logits.
A thread block per row (striding over rows); each thread scans every ``n``-th logit, keeping its best value
and the lowest index that has it (``numpy.argmax`` returns the first maximum), and the
block merges the candidates in shared memory in a tree.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import runtime
from .arrays import launch, limits, pow2_at_least, to_host, xp

cuda = runtime.cuda()

MAX_THREADS = 256


def argmax_rows(logits, out):  # pragma: no cover - a kernel
    """``out[r] = argmax(logits[r])``, the first index of the maximum."""
    best_v = cuda.shared.array(MAX_THREADS, np.float32)
    best_i = cuda.shared.array(MAX_THREADS, np.int64)
    tid, n = cuda.threadIdx.x, cuda.blockDim.x
    for r in range(cuda.blockIdx.x, logits.shape[0], cuda.gridDim.x):
        v = logits[r, 0]
        at = 0
        for c in range(tid, logits.shape[1], n):
            if logits[r, c] > v or (logits[r, c] == v and c < at):
                v = logits[r, c]
                at = c
        best_v[tid] = v
        best_i[tid] = at
        cuda.syncthreads()
        stride = n // 2
        while stride > 0:
            if tid < stride:
                ov, oi = best_v[tid + stride], best_i[tid + stride]
                if ov > best_v[tid] or (ov == best_v[tid] and oi < best_i[tid]):
                    best_v[tid] = ov
                    best_i[tid] = oi
            cuda.syncthreads()
            stride //= 2
        if tid == 0:
            out[r] = best_i[0]
        cuda.syncthreads()


argmax_kernel = cuda.jit(argmax_rows)


def greedy(logits: Any) -> np.ndarray:
    """Token ids ``[B]`` (int64, on the host) of the largest logit of each row of ``logits [B, V]``."""
    logits = xp().ascontiguousarray(logits, dtype=np.float32)
    if logits.ndim == 1:
        logits = logits.reshape(1, -1)
    out = xp().empty(logits.shape[0], np.int64)
    max_threads, max_blocks = limits()
    launch(argmax_kernel, min(logits.shape[0], max_blocks), pow2_at_least(logits.shape[1], max_threads), logits, out)
    return to_host(out)


KERNELS = [("argmax_rows", argmax_rows, ["void(float32[:, ::1], int64[::1])"])]

__all__ = ["KERNELS", "greedy"]
