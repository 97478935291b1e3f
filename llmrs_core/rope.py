"""Rotary position embeddings (introduced in chapter 3).

RoPE rotates each query and key vector, two dimensions at a time, by an
angle proportional to the token's position: pair ``i`` (of ``D/2``) turns by
``p * theta_i`` with ``theta_i = base ** (-2i / D)``. Because rotations
compose, ``q_m . k_n`` depends only on ``m - n``.

Two conventions pair the dimensions differently:

* **interleaved** (llama.cpp, GGUF files): pairs ``(2i, 2i+1)``;
* **half-split** (Hugging Face "rotate_half", safetensors): pairs ``(i, i + D/2)``.

They give the same attention scores once the rows of W_q and W_k are
permuted; llama.cpp's converter applies :func:`permute_for_interleaved` to
HF weights when it writes a GGUF, so a GGUF model needs the interleaved form.
Shapes: ``x`` is ``[T, H, D]`` (tokens, heads, head_dim); ``positions`` is ``[T]``.
"""

from __future__ import annotations

import numpy as np


def rope_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """``[head_dim / 2]`` angular frequencies ``theta ** (-2i / head_dim)``, float64."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
    return theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def rope_angles(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin`` of ``position * frequency``, each ``[T, head_dim / 2]`` float32.

    The angles are formed in float64 so that large positions keep their precision.
    """
    angles = np.outer(np.asarray(positions, dtype=np.float64), rope_frequencies(head_dim, theta))
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope_interleaved(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate pairs ``(2i, 2i+1)`` of ``x [T, H, D]`` (the llama.cpp / GGUF convention)."""
    cos, sin = rope_angles(positions, x.shape[-1], theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def apply_rope_half(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """Rotate pairs ``(i, i + D/2)`` of ``x [T, H, D]`` (the Hugging Face convention)."""
    half = x.shape[-1] // 2
    cos, sin = rope_angles(positions, x.shape[-1], theta)
    cos, sin = cos[:, None, :], sin[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


def permute_for_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Reorder the rows of an HF W_q / W_k ``[n_heads * D, in]`` for interleaved RoPE.

    Within each head, output row ``i`` of the first half goes to ``2i`` and row
    ``i`` of the second half to ``2i + 1`` (llama.cpp's ``convert_hf_to_gguf``
    ``permute``). :func:`unpermute_from_interleaved` undoes it.
    """
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, 2, d // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def unpermute_from_interleaved(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Inverse of :func:`permute_for_interleaved`: GGUF row order back to HF's."""
    rows, cols = w.shape
    d = rows // n_heads
    return w.reshape(n_heads, d // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)
