"""The int8 form of the Q4_1 matvec, llama.cpp's way (``vecdotq.cuh``): quantise the activations (chapter 9).

llama.cpp does not multiply 4-bit weights by float activations. It first quantises ``x`` to
Q8_1 — per 32 values a scale ``d_x = max|x| / 127``, int8 codes ``q_x``, and ``s_x = d_x sum(q_x)``
— and then, per block, takes an **integer** dot product of the 4-bit and 8-bit codes (four
byte products per ``dp4a`` instruction)::

    w_b . x_b  ~  d_w d_x (q_w . q_x) + m_w s_x

Integer products are cheaper than float ones and the activations shrink four-fold, at the
cost of rounding ``x`` to 8 bits (a relative error of about 1/254 per block). numba-cuda 0.30
has no ``dp4a`` intrinsic (nor does its simulator), so here the integer dot product is written
as int32 multiply-adds; whether this beats the float kernel of :mod:`.matvec` is a question
for a GPU (``make gpu-check`` times both). The backend uses the float kernel.

Shapes: ``x [T, K]`` float32; ``xq [T, K]`` int8, ``xd, xs [T, K / 32]`` float32; weights as
:class:`~.matvec.DeviceMatrix` ``"q4_1"``; ``out [T, rows]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import runtime
from .arrays import grid_1d, launch, out_array, xp
from .matvec import BLOCK, MAX_THREADS, DeviceMatrix, geometry

cuda = runtime.cuda()


def quantize_q8_1(x, xq, xd, xs):  # pragma: no cover - a kernel
    """Q8_1 of every 32 values of ``x [T, K]``: one thread per block of 32, grid-stride.
    ``d = max|x| / 127``; ``q = round(x / d)`` halves away from zero (ggml's ``roundf``)."""
    nb = xd.shape[1]
    for g in range(cuda.grid(1), x.shape[0] * nb, cuda.gridsize(1)):
        t, b = g // nb, g % nb
        amax = np.float32(0)
        for j in range(BLOCK):
            amax = max(amax, abs(x[t, BLOCK * b + j]))
        d = amax / np.float32(127)
        inv = np.float32(1) / d if d > 0 else np.float32(0)
        total = 0
        for j in range(BLOCK):
            v = x[t, BLOCK * b + j] * inv
            q = np.int32(math.floor(abs(v) + np.float32(0.5)))
            if v < 0:
                q = -q
            xq[t, BLOCK * b + j] = q
            total += q
        xd[t, b] = d
        xs[t, b] = d * np.float32(total)


def q4_1_q8_1_matvec(qs, d, m, xq, xd, xs, out):  # pragma: no cover - a kernel
    """``out[t, r] = sum_b d[r, b] xd[t, b] (q_w . q_x) + m[r, b] xs[t, b]``, integer dot products per block."""
    partial = cuda.shared.array(MAX_THREADS, np.float32)
    lane, rb, lanes, per_block = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    slot = rb * lanes + lane
    for t in range(cuda.blockIdx.y, xq.shape[0], cuda.gridDim.y):
        for first in range(cuda.blockIdx.x * per_block, qs.shape[0], cuda.gridDim.x * per_block):
            row = first + rb
            acc = np.float32(0)
            if row < qs.shape[0]:
                for b in range(lane, d.shape[1], lanes):
                    isum = np.int32(0)
                    for j in range(16):
                        byte = np.int32(qs[row, 16 * b + j])
                        isum += (byte & 15) * np.int32(xq[t, BLOCK * b + j]) + (byte >> 4) * np.int32(
                            xq[t, BLOCK * b + 16 + j])
                    acc += d[row, b] * xd[t, b] * np.float32(isum) + m[row, b] * xs[t, b]
            partial[slot] = acc
            cuda.syncthreads()
            stride = lanes // 2
            while stride > 0:
                if lane < stride:
                    partial[slot] += partial[slot + stride]
                cuda.syncthreads()
                stride //= 2
            if lane == 0 and row < qs.shape[0]:
                out[t, row] = partial[slot]
            cuda.syncthreads()


quantize_q8_1_kernel = cuda.jit(quantize_q8_1)
q4_1_q8_1_matvec_kernel = cuda.jit(q4_1_q8_1_matvec)


def quantize_activations(x: Any) -> tuple[Any, Any, Any]:
    """``(xq, xd, xs)``: the Q8_1 form of ``x [T, K]`` (K a multiple of 32)."""
    x = xp().ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % BLOCK:
        raise ValueError(f"x must be [T, K] with K a multiple of {BLOCK}; got {tuple(x.shape)}")
    t, k = x.shape
    xq, xd, xs = xp().empty((t, k), np.int8), xp().empty((t, k // BLOCK), np.float32), xp().empty((t, k // BLOCK), np.float32)
    blocks, threads = grid_1d(t * k // BLOCK)
    launch(quantize_q8_1_kernel, blocks, threads, x, xq, xd, xs)
    return xq, xd, xs


def matvec_int8(x: Any, w: DeviceMatrix, out: Any | None = None) -> Any:
    """``x [T, cols] @ W.T`` for a Q4_1 ``w``, with ``x`` quantised to Q8_1 first."""
    if w.kind != "q4_1":
        raise ValueError(f"the int8 kernel reads Q4_1 weights; this matrix is {w.kind}")
    xq, xd, xs = quantize_activations(x)
    if xq.shape[1] != w.cols:
        raise ValueError(f"x must be [T, {w.cols}] for a [{w.rows}, {w.cols}] matrix; got {tuple(xq.shape)}")
    out = out_array(out, (xq.shape[0], w.rows))
    grid, block = geometry(w.cols // BLOCK, w.rows, xq.shape[0])
    launch(q4_1_q8_1_matvec_kernel, grid, block, w.qs, w.d, w.m, xq, xd, xs, out)
    return out


KERNELS = [
    ("quantize_q8_1", quantize_q8_1, ["void(float32[:, ::1], int8[:, ::1], float32[:, ::1], float32[:, ::1])"]),
    ("q4_1_q8_1_matvec", q4_1_q8_1_matvec, [
        "void(uint8[:, ::1], float32[:, ::1], float32[:, ::1], int8[:, ::1], float32[:, ::1], float32[:, ::1], "
        "float32[:, ::1])"
    ]),
]

__all__ = ["KERNELS", "matvec_int8", "quantize_activations"]
