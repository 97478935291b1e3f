"""Chapter 3 — Attention Mechanisms Deep Dive: your exercises.

Exercise 3.6  Implementing Scaled Dot-Product Attention  (ch03_attention.ipynb, section 3.6)
Exercise 3.7  Implementing RoPE                          (ch03_attention.ipynb, section 3.7)

Check your work with ``make test-chapter 3`` (or ``make test-exercise E=3.6``).
Once they pass, ``llmrs generate --backend learner "..."`` runs SmolLM2 with
your attention and RoPE.

Shapes: T = tokens, H = heads, D = head_dim.
    q        [Tq, Hq, D]      queries (the newest Tq positions)
    k, v     [Tk, Hkv, D]     keys and values of all Tk positions so far
    Hq is a multiple of Hkv: grouped-query attention (SmolLM2: 9 and 3).
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "apply_rope_half",
    "apply_rope_interleaved",
    "causal_mask",
    "permute_for_interleaved",
    "rope_frequencies",
    "scaled_dot_product_attention",
    "softmax",
]


# -- Exercise 3.6: scaled dot-product attention ---------------------------------


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis``, numerically stable.

    Subtract the maximum along ``axis`` before ``np.exp`` so that large logits
    (1000, say) do not overflow to ``inf``. A slice that is entirely ``-inf``
    (everything masked) must give zeros, not NaN.
    """
    raise NotImplementedError(
        "Exercise 3.6 `softmax`: not implemented yet — see ch03_attention.ipynb §3.6"
    )


def causal_mask(tq: int, tk: int) -> np.ndarray:
    """``[tq, tk]`` booleans: True where query ``i`` may attend to key ``j``.

    The queries are the last ``tq`` of the ``tk`` positions, so query ``i``
    sits at position ``tk - tq + i`` and sees keys ``j <= tk - tq + i``.
    ``causal_mask(3, 3)`` is lower-triangular; ``causal_mask(1, 5)`` is all True.
    """
    raise NotImplementedError(
        "Exercise 3.6 `causal_mask`: not implemented yet — see ch03_attention.ipynb §3.6"
    )


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True
) -> np.ndarray:
    """``softmax(q k^T / sqrt(D) + mask) v`` for every query head. Returns ``[Tq, Hq, D]``.

    Query head ``h`` uses KV head ``h // (Hq // Hkv)`` (grouped-query
    attention). With ``causal``, apply :func:`causal_mask` (masked scores
    become ``-inf`` before the softmax). Raise ``ValueError`` if the shapes
    do not fit together (head_dim differs, Hq not a multiple of Hkv, more
    queries than keys).
    """
    raise NotImplementedError(
        "Exercise 3.6 `scaled_dot_product_attention`: not implemented yet — see ch03_attention.ipynb §3.6"
    )


# -- Exercise 3.7: rotary position embeddings -------------------------------------


def rope_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """``[head_dim // 2]`` frequencies ``theta ** (-2i / head_dim)`` for ``i = 0 .. head_dim/2 - 1``.

    Compute in float64. An odd ``head_dim`` raises ``ValueError``.
    """
    raise NotImplementedError(
        "Exercise 3.7 `rope_frequencies`: not implemented yet — see ch03_attention.ipynb §3.7"
    )


def apply_rope_interleaved(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate ``x [T, H, D]`` by position, pairing dimensions ``(2i, 2i + 1)`` (llama.cpp / GGUF).

    For token ``t`` at position ``p = positions[t]`` and pair ``i`` with
    angle ``a = p * rope_frequencies(D, theta)[i]``::

        out[2i]   = x[2i] * cos(a) - x[2i+1] * sin(a)
        out[2i+1] = x[2i] * sin(a) + x[2i+1] * cos(a)

    Form the angles in float64, return float32. Same shape as ``x``.
    """
    raise NotImplementedError(
        "Exercise 3.7 `apply_rope_interleaved`: not implemented yet — see ch03_attention.ipynb §3.7"
    )


def apply_rope_half(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """The same rotation, pairing dimension ``i`` with ``i + D/2`` (Hugging Face's "rotate_half")."""
    raise NotImplementedError(
        "Exercise 3.7 `apply_rope_half`: not implemented yet — see ch03_attention.ipynb §3.7"
    )


def permute_for_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder the rows of an HF ``W_q`` or ``W_k`` ``[n_heads * D, in]`` for interleaved RoPE.

    Within each head's ``D`` rows, row ``i`` of the first half moves to
    ``2i`` and row ``i`` of the second half to ``2i + 1``. With the permuted
    weights, interleaved RoPE gives the same attention scores as half-split
    RoPE with the original ones — this is what llama.cpp's converter does.
    """
    raise NotImplementedError(
        "Exercise 3.7 `permute_for_interleaved`: not implemented yet — see ch03_attention.ipynb §3.7"
    )
