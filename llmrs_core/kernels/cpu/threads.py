"""Threads for the CPU kernels: Numba's pool, BLAS's pool, and keeping them apart (chapter 8, 8.3).

Two thread pools live in one process: Numba's (``prange``; its *threading
layer* is TBB, OpenMP or Numba's own workqueue) and the BLAS library's
(OpenBLAS, used by ``x @ W.T``). Both keep their threads spinning for a
while after a call, hoping for more work. With both pools at full size on a
2-core machine they steal each other's cores: a 25 µs kernel run right after
a BLAS product took 7 ms (chapter 8's notebook, section 8.3). The rule used
here: Numba gets ``threads``, BLAS gets ``threads`` too but only for the big
prompt-processing products; everything else keeps BLAS single-threaded.

Other processes are the other source of contention. With one of 2 cores kept
busy, a SmolLM2 decode step went from 5.2 to 14.0 ms with OpenMP and from 5.4
to 8.4 ms with TBB's work stealing. Measured again on the int8 decode path
(``llmrs bench speed --contention``, 2 threads, AVX-512 EPYC, tg32): OpenMP
lost 2.8x (98 -> 35 tokens/s), TBB 1.3x (85 -> 64), Numba's workqueue was
slow even when quiet (25 tokens/s); quiet, TBB was as fast as OpenMP (99 and
92 tokens/s at tg64). So TBB is a dependency (``tbb`` from PyPI, on Linux
x86-64), and Numba prefers it when it can load it; the pip wheel puts the
library where the loader does not look, so :func:`load_pip_tbb` loads it by
path when this module is imported (``NUMBA_THREADING_LAYER=omp`` chooses
OpenMP anyway). Prompt processing goes through OpenBLAS's own threads, which
split the work statically: those lose about as much either way.
"""

from __future__ import annotations

import ctypes
import os
import sys
from contextlib import contextmanager
from pathlib import Path

import numba
import numpy as np


def load_pip_tbb(prefix: str | None = None) -> bool:
    """Load the TBB library of a pip-installed ``tbb`` (``<prefix>/lib/libtbb.so.12``), if any.

    Numba's TBB layer links against ``libtbb.so.12`` by name; the pip wheel puts
    it in the environment's ``lib/``, outside the loader's search path, so Numba
    would silently fall back to OpenMP. Loaded here first, it is found by name.
    Must run before Numba starts its threads. True if a library was loaded.
    """
    if os.environ.get("NUMBA_THREADING_LAYER", "default") in ("omp", "workqueue"):
        return False
    lib = Path(prefix or sys.prefix) / "lib" / "libtbb.so.12"
    if not lib.is_file():
        return False
    try:
        ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    except OSError:  # not a loadable library (another platform's, or damaged): Numba uses OpenMP
        return False
    return True


load_pip_tbb()


def max_threads() -> int:
    """The most threads Numba may use in this process (``NUMBA_NUM_THREADS``, default: all cores)."""
    return int(numba.config.NUMBA_NUM_THREADS)


def set_threads(threads: int | None) -> int:
    """Use ``threads`` Numba threads (None: all available); returns the number in effect.

    ``ValueError`` names the limit when more are asked than ``NUMBA_NUM_THREADS`` allows.
    """
    limit = max_threads()
    if threads is None:
        threads = limit
    if not 1 <= threads <= limit:
        raise ValueError(
            f"threads must be between 1 and {limit} (NUMBA_NUM_THREADS={limit} in this process), got {threads}"
        )
    numba.set_num_threads(threads)
    return threads


def threading_layer() -> str:
    """The Numba threading layer in use ("omp", "tbb" or "workqueue"), starting the pool if needed."""
    from .ops import NO_OPTIONS, attention  # any parallel kernel: the pool starts on the first parallel call

    tiny = np.zeros((1, 1, 2), np.float32)
    attention(tiny, tiny, tiny, *NO_OPTIONS)
    return numba.threading_layer()


class BlasThreads:
    """Set the BLAS thread count cheaply and often (threadpoolctl, without its per-call scan)."""

    def __init__(self):
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # pragma: no cover - threadpoolctl is a dependency
            self._libs = []
        else:
            self._libs = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]
        self.current = None

    def set(self, threads: int) -> None:
        if threads != self.current:
            for lib in self._libs:
                lib.set_num_threads(threads)
            self.current = threads

    def describe(self) -> str:
        if not self._libs:
            return "BLAS: not controllable (threadpoolctl found no BLAS library)"
        return ", ".join(f"{lib.internal_api} {lib.version or ''}".strip() for lib in self._libs)

    @contextmanager
    def limited(self, threads: int):
        before = self._libs[0].get_num_threads() if self._libs else None
        self.set(threads)
        try:
            yield
        finally:
            if before is not None:
                self.set(before)


def describe(threads: int) -> str:
    """One line: Numba threads and layer, BLAS library, for reports and the benchmark."""
    return (f"numba {numba.__version__}: {threads} threads, layer {threading_layer()}"
            f" (NUMBA_NUM_THREADS={max_threads()}, NUMBA_THREADING_LAYER="
            f"{os.environ.get('NUMBA_THREADING_LAYER', 'default')}); {BlasThreads().describe()}")


__all__ = ["BlasThreads", "describe", "load_pip_tbb", "max_threads", "set_threads", "threading_layer"]
