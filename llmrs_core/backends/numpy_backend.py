"""The NumPy backend: the readable reference (chapter 4).

Weights are dequantised once, at load, to float32 matrices (SmolLM2: about
500 MiB); every operation is the plain NumPy function from ``layers``,
``rope`` and ``attention``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from .. import attention, layers, rope
from ..attention import PLAIN, AttentionOptions
from .base import Backend

if TYPE_CHECKING:
    from ..formats.source import WeightSource


class NumpyBackend(Backend):
    name = "numpy"

    def load_matrix(self, source: WeightSource, name: str) -> np.ndarray:
        return np.ascontiguousarray(source.float32(name), dtype=np.float32)

    def embed(self, table: np.ndarray, ids: np.ndarray) -> np.ndarray:
        return layers.embedding(ids, table)

    def matmul(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        return layers.linear(x, w)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return layers.rms_norm(x, weight, eps)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        return layers.swiglu(gate, up)

    def rope(self, x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
        if self.rope_layout == "half":
            return rope.apply_rope_half(x, positions, theta)
        return rope.apply_rope_interleaved(x, positions, theta)

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  options: AttentionOptions = PLAIN) -> np.ndarray:
        return attention.attention_with_options(q, k, v, causal=True, options=options)
