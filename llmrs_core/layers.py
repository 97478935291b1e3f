"""The layers of a Llama block, in plain NumPy (introduced in chapter 4).

These are the readable reference implementations that the NumPy backend
runs and that faster backends (chapters 8, 9) are checked against. Shapes:
``x`` is ``[T, d]`` (tokens, features); a weight matrix is
``[out_features, in_features]`` (NumPy order, like PyTorch's
``nn.Linear.weight``), so a linear layer computes ``x @ W.T``.
"""

from __future__ import annotations

import numpy as np


def linear(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``x [T, in] @ w[out, in].T -> [T, out]`` (no bias: Llama has none)."""
    return x @ w.T


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm: ``x / sqrt(mean(x**2) + eps) * weight`` over the last axis, in float32."""
    x = x.astype(np.float32, copy=False)
    inv_rms = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(eps))
    return (x * inv_rms * weight).astype(np.float32, copy=False)


def silu(x: np.ndarray) -> np.ndarray:
    """SiLU (swish): ``x * sigmoid(x)``, written with tanh so that no ``exp`` overflows."""
    return x * (0.5 * (1.0 + np.tanh(0.5 * x)))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """The gated activation of Llama's MLP: ``silu(gate) * up``."""
    return silu(gate) * up


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (Gemma's ``gelu_pytorch_tanh``):
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
    c = np.float32(np.sqrt(2.0 / np.pi))
    return np.float32(0.5) * x * (np.float32(1.0) + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def geglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Gemma's gated activation (appendix B): ``gelu_tanh(gate) * up``."""
    return gelu_tanh(gate) * up


def mlp(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray) -> np.ndarray:
    """SwiGLU MLP: ``W_down (silu(W_gate x) * W_up x)``; ``[T, d] -> [T, d]``."""
    return linear(swiglu(linear(x, w_gate), linear(x, w_up)), w_down)


def embedding(ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Rows ``ids`` of the embedding table ``[vocab, d]`` -> ``[T, d]`` float32."""
    return np.asarray(table[np.asarray(ids)], dtype=np.float32)
