"""Compute backends: one interface, several implementations (chapter 4 onwards).

The model code (``llmrs_core.model``) is written once against
:class:`~llmrs_core.backends.base.Backend`. ``numpy`` is the readable
reference; ``numba`` (chapter 8) the fast CPU path; ``learner`` runs the
learner's own exercise code where it exists; CuPy (chapter 9) comes later.
"""

from .base import Backend
from .numpy_backend import NumpyBackend

BACKENDS = ("numba", "numpy", "learner")


def get_backend(name: str) -> Backend:
    """A backend by name; ``ValueError`` listing the names for an unknown one."""
    if name == "numpy":
        return NumpyBackend()
    if name == "numba":
        from .numba_backend import NumbaBackend

        return NumbaBackend()
    if name == "learner":
        from .learner import LearnerBackend

        return LearnerBackend()
    raise ValueError(f"unknown backend {name!r}; available: {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "NumpyBackend", "get_backend"]
