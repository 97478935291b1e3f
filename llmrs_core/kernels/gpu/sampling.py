"""Sampling on the device: greedy as a kernel, and the whole sampling chain in array operations (chapter 9).

A decode step then copies one integer per sequence to the host, not 49,152 logits.

**Greedy** (:func:`greedy`) is a numba.cuda kernel.
A thread block per row (striding over rows); each thread scans every ``n``-th logit, keeping its best value
and the lowest index that has it (``numpy.argmax`` returns the first maximum), and the
block merges the candidates in shared memory in a tree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ...sampling import SamplingParams
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


def _softmax(x: Any) -> Any:
    """``attention.softmax`` in the array module of ``x`` (float64 in, float64 out)."""
    e = xp().exp(x - x.max())
    return e / e.sum()


def sample(logits: Any, params: SamplingParams, rng: np.random.Generator, history: Sequence[int] = ()) -> int:
    """``sampling.sample_token`` computed where the logits are: penalties, greedy, temperature,
    top-k, top-p, min-p, then the draw.

    Each step is the host function's, in the same order, written in ``xp`` operations (CuPy
    kernels on a GPU: its sort, partition and cumulative sum). The draw is NumPy's
    ``Generator.choice(n, p=probs)``, spelled out: one ``rng.random()`` on the host, then
    ``searchsorted`` of the normalised cumulative sum on the device. So the same seed gives
    the host sampler's tokens, and only the chosen id crosses to the host.
    """
    a = xp()
    x = a.array(a.asarray(logits, dtype=np.float32).reshape(-1), copy=True)
    if len(history):
        ids, counts = np.unique(np.asarray(history, dtype=np.int64), return_counts=True)
        ids_d, counts_d = a.asarray(ids), a.asarray(counts)
        if params.repetition_penalty != 1.0:
            picked = x[ids_d]
            x[ids_d] = a.where(picked > 0, picked / params.repetition_penalty, picked * params.repetition_penalty)
        x[ids_d] -= params.presence_penalty + params.frequency_penalty * counts_d
    if params.greedy:
        return int(greedy(x)[0])
    x = x / np.float32(params.temperature)
    if 0 < params.top_k < x.size:
        at = x.size - params.top_k  # numpy.partition(x, -k)[-k], with a kth CuPy accepts too
        threshold = a.partition(x, at)[at]
        x = a.where(x >= threshold, x, -np.inf).astype(np.float32)
    if params.top_p < 1.0:
        order = a.argsort(-x, kind="stable") if a is np else a.argsort(-x)
        probs = _softmax(x[order].astype(np.float64))
        kept = order[(a.cumsum(probs) - probs) < params.top_p]  # the first token always stays
        out = a.full_like(x, -np.inf)
        out[kept] = x[kept]
        x = out
    if params.min_p > 0:
        x = a.where(x >= x.max() + np.log(params.min_p), x, -np.inf).astype(np.float32)
    cdf = a.cumsum(_softmax(x.astype(np.float64)))
    cdf /= cdf[-1]
    return int(a.searchsorted(cdf, a.asarray([rng.random()]), side="right")[0])


KERNELS = [("argmax_rows", argmax_rows, ["void(float32[:, ::1], int64[::1])"])]

__all__ = ["KERNELS", "greedy", "sample"]
