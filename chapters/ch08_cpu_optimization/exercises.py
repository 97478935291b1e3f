"""Chapter 8 — CPU Optimization Techniques: your exercises.

Exercise 8.6  SIMD Matrix Multiplication          (ch08_cpu_optimization.ipynb, section 8.6)
Exercise 8.7  Parallel Matmul with prange          (ch08_cpu_optimization.ipynb, section 8.7)
Exercise 8.8  CPU Profiling                        (ch08_cpu_optimization.ipynb, section 8.8)

Check your work with ``make test-chapter 8`` (or ``make test-exercise E=8.6``).

The weights are the engine's :class:`PackedMatrix` (``llmrs_core.kernels.cpu.packing``)
of kind ``"q4"``: ``w = d * q + m`` with 4-bit codes ``q``, rows interleaved in groups
of ``LANES = 32``:

* ``qs`` uint8 ``[G, nb, 16, LANES]``: byte ``j`` of block ``b`` of the 32 rows of group
  ``g``; its low nibble is the code of weight ``32 b + j``, its high nibble that of
  weight ``32 b + 16 + j``;
* ``d``, ``m`` float32 ``[G, nb, LANES]``: each block's scale and offset;

with ``G = ceil(rows / 32)`` groups and ``nb = cols / 32`` blocks per row. Row
``32 g + lane`` of the matrix is lane ``lane`` of group ``g``; the rows after ``rows``
are zero padding.

A kernel that runs without Numba (for debugging, with ``print``): set the environment
variable ``NUMBA_DISABLE_JIT=1`` before Python starts — slow, but every error is an
ordinary Python error with a line number.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit, prange  # noqa: F401  (prange: for Exercise 8.7)

from llmrs_core.kernels.cpu.matmul import block_sums  # noqa: F401  (sum(x) per block, for your kernels)
from llmrs_core.kernels.cpu.packing import LANES, PackedMatrix
from llmrs_core.kernels.cpu.threads import max_threads, set_threads  # noqa: F401  (for Exercise 8.7)
from llmrs_core.labs.naive import q4_matvec_naive, q4_naive_kernel, row_major  # the baseline, given
from llmrs_core.profiling import Hotspot, format_hotspots, function_name

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


# -- Exercise 8.6: a vectorised Q4 matrix-vector product --------------------------------------------


@njit(fastmath=True)
def q4_matvec_kernel(qs, d, m, x):
    """``W x -> [G * LANES]`` float32 for one vector ``x [cols]``, single-threaded and vectorised.

    ``qs [G, nb, 16, LANES]``, ``d``, ``m`` ``[G, nb, LANES]`` as in the module docstring.
    Output ``32 g + lane`` is the dot product of row ``32 g + lane`` with ``x``
    (padding rows included: the wrapper slices them away).

    Shape the loops so that the innermost one runs over ``lane``: the 32 lanes are 32
    independent rows, so LLVM can put 16 of them in one AVX-512 register (8 with AVX2)
    and do the same instruction to all. Per block, use
    ``w . x = d * sum(q * x) + m * sum(x)`` (``block_sums`` gives every block's
    ``sum(x)``).

    Keep every number in the loops float32. To Numba a bare ``16`` or ``0.5`` is 64-bit,
    and int64 or float64 with float32 gives float64: ``np.float32(byte) - 16 * high``
    is computed in doubles, half the lanes per register plus conversions, 2 to 3 times
    slower. Name the constant once, before the loops, and convert the codes with it::

        sixteen = np.float32(16)
        ...
        high = np.float32(byte >> 4)            # the high nibble
        low = np.float32(byte) - sixteen * high  # the low one, without leaving 32 bits

    (``np.float32(byte & 15)`` is right too, but Numba widens the ``&`` to 64-bit
    integers first: a little slower.) Arrays likewise: ``np.zeros(LANES, np.float32)``.
    """
    raise NotImplementedError(
        "Exercise 8.6 `q4_matvec_kernel`: not implemented yet — see ch08_cpu_optimization.ipynb §8.6"
    )


def q4_matvec_simd(w: PackedMatrix, x: np.ndarray) -> np.ndarray:
    """``W x -> [rows]`` float32 with :func:`q4_matvec_kernel`.

    ``ValueError`` unless ``w.kind == "q4"`` and ``x`` has shape ``[w.cols]`` (a compiled
    kernel does not check bounds: a short ``x`` would be read past its end). Pass ``x`` to the
    kernel as contiguous float32, ``np.ascontiguousarray(x, dtype=np.float32)``: for a float64
    ``x`` Numba would compile a second, float64 kernel, and for a strided one it may not
    compile at all. Drop the padding rows from the kernel's result.
    """
    raise NotImplementedError(
        "Exercise 8.6 `q4_matvec_simd`: not implemented yet — see ch08_cpu_optimization.ipynb §8.6"
    )


# -- Exercise 8.7: the same product on every core ----------------------------------------------------


@njit(parallel=True, fastmath=True)
def q4_matvec_parallel(qs, d, m, x):
    """``W x -> [G * LANES]`` float32, like :func:`q4_matvec_kernel`, with the groups of rows
    shared among Numba's threads: the loop over ``g`` becomes ``prange``.

    Each group's 32 rows are computed by one thread from start to end, so the threads
    never write the same output; everything a thread accumulates into must be created
    *inside* the ``prange`` body (an array shared by all threads would be a data race).
    """
    raise NotImplementedError(
        "Exercise 8.7 `q4_matvec_parallel`: not implemented yet — see ch08_cpu_optimization.ipynb §8.7"
    )


def parallel_matvec(w: PackedMatrix, x: np.ndarray, threads: int) -> np.ndarray:
    """``W x -> [rows]`` float32 with :func:`q4_matvec_parallel` on ``threads`` Numba threads.

    The same checks as :func:`q4_matvec_simd`. Use ``set_threads(threads)`` (it raises
    ``ValueError`` for a number outside ``1..max_threads()``) and put the previous number
    back afterwards (``numba.get_num_threads()``), even if the kernel raises.
    """
    raise NotImplementedError(
        "Exercise 8.7 `parallel_matvec`: not implemented yet — see ch08_cpu_optimization.ipynb §8.7"
    )


# -- Exercise 8.8: where does the time go? -------------------------------------------------------------


def profile_forward(
    model, ids: Sequence[int], top: int = 10, warm_up: bool = True, repeat: int = 1
) -> list[Hotspot]:
    """The ``top`` functions by own time in ``repeat`` forward passes over ``ids`` (``[T]`` token ids).

    ``model`` is a loaded model (``llmrs.load()``) or its network
    (``getattr(model, "network", model)``). A pass is ``network.forward(ids)``. With
    ``warm_up``, run one pass first, outside the profiler. Then profile the passes with
    ``cProfile.Profile()`` (``enable()`` ... ``disable()``, in a ``try``/``finally``) and read
    ``pstats.Stats(profiler).stats``: ``{(file, line, function): (primitive calls, calls,
    own time, cumulative time, callers)}``. Make a :class:`Hotspot` per function with own
    time > 0 — ``function_name(key)``, calls, own seconds, and ``share`` = own seconds over
    the total own time of all functions (``Stats.total_tt``) — and leave out the
    profiler's own ``disable`` call. Return the ``top`` largest by own time, largest first.
    ``ValueError`` if ``top`` or ``repeat`` is below 1.
    """
    raise NotImplementedError(
        "Exercise 8.8 `profile_forward`: not implemented yet — see ch08_cpu_optimization.ipynb §8.8"
    )
