"""Compute backends: one interface, several implementations (chapter 4 onwards).

The model code (``llmrs_core.model``) is written once against
:class:`~llmrs_core.backends.base.Backend`. ``numpy`` is the readable
reference; ``numba`` (chapter 8) the fast CPU path; ``learner`` (the workbook's,
:mod:`llmrs_core.workbook.learner`) runs the learner's own exercise code where it exists; ``cuda`` (chapter 9) runs the numba.cuda
kernels on an NVIDIA GPU (or in numba-cuda's CUDA simulator, when enabled).
"""

from .base import Backend
from .numpy_backend import NumpyBackend

BACKENDS = ("numba", "numpy", "learner", "cuda")
#: what ``llmrs.load()`` and the CLI use unless told otherwise: the fast CPU path (chapter 8)
DEFAULT_BACKEND = "numba"


def get_backend(name: str | None = None, threads: int | None = None, exact: bool = False) -> Backend:
    """A backend by name (None: :data:`DEFAULT_BACKEND`); ``ValueError`` listing the names for an unknown one.

    ``threads`` sets the Numba backend's thread count (default: every core
    Numba may use). The NumPy backends multiply with BLAS, whose threads are
    set by ``OPENBLAS_NUM_THREADS`` or ``threadpoolctl``. The Numba backend decodes
    with 8-bit activations and integer dot products, llama.cpp's arithmetic
    (``kernels.cpu.int8``), where the CPU has AVX2; ``exact=True`` keeps it on the float
    kernels, which agree with the NumPy backend to float32 rounding. The other backends
    compute in float32 already, and ignore it.
    """
    name = DEFAULT_BACKEND if name is None else name
    if threads is not None and name == "cuda":
        raise ValueError("threads= sets the numba backend's threads; the cuda backend computes on the GPU")
    if threads is not None and name != "numba":
        raise ValueError(
            f"threads= sets the numba backend's threads; the {name} backend multiplies with BLAS, "
            "whose threads are set by OPENBLAS_NUM_THREADS (or threadpoolctl)"
        )
    if name == "numpy":
        return NumpyBackend()
    if name == "numba":
        try:
            from .numba_backend import NumbaBackend
        except ImportError as e:  # pragma: no cover - numba is a dependency
            raise ValueError(
                f"the numba backend needs Numba ({e}); `pip install numba`, or use backend='numpy'"
            ) from None
        return NumbaBackend(threads, exact=exact)
    if name == "learner":
        from ..workbook.learner import LearnerBackend  # the workbook's plug: the learner's code

        return LearnerBackend()
    if name == "cuda":
        from ..kernels.gpu.runtime import CudaUnavailableError
        from .cuda_backend import CudaBackend

        try:
            return CudaBackend()
        except CudaUnavailableError as e:  # a choice the caller can change, like an unknown name
            raise ValueError(str(e)) from None
    raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "Backend", "NumpyBackend", "get_backend"]
