"""The backend interface: the operations the model's forward pass is made of.

Shapes: ``x [T, d]``; ``q [T, Hq, D]``, ``k, v [Tk, Hkv, D]``; weights are
whatever :meth:`Backend.load_matrix` returned for that backend (a float32
array for NumPy, packed quantised blocks for the optimised backends).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..sampling import Sampler, SamplingParams

if TYPE_CHECKING:
    from ..formats.gguf import GGUFFile


class Backend(ABC):
    """Operations of a Llama forward pass; one subclass per way of computing them."""

    name: str = "abstract"

    @abstractmethod
    def load_matrix(self, gguf: GGUFFile, name: str) -> Any:
        """Prepare weight matrix ``name`` ``[out, in]`` for :meth:`matmul` and :meth:`embed`."""

    def load_matrices(self, gguf: GGUFFile, names: list[str]) -> list[Any]:
        """Several matrices that always multiply the same input (Q, K and V; gate and up).

        A backend may store them as one matrix so that :meth:`matmul_many`
        makes one pass (one kernel launch) instead of several.
        """
        return [self.load_matrix(gguf, name) for name in names]

    def matmul_many(self, x: np.ndarray, ws: list[Any]) -> list[np.ndarray]:
        """``[x @ W.T for W in ws]`` for matrices loaded together by :meth:`load_matrices`."""
        return [self.matmul(x, w) for w in ws]

    #: "interleaved" (GGUF, llama.cpp) or "half" (Hugging Face layout): which dimensions RoPE pairs
    rope_layout: str = "interleaved"

    def load_vector(self, gguf: GGUFFile, name: str) -> np.ndarray:
        """A 1-D float32 weight (norm scales)."""
        from ..quant import load_float32

        return np.ascontiguousarray(load_float32(gguf, name), dtype=np.float32)

    @abstractmethod
    def embed(self, table: Any, ids: np.ndarray) -> np.ndarray:
        """Rows ``ids`` of the embedding table -> ``[T, d]`` float32."""

    @abstractmethod
    def matmul(self, x: np.ndarray, w: Any) -> np.ndarray:
        """``x [T, in] @ W.T -> [T, out]``."""

    @abstractmethod
    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray: ...

    @abstractmethod
    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def rope(self, x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
        """Rotary embedding of ``x [T, H, D]`` in the :attr:`rope_layout` convention."""

    @abstractmethod
    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """Causal GQA attention; queries are the last ``Tq`` of the ``Tk`` positions."""

    def sampler(self, params: SamplingParams) -> Callable[..., int]:
        """The token chooser for ``params`` (``sampler(logits, history) -> id``)."""
        return Sampler(params)

    def describe(self) -> str:
        return self.name
