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

from dataclasses import dataclass, field

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


# -- the families' RoPE (appendix B) ---------------------------------------------


def angles_from_frequencies(positions: np.ndarray, freqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cos, sin [T, len(freqs)]`` float32 of ``position * freqs``, formed in float64."""
    angles = np.outer(np.asarray(positions, dtype=np.float64), freqs)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope_frequencies(x: np.ndarray, positions: np.ndarray, freqs: np.ndarray, layout: str) -> np.ndarray:
    """Rotate ``x [T, H, 2 * len(freqs)]`` by ``position * freqs`` in ``layout`` ("interleaved" or
    "half"): :func:`apply_rope_interleaved` / :func:`apply_rope_half` with frequencies of any origin."""
    cos, sin = angles_from_frequencies(positions, freqs)
    cos, sin = cos[:, None, :], sin[:, None, :]
    if layout == "interleaved":
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=-1)


@dataclass(frozen=True, eq=False)
class Rotary:
    """One layer's RoPE: which dimensions turn, and how fast (the families' variants).

    ``dims``: the first ``dims`` of each head rotate; the rest pass through (partial rotary,
    Phi-4-mini). Pair ``i`` turns at ``theta ** (-2i / dims) / (scale * factors[i])``:
    ``scale`` is linear scaling, ``factors`` ``[dims / 2]`` Llama 3's ``rope_freqs`` or
    Phi-3's longrope factors (None: all ones). ``mscale`` multiplies cos and sin (longrope's
    attention factor). ``long``: longrope's rotary for sequences longer than ``original``
    positions (None: one rotary for every length). Llama's RoPE is ``Rotary(theta, head_dim)``,
    which :attr:`plain` says, and which the backends' chapter-3 ``rope(x, positions, theta)`` runs.
    """

    theta: float
    dims: int
    scale: float = 1.0
    factors: np.ndarray | None = None
    mscale: float = 1.0
    long: Rotary | None = None
    original: int = 0
    freqs: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        freqs = rope_frequencies(self.dims, self.theta) / self.scale
        if self.factors is not None:
            freqs = freqs / np.asarray(self.factors, dtype=np.float64)
        object.__setattr__(self, "freqs", freqs)

    @property
    def plain(self) -> bool:
        """No scaling, no factors, no multiplier: the chapter-3 RoPE of base ``theta``."""
        return self.scale == 1.0 and self.factors is None and self.mscale == 1.0 and self.long is None
