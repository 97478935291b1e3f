"""Chapter 8 solutions: the engine's Numba kernels (llmrs_core.kernels.cpu) and profiler (llmrs_core.profiling).

* 8.6 — the engine's decode kernel, ``kernels.cpu.matmul.q4_matvec``, compiled
  *without* ``parallel``: its ``prange`` then runs as a plain ``range``, one
  thread, and the loop body is exactly the engine's.
* 8.7 — ``q4_matvec`` itself (``parallel=True``), with the thread count set
  around the call.
* 8.8 — ``llmrs_core.profiling.profile_forward``.

The naive row-at-a-time kernel, the baseline, is ``labs.naive``; both
modules re-export it so that the learner's and the solutions' names match.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit

from llmrs_core.kernels.cpu import matmul as _matmul
from llmrs_core.kernels.cpu.packing import LANES, PackedMatrix
from llmrs_core.kernels.cpu.threads import set_threads
from llmrs_core.labs.naive import q4_matvec_naive, q4_naive_kernel, row_major
from llmrs_core.profiling import Hotspot, format_hotspots, function_name, profile_forward

__all__ = [
    "LANES",
    "Hotspot",
    "PackedMatrix",
    "format_hotspots",
    "function_name",
    "parallel_matvec",
    "profile_forward",
    "q4_matvec_kernel",
    "q4_matvec_naive",
    "q4_matvec_parallel",
    "q4_matvec_simd",
    "q4_naive_kernel",
    "row_major",
]


def _check(w: PackedMatrix, x: np.ndarray, who: str) -> np.ndarray:
    if w.kind != "q4":
        raise ValueError(f"{who}: the kernel reads q4 matrices, this one is {w.kind!r}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != (w.cols,):
        raise ValueError(f"{who}: x has shape {x.shape}, the matrix [{w.rows}, {w.cols}] needs ({w.cols},)")
    return x


# -- Exercise 8.6 -------------------------------------------------------------------------------------

#: the engine's kernel, compiled for one thread (``prange`` is ``range`` without ``parallel``)
q4_matvec_kernel = njit(fastmath=True)(_matmul.q4_matvec.py_func)


def q4_matvec_simd(w: PackedMatrix, x: np.ndarray) -> np.ndarray:
    """``W x -> [rows]`` float32 with :func:`q4_matvec_kernel`."""
    x = _check(w, x, "q4_matvec_simd")
    return q4_matvec_kernel(w.qs, w.d, w.m, x)[: w.rows]


# -- Exercise 8.7 -------------------------------------------------------------------------------------

q4_matvec_parallel = _matmul.q4_matvec


def parallel_matvec(w: PackedMatrix, x: np.ndarray, threads: int) -> np.ndarray:
    """``W x -> [rows]`` float32 with :func:`q4_matvec_parallel` on ``threads`` Numba threads."""
    x = _check(w, x, "parallel_matvec")
    before = numba.get_num_threads()
    set_threads(threads)
    try:
        return q4_matvec_parallel(w.qs, w.d, w.m, x)[: w.rows]
    finally:
        numba.set_num_threads(before)


# -- Exercise 8.8: profile_forward is the engine's (imported above) ----------------------------------
