"""RMSNorm, RoPE, SwiGLU and the residual add as numba.cuda kernels (chapter 9).

The references are ``llmrs_core.layers`` and ``llmrs_core.rope``. RMSNorm needs a
reduction over the row, so it takes one thread block per row and sums the squares
in shared memory (a tree, as in ``matvec``); the others are one thread per element in
grid-stride loops, so that any launch covers any size. RoPE's cosines and sines are
formed on the host from positions in float64 (``rope.rope_angles``), as the reference does,
and copied over: ``[T, D/2]`` numbers per step.

Shapes: ``x [T, d]``; RoPE's ``x [T, H, D]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...rope import rope_angles
from . import runtime
from .arrays import grid_1d, launch, limits, out_array, pow2_at_least, to_device, xp

cuda = runtime.cuda()

MAX_THREADS = 256


def rms_norm(x, weight, eps, out):  # pragma: no cover - a kernel
    """``out[r] = x[r] / sqrt(mean(x[r]**2) + eps) * weight``; a block per row (striding over rows)."""
    partial = cuda.shared.array(MAX_THREADS, np.float32)
    tid, n = cuda.threadIdx.x, cuda.blockDim.x
    for r in range(cuda.blockIdx.x, x.shape[0], cuda.gridDim.x):
        acc = np.float32(0)
        for k in range(tid, x.shape[1], n):
            acc += x[r, k] * x[r, k]
        partial[tid] = acc
        cuda.syncthreads()
        stride = n // 2
        while stride > 0:
            if tid < stride:
                partial[tid] += partial[tid + stride]
            cuda.syncthreads()
            stride //= 2
        inv = np.float32(1) / math.sqrt(partial[0] / np.float32(x.shape[1]) + eps)
        for k in range(tid, x.shape[1], n):
            out[r, k] = x[r, k] * inv * weight[k]
        cuda.syncthreads()  # partial[0] is read above before the next row overwrites it


def rope(x, cos, sin, interleaved, out):  # pragma: no cover - a kernel
    """Rotate the pairs of ``x [T, H, D]`` by ``cos, sin [T, D/2]``: pairs ``(2i, 2i+1)`` when
    ``interleaved`` (GGUF), else ``(i, i + D/2)`` (Hugging Face)."""
    half = x.shape[2] // 2
    n = x.shape[0] * x.shape[1] * half
    for g in range(cuda.grid(1), n, cuda.gridsize(1)):
        t = g // (x.shape[1] * half)
        h = (g // half) % x.shape[1]
        i = g % half
        if interleaved:
            a, b = 2 * i, 2 * i + 1
        else:
            a, b = i, i + half
        x0, x1 = x[t, h, a], x[t, h, b]
        out[t, h, a] = x0 * cos[t, i] - x1 * sin[t, i]
        out[t, h, b] = x0 * sin[t, i] + x1 * cos[t, i]


def swiglu(gate, up, out):  # pragma: no cover - a kernel
    """``out = silu(gate) * up`` elementwise, with SiLU written through tanh (no ``exp`` overflow)."""
    n = out.shape[0] * out.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r, c = i // out.shape[1], i % out.shape[1]
        g = gate[r, c]
        out[r, c] = g * (np.float32(0.5) * (np.float32(1) + math.tanh(np.float32(0.5) * g))) * up[r, c]


def add(a, b, out):  # pragma: no cover - a kernel
    """``out = a + b`` elementwise (the residual connection)."""
    n = out.shape[0] * out.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r, c = i // out.shape[1], i % out.shape[1]
        out[r, c] = a[r, c] + b[r, c]


rms_norm_kernel = cuda.jit(rms_norm)
rope_kernel = cuda.jit(rope)
swiglu_kernel = cuda.jit(swiglu)
add_kernel = cuda.jit(add)


def _f32(a: Any) -> Any:
    return xp().ascontiguousarray(a, dtype=np.float32)


def rms_norm_rows(x: Any, weight: Any, eps: float, out: Any = None) -> Any:
    """RMSNorm of every row of ``x [T, d]`` (as ``layers.rms_norm``)."""
    x = _f32(x)
    if x.ndim != 2 or weight.shape != (x.shape[1],):
        raise ValueError(f"x must be [T, d] and weight [d]; got {tuple(x.shape)}, {tuple(weight.shape)}")
    out = out_array(out, x.shape)
    max_threads, max_blocks = limits()
    launch(rms_norm_kernel, min(x.shape[0], max_blocks), pow2_at_least(x.shape[1], max_threads),
           x, _f32(weight), np.float32(eps), out)
    return out


def rope_rotate(x: Any, positions: np.ndarray, theta: float, interleaved: bool = True, out: Any = None) -> Any:
    """RoPE of ``x [T, H, D]`` at ``positions [T]`` (as ``rope.apply_rope_interleaved`` / ``_half``)."""
    x = _f32(x)
    positions = np.asarray(positions).reshape(-1)
    if x.ndim != 3 or positions.size != x.shape[0]:
        raise ValueError(f"x must be [T, H, D] with one position per token; got {tuple(x.shape)}, {positions.size}")
    cos, sin = rope_angles(positions, x.shape[-1], theta)
    out = out_array(out, x.shape)
    blocks, threads = grid_1d(x.size // 2)
    launch(rope_kernel, blocks, threads, x, to_device(cos), to_device(sin), bool(interleaved), out)
    return out


def _pairwise(kernel: Any, a: Any, b: Any, out: Any, names: str) -> Any:
    """``kernel(a, b, out)``, one thread per element, for two float32 arrays of one ``[T, n]`` shape."""
    a, b = _f32(a), _f32(b)
    if a.shape != b.shape or a.ndim != 2:
        raise ValueError(f"{names} must be the same [T, n]; got {tuple(a.shape)}, {tuple(b.shape)}")
    out = out_array(out, a.shape)
    blocks, threads = grid_1d(a.size)
    launch(kernel, blocks, threads, a, b, out)
    return out


def swiglu_rows(gate: Any, up: Any, out: Any = None) -> Any:
    """``silu(gate) * up`` for ``gate, up [T, f]`` (as ``layers.swiglu``)."""
    return _pairwise(swiglu_kernel, gate, up, out, "gate and up")


def add_rows(a: Any, b: Any, out: Any = None) -> Any:
    """``a + b`` for ``a, b [T, d]`` (the residual connection)."""
    return _pairwise(add_kernel, a, b, out, "the two terms of a sum")


KERNELS = [
    ("rms_norm", rms_norm, ["void(float32[:, ::1], float32[::1], float32, float32[:, ::1])"]),
    ("rope", rope, ["void(float32[:, :, ::1], float32[:, ::1], float32[:, ::1], boolean, float32[:, :, ::1])"]),
    ("swiglu", swiglu, ["void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"]),
    ("add", add, ["void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"]),
]

__all__ = ["KERNELS", "add_rows", "rms_norm_rows", "rope_rotate", "swiglu_rows"]
