"""Where the GPU kernels run: a real NVIDIA GPU, or numba-cuda's CUDA simulator (chapter 9).

One kernel source serves both. numba-cuda reads ``NUMBA_ENABLE_CUDASIM`` when
``numba.cuda`` is first imported, and cannot switch afterwards, so the choice is
made once per process, here:

- ``NUMBA_ENABLE_CUDASIM=1`` in the environment, or :func:`enable_simulator`
  called before anything imported ``numba.cuda``: the simulator (kernels run on
  the CPU, arrays are NumPy arrays, about 0.1 s per 32-thread block: tiny shapes only);
- otherwise a real GPU if the CUDA driver reports one (arrays are CuPy arrays).

Every module that launches kernels gets ``numba.cuda`` from :func:`cuda`.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

import numpy as np

SIMULATOR_ENV = "NUMBA_ENABLE_CUDASIM"
INSTALL_HINT = "pip install -e '.[gpu]'"


class CudaUnavailableError(RuntimeError):
    """Neither a usable NVIDIA GPU nor the CUDA simulator: says what to install or set."""


def _numba_module():
    try:
        import numba
    except ImportError as e:  # pragma: no cover - numba is a core dependency
        raise CudaUnavailableError(f"numba is not installed ({e})") from e
    return numba


def simulator_enabled() -> bool:
    """True when numba.cuda runs (or will run) in the simulator in this process."""
    return _numba_module().config.ENABLE_CUDASIM == 1 or os.environ.get(SIMULATOR_ENV) == "1"


def enable_simulator() -> None:
    """Run numba.cuda in the simulator for the rest of this process.

    Must come before the first ``import numba.cuda`` anywhere in the process: afterwards the
    target is fixed, and this raises rather than leave kernels on the wrong one.
    """
    numba = _numba_module()
    if numba.config.ENABLE_CUDASIM == 1:
        return
    if "numba.cuda" in sys.modules:
        raise CudaUnavailableError(
            "numba.cuda was already imported for a real GPU; enable the simulator before anything "
            f"imports numba.cuda (or start Python with {SIMULATOR_ENV}=1)"
        )
    os.environ[SIMULATOR_ENV] = "1"
    numba.core.config.reload_config()


def cuda() -> ModuleType:
    """``numba.cuda`` on the target chosen for this process (see the module docstring).

    Raises :class:`CudaUnavailableError` with what to install when numba-cuda is missing.
    """
    if os.environ.get(SIMULATOR_ENV) == "1" and _numba_module().config.ENABLE_CUDASIM != 1:
        _numba_module().core.config.reload_config()  # the variable was set after numba was imported
    # CuPy orders its own work on its streams; Numba need not synchronise every array it is handed
    os.environ.setdefault("NUMBA_CUDA_ARRAY_INTERFACE_SYNC", "0")
    # numba-cuda 0.30 overloads np.row_stack when it first compiles a kernel; NumPy 2.5 removed that
    # alias of vstack, so every compile failed with AttributeError on an H200 with NumPy 2.5 (gpu_check)
    if "row_stack" not in np.__dict__:
        np.row_stack = np.vstack
    try:
        from numba import cuda as numba_cuda
    except ImportError as e:
        raise CudaUnavailableError(f"numba-cuda is not installed ({e}); {INSTALL_HINT}") from e
    if _numba_module().config.ENABLE_CUDASIM == 1:
        _guard_simulated_shared_memory()
    return numba_cuda


def _guard_simulated_shared_memory() -> None:
    """Give the simulator's ``cuda.shared.array`` the lock it lacks (numba-cuda 0.30).

    The simulator makes a block's shared array when the first of its threads reaches the
    ``cuda.shared.array`` line, keyed by file and line, with a look-up and a store that are
    not atomic: two threads that get there together each make an array of their own, and the
    block's threads then sum into different memories (seen here as rare, large errors of the
    reductions). This replacement does the same look-up under a lock. Compiled kernels are
    untouched: on a GPU a shared array is one allocation per block.
    """
    import threading

    from numba.cuda.np import numpy_support
    from numba.cuda.simulator import kernelapi

    shared = kernelapi.FakeCUDAShared
    if shared.__dict__.get("_llmrs_guarded"):
        return
    dynamic = shared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:  # dynamic shared memory (no race), or the error
            return dynamic(self, shape, dtype, alignment)
        if isinstance(dtype, kernelapi.types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)  # the kernel's line, as the original identifies an allocation
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            found = self._allocations.get(key)
            if found is None:
                found = self._allocations[key] = np.empty(shape, dtype)
        return found

    shared.array = array
    shared._llmrs_guarded = True


def driver_gpu_count() -> int:
    """NVIDIA GPUs the CUDA driver reports, asked through ``libcuda`` itself so that
    ``numba.cuda`` is *not* imported (the simulator can still be chosen afterwards). 0 without a driver."""
    import ctypes

    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    return 0


def use_simulator_unless_gpu() -> bool:
    """Test processes and notebooks: run on the GPU when the driver has one, else in the simulator.

    Call before anything imports ``numba.cuda``: without a GPU, a process whose ``numba.cuda``
    was already imported for the real target gets :class:`CudaUnavailableError` (from
    :func:`enable_simulator`) rather than kernels that cannot launch. Returns True when the
    simulator is on.
    """
    if simulator_enabled():
        enable_simulator()
        return True
    if driver_gpu_count() > 0:
        return False
    enable_simulator()
    return True


def gpu_available() -> bool:
    """True when kernels would run on a real NVIDIA GPU (never under the simulator)."""
    if simulator_enabled():
        return False
    try:
        return bool(cuda().is_available())
    except CudaUnavailableError:
        return False


def require_cuda(what: str = "the cuda backend") -> ModuleType:
    """``numba.cuda`` when a GPU or the simulator can run kernels; otherwise one clear sentence."""
    numba_cuda = cuda()
    if simulator_enabled() or numba_cuda.is_available():
        return numba_cuda
    raise CudaUnavailableError(
        f"{what} needs an NVIDIA GPU with a working CUDA driver, and none was found. "
        f"On a GPU machine: {INSTALL_HINT}. Without one, set {SIMULATOR_ENV}=1 to run the same kernels "
        "in numba-cuda's CUDA simulator (slow: tiny models only)."
    )
