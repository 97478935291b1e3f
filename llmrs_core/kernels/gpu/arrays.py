"""The array-module shim ``xp`` and kernel launches on the right stream (chapter 9).

On a GPU the kernels' arrays are CuPy arrays and every launch goes on CuPy's current
stream, so numba.cuda kernels, CuPy's own kernels and cuBLAS run in one order. In the
CUDA simulator there is no device memory: the arrays are NumPy arrays (the simulator
accepts nothing else), and ``xp`` is NumPy. Code written against :func:`xp`,
:func:`to_device`, :func:`to_host` and :func:`launch` runs unchanged on both.

Launch geometry: every kernel loops over its work with grid-stride loops, so any grid and
block size give the same result, and the launch size is a speed choice only
(:func:`limits`): on a GPU, blocks of up to 256 threads and as many blocks as the work
needs; in the simulator, which runs each thread as a Python thread (about a millisecond
each), at most two blocks of 32 threads that each take more of the work.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any

import numpy as np

from . import runtime

#: (threads per block, blocks per launch) at most, on a GPU and in the simulator
GPU_LIMITS = (256, 1024)
SIMULATOR_LIMITS = (32, 2)
#: seconds between GIL hand-overs while a simulated kernel runs (Python's default: 0.005)
SIMULATOR_SWITCH_INTERVAL = 1e-4


def limits() -> tuple[int, int]:
    """``(threads per block, blocks)`` a launch may use here (see the module docstring)."""
    return SIMULATOR_LIMITS if runtime.simulator_enabled() else GPU_LIMITS


@functools.cache
def xp() -> ModuleType:
    """The array module of the kernels' arrays: ``cupy`` on a GPU, ``numpy`` in the simulator
    (found once: the target of a process never changes)."""
    if runtime.simulator_enabled():
        return np
    runtime.require_cuda()
    import cupy

    return cupy


def to_device(a: Any, dtype: Any = None) -> Any:
    """A contiguous device copy of ``a`` (in the simulator: a contiguous NumPy array)."""
    return xp().ascontiguousarray(xp().asarray(a, dtype=dtype))


def to_host(a: Any) -> np.ndarray:
    """``a`` as a NumPy array (copied from the device when it lives there)."""
    if isinstance(a, np.ndarray):
        return a
    return xp().asnumpy(a)


def out_array(out: Any, shape: tuple[int, ...]) -> Any:
    """``out`` if given (checked: float32 of ``shape``), else a new float32 array of ``shape``:
    the ``out=`` argument of every kernel wrapper."""
    if out is None:
        return xp().empty(shape, np.float32)
    if tuple(out.shape) != tuple(shape) or out.dtype != np.float32:
        raise ValueError(f"out must be float32 {tuple(shape)}; got {out.dtype} {tuple(out.shape)}")
    return out


def launch(kernel: Any, grid: int | tuple[int, ...], block: int | tuple[int, ...], *args: Any) -> None:
    """``kernel[grid, block](*args)``, on CuPy's current stream when on a GPU."""
    if runtime.simulator_enabled():
        # The simulator runs each CUDA thread as a Python thread, and they meet at every
        # barrier: with Python's default 5 ms GIL switch interval a launch spends most of
        # its time waiting for the hand-over (measured: 2-3x slower); switch faster meanwhile.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(SIMULATOR_SWITCH_INTERVAL)
        try:
            kernel[grid, block](*args)
        finally:
            sys.setswitchinterval(interval)
        return
    import cupy

    ptr = cupy.cuda.get_current_stream().ptr
    key = (kernel, grid, block, ptr)
    configured = _CONFIGURED.get(key)
    if configured is None:
        if len(_CONFIGURED) >= MAX_CONFIGURED:  # prefill grids vary with the prompt's length
            _CONFIGURED.clear()
        configured = _CONFIGURED[key] = kernel[grid, block, _external_stream(ptr)]
    configured(*args)


#: configured launches ``kernel[grid, block, stream]`` by (kernel, grid, block, stream pointer):
#: numba-cuda builds a stream object and a launch configuration per ``[...]``, and on an H200
#: that host work took half of each launch (gpu_check's launch step: 388 us a launch with
#: both built each time, 200 with the stream kept), at hundreds of launches a decode token
_CONFIGURED: dict[tuple[Any, Any, Any, int], Any] = {}
MAX_CONFIGURED = 4096


@functools.cache
def _external_stream(ptr: int) -> Any:
    """numba.cuda's view of the CuPy stream at ``ptr`` (one object per stream)."""
    return runtime.cuda().external_stream(ptr)


def pow2_at_most(n: int, cap: int) -> int:
    """The largest power of two <= min(n, cap), at least 1 (tree reductions halve it)."""
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def pow2_at_least(n: int, cap: int) -> int:
    """The smallest power of two >= n, capped at ``cap`` (a power of two)."""
    p = 1
    while p < n and p < cap:
        p *= 2
    return p


def grid_1d(n: int) -> tuple[int, int]:
    """``(blocks, threads)`` for ``n`` items in a grid-stride loop: no more blocks than the
    items need, within :func:`limits` (each thread then takes several items)."""
    max_threads, max_blocks = limits()
    threads = pow2_at_least(max(n, 1), max_threads)
    return max(1, min(max_blocks, -(-n // threads))), threads


__all__ = ["GPU_LIMITS", "SIMULATOR_LIMITS", "limits", "grid_1d", "launch", "out_array", "pow2_at_least", "pow2_at_most", "to_device", "to_host", "xp"]
