"""glibc's heap settings for the CPU kernels' temporaries (chapter 8).

A prompt's products allocate outputs and activation copies of several to 32 MiB each, and free
them at once. glibc serves a block that large with ``mmap`` and returns it with ``munmap``, unless
its *dynamic* threshold has risen past it, so each product may fault in its output again, page by
page. The threshold's rise depends on the process's history: with llama.cpp's library working in the
same process, Llama-3.2-1B's 512-token prompt on two threads measured 155-185 tokens/s against 205
alone; with the heap settings below, 205 taking turns with llama.cpp too.

:func:`keep_freed_buffers` fixes the ``mmap`` threshold at glibc's largest (32 MiB on 64-bit, below
which blocks come from the heap) and raises the trim threshold (the free memory at the heap's top
glibc keeps instead of returning it), so freed temporaries are reused without faults. Process-wide;
skipped where a ``MALLOC_*`` variable already says what the user wants, or where the C library has no
``mallopt`` (not glibc).
"""

from __future__ import annotations

import ctypes
import os

#: ``mallopt``'s parameters (``<malloc.h>``)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
#: the largest ``mmap`` threshold glibc accepts on 64-bit (``HEAP_MAX_SIZE / 2``)
MMAP_THRESHOLD = 32 << 20
#: free memory at the heap's top kept for the next step instead of returned to the system
TRIM_THRESHOLD = 1 << 30
#: environment variables with which a user sets these themselves (glibc reads them at start)
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_applied: bool | None = None


def keep_freed_buffers() -> bool:
    """Set the thresholds once per process; True if they are set (now or before)."""
    global _applied
    if _applied is None:
        _applied = _set_thresholds()
    return _applied


def _set_thresholds() -> bool:
    if any(name in os.environ for name in USER_SETTINGS):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to ask, or not glibc's
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))


__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "keep_freed_buffers"]
