"""Fused dequantise-and-matvec on GGML blocks, in numba.cuda (chapter 9).

The weights stay packed on the device (:class:`DeviceMatrix`): Q4_1 as its 16 bytes of
nibbles per 32-weight block plus a scale ``d`` and minimum ``m`` per block, Q8_0 as its 32
int8 codes plus ``d``. A decode step multiplies straight from the codes, as the CPU
kernels do (``kernels.cpu.matmul``): for Q4_1, in block ``b`` of a row,
``w_b . x_b = d (q_b . x_b) + m sum(x_b)``.

Geometry: a thread block of ``lanes x rows_per_block`` threads; the ``lanes`` threads of
one row take every ``lanes``-th 32-weight block of it (neighbouring lanes read neighbouring
blocks: coalesced), and their partial sums meet in shared memory in a tree (no warp
shuffles: the simulator has none). ``grid = (row groups, tokens)``; the kernels stride over
rows and tokens, so a smaller grid is still right (:func:`geometry`). Shapes: ``x [T, K]``
float32, ``out [T, rows]`` float32.

Larger token counts (prefill) dequantise the matrix on the device
(:func:`dequantize_into`) and let the array module multiply (cuBLAS on a GPU).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...quant.dequant import fp16_field, split_blocks
from ...quant.types import GGMLType
from . import runtime
from .arrays import grid_1d, launch, limits, out_array, pow2_at_least, to_device, xp

cuda = runtime.cuda()

BLOCK = 32
MAX_LANES = 32  # threads that share one row
MAX_THREADS = 256  # threads of one thread block




def q4_1_matvec(qs, d, m, x, out):  # pragma: no cover - a kernel
    """``out[t, r] = sum_k w[r, k] x[t, k]`` for Q4_1 ``qs [rows, nb * 16]`` uint8, ``d, m [rows, nb]``."""
    partial = cuda.shared.array(MAX_THREADS, np.float32)
    lane, rb, lanes, per_block = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    slot = rb * lanes + lane
    for t in range(cuda.blockIdx.y, x.shape[0], cuda.gridDim.y):
        # every thread of the block takes the same trips through this loop: the barriers match
        for first in range(cuda.blockIdx.x * per_block, qs.shape[0], cuda.gridDim.x * per_block):
            row = first + rb
            acc = np.float32(0)
            if row < qs.shape[0]:
                for b in range(lane, d.shape[1], lanes):
                    dot = np.float32(0)
                    total = np.float32(0)
                    for j in range(16):
                        byte = np.int32(qs[row, 16 * b + j])  # explicit: uint8 arithmetic differs in the simulator
                        x_lo = x[t, BLOCK * b + j]
                        x_hi = x[t, BLOCK * b + 16 + j]
                        dot += np.float32(byte & 15) * x_lo + np.float32(byte >> 4) * x_hi
                        total += x_lo + x_hi
                    acc += d[row, b] * dot + m[row, b] * total
            partial[slot] = acc
            cuda.syncthreads()
            # tree-sum this row's lanes, written out in each kernel: a device function (cuda.jit(device=True)
            # or register_jitable) would need a GPU to compile, since numba-cuda 0.30 asks the current
            # device for its compute capability when it compiles one, and compile_check has no device
            stride = lanes // 2
            while stride > 0:
                if lane < stride:
                    partial[slot] += partial[slot + stride]
                cuda.syncthreads()
                stride //= 2
            if lane == 0 and row < qs.shape[0]:
                out[t, row] = partial[slot]
            cuda.syncthreads()  # the next trip overwrites partial


def q8_0_matvec(qs, d, x, out):  # pragma: no cover - a kernel
    """``out[t, r] = sum_k w[r, k] x[t, k]`` for Q8_0 ``qs [rows, nb * 32]`` int8, ``d [rows, nb]``."""
    partial = cuda.shared.array(MAX_THREADS, np.float32)
    lane, rb, lanes, per_block = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    slot = rb * lanes + lane
    for t in range(cuda.blockIdx.y, x.shape[0], cuda.gridDim.y):
        for first in range(cuda.blockIdx.x * per_block, qs.shape[0], cuda.gridDim.x * per_block):
            row = first + rb
            acc = np.float32(0)
            if row < qs.shape[0]:
                for b in range(lane, d.shape[1], lanes):
                    dot = np.float32(0)
                    for j in range(BLOCK):
                        dot += np.float32(np.int32(qs[row, BLOCK * b + j])) * x[t, BLOCK * b + j]
                    acc += d[row, b] * dot
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


def f32_matvec(w, x, out):  # pragma: no cover - a kernel
    """``out[t, r] = sum_k w[r, k] x[t, k]`` for a float32 ``w [rows, K]`` (types without a packed kernel)."""
    partial = cuda.shared.array(MAX_THREADS, np.float32)
    lane, rb, lanes, per_block = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockDim.x, cuda.blockDim.y
    slot = rb * lanes + lane
    for t in range(cuda.blockIdx.y, x.shape[0], cuda.gridDim.y):
        for first in range(cuda.blockIdx.x * per_block, w.shape[0], cuda.gridDim.x * per_block):
            row = first + rb
            acc = np.float32(0)
            if row < w.shape[0]:
                for k in range(lane, w.shape[1], lanes):
                    acc += w[row, k] * x[t, k]
            partial[slot] = acc
            cuda.syncthreads()
            stride = lanes // 2
            while stride > 0:
                if lane < stride:
                    partial[slot] += partial[slot + stride]
                cuda.syncthreads()
                stride //= 2
            if lane == 0 and row < w.shape[0]:
                out[t, row] = partial[slot]
            cuda.syncthreads()


def q4_1_dequantize(qs, d, m, out):  # pragma: no cover - a kernel
    """``out [rows, K]`` float32 from Q4_1 blocks; one thread per byte, grid-stride."""
    n = qs.shape[0] * qs.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        row, col = i // qs.shape[1], i % qs.shape[1]
        b, j = col // 16, col % 16
        byte = np.int32(qs[row, col])
        out[row, BLOCK * b + j] = d[row, b] * np.float32(byte & 15) + m[row, b]
        out[row, BLOCK * b + 16 + j] = d[row, b] * np.float32(byte >> 4) + m[row, b]


def q8_0_dequantize(qs, d, out):  # pragma: no cover - a kernel
    """``out [rows, K]`` float32 from Q8_0 blocks; one thread per code, grid-stride."""
    n = qs.shape[0] * qs.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        row, col = i // qs.shape[1], i % qs.shape[1]
        out[row, col] = d[row, col // BLOCK] * np.float32(np.int32(qs[row, col]))


def gather_rows(table, ids, out):  # pragma: no cover - a kernel
    """``out[i, :] = table[ids[i], :]`` (float32 tables: embeddings of other types)."""
    n = out.shape[0] * out.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r, c = i // out.shape[1], i % out.shape[1]
        out[r, c] = table[ids[r], c]


def q4_1_embed(qs, d, m, ids, out):  # pragma: no cover - a kernel
    """Rows ``ids`` of a Q4_1 table, dequantised: ``out [T, K]``."""
    n = out.shape[0] * qs.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r, col = i // qs.shape[1], i % qs.shape[1]
        row = ids[r]
        b, j = col // 16, col % 16
        byte = np.int32(qs[row, col])
        out[r, BLOCK * b + j] = d[row, b] * np.float32(byte & 15) + m[row, b]
        out[r, BLOCK * b + 16 + j] = d[row, b] * np.float32(byte >> 4) + m[row, b]


def q8_0_embed(qs, d, ids, out):  # pragma: no cover - a kernel
    """Rows ``ids`` of a Q8_0 table, dequantised: ``out [T, K]``."""
    n = out.shape[0] * qs.shape[1]
    for i in range(cuda.grid(1), n, cuda.gridsize(1)):
        r, col = i // qs.shape[1], i % qs.shape[1]
        out[r, col] = d[ids[r], col // BLOCK] * np.float32(np.int32(qs[ids[r], col]))


q4_1_matvec_kernel = cuda.jit(q4_1_matvec)
q8_0_matvec_kernel = cuda.jit(q8_0_matvec)
f32_matvec_kernel = cuda.jit(f32_matvec)
q4_1_dequantize_kernel = cuda.jit(q4_1_dequantize)
q8_0_dequantize_kernel = cuda.jit(q8_0_dequantize)
gather_rows_kernel = cuda.jit(gather_rows)
q4_1_embed_kernel = cuda.jit(q4_1_embed)
q8_0_embed_kernel = cuda.jit(q8_0_embed)


@dataclass
class DeviceMatrix:
    """A weight matrix ``[rows, cols]`` on the device, packed as its kernel reads it.

    ``kind`` is ``"q4_1"`` (``qs`` uint8 ``[rows, cols / 2]``, ``d``, ``m`` float32
    ``[rows, cols / 32]``), ``"q8_0"`` (``qs`` int8 ``[rows, cols]``, ``d``) or ``"f32"``
    (``qs`` float32 ``[rows, cols]``; every other ggml type, dequantised at load).
    """

    kind: str
    rows: int
    cols: int
    qs: Any
    d: Any = None
    m: Any = None
    #: the stacked matrix this one is rows ``first_row ..`` of (:func:`stack`), or None
    fused: DeviceMatrix | None = None
    first_row: int = 0

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (self.qs, self.d, self.m) if a is not None)


def stack(parts: list[DeviceMatrix]) -> list[DeviceMatrix] | None:
    """Matrices that multiply the same input (Q, K, V; gate, up) as row ranges of one stacked
    matrix, so that one launch computes them all; None when their kinds or widths differ.

    Each returned part is a view of its rows of the stack (row slices of C-contiguous arrays
    stay C-contiguous, as the kernels need) and remembers it in ``fused``.
    """
    if len({p.kind for p in parts}) != 1 or len({p.cols for p in parts}) != 1:
        return None
    a, head = xp(), parts[0]
    d = a.concatenate([p.d for p in parts]) if head.d is not None else None
    m = a.concatenate([p.m for p in parts]) if head.m is not None else None
    whole = DeviceMatrix(head.kind, sum(p.rows for p in parts), head.cols, a.concatenate([p.qs for p in parts]), d, m)
    views, first = [], 0
    for p in parts:
        rows = slice(first, first + p.rows)
        views.append(DeviceMatrix(p.kind, p.rows, p.cols, whole.qs[rows],
                                  None if whole.d is None else whole.d[rows],
                                  None if whole.m is None else whole.m[rows], fused=whole, first_row=first))
        first += p.rows
    return views


def pack(raw: np.ndarray | None, ggml_type: GGMLType | None, shape: tuple[int, int],
         dense: np.ndarray | None = None) -> DeviceMatrix:
    """A :class:`DeviceMatrix` from a tensor's stored bytes (Q4_1, Q8_0), or from ``dense``
    float32 ``[rows, cols]`` for any other type."""
    rows, cols = shape
    if raw is not None and ggml_type in (GGMLType.Q4_1, GGMLType.Q8_0):
        if cols % BLOCK:
            raise ValueError(f"a {ggml_type.name} row holds whole blocks of {BLOCK}; got {cols} columns")
        blocks = split_blocks(raw, ggml_type)
        if blocks.shape[0] != rows * cols // BLOCK:
            raise ValueError(f"a [{rows}, {cols}] {ggml_type.name} matrix has {rows * cols // BLOCK} blocks; "
                             f"got {blocks.shape[0]} (truncated or mislabelled?)")
        d = fp16_field(blocks, 0).reshape(rows, -1)
        if ggml_type is GGMLType.Q4_1:
            m = fp16_field(blocks, 2).reshape(rows, -1)
            return DeviceMatrix("q4_1", rows, cols, to_device(blocks[:, 4:].reshape(rows, -1)),
                                to_device(d), to_device(m))
        codes = blocks[:, 2:].view(np.int8).reshape(rows, -1)
        return DeviceMatrix("q8_0", rows, cols, to_device(codes), to_device(d))
    if dense is None:
        kind = "float" if ggml_type is None else ggml_type.name
        raise ValueError(f"a {kind} matrix needs its float32 values to be packed (only Q4_1 and Q8_0 stay in blocks)")
    return DeviceMatrix("f32", rows, cols, to_device(dense, np.float32))


def geometry(n_items: int, rows: int, tokens: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(grid, block)`` of a matvec launch. ``block = (lanes, rows per block)``: a power of two
    of lanes per row, no more than the row has items to share (32-weight blocks; idle lanes
    would only wait); ``grid = (row groups, tokens)`` within :func:`arrays.limits` (the
    kernels' loops take whatever the grid does not cover)."""
    max_threads, max_blocks = limits()
    lanes = pow2_at_least(n_items, min(MAX_LANES, max_threads))
    per_block = max(1, min(max_threads // lanes, rows))
    grid_y = min(tokens, max_blocks)
    grid_x = max(1, min(-(-rows // per_block), max_blocks // grid_y))
    return (grid_x, grid_y), (lanes, per_block)


def matvec(x: Any, w: DeviceMatrix, out: Any | None = None) -> Any:
    """``x [T, cols] @ W.T -> [T, rows]`` with the fused kernel of ``w.kind``; one thread
    block row of the grid per token."""
    x = xp().ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] != w.cols:
        raise ValueError(f"x must be [T, {w.cols}] for a [{w.rows}, {w.cols}] matrix; got {tuple(x.shape)}")
    out = out_array(out, (x.shape[0], w.rows))
    grid, block = geometry(w.cols // BLOCK if w.kind != "f32" else w.cols, w.rows, x.shape[0])
    if w.kind == "q4_1":
        launch(q4_1_matvec_kernel, grid, block, w.qs, w.d, w.m, x, out)
    elif w.kind == "q8_0":
        launch(q8_0_matvec_kernel, grid, block, w.qs, w.d, x, out)
    else:
        launch(f32_matvec_kernel, grid, block, w.qs, x, out)
    return out


def dequantize_into(w: DeviceMatrix, out: Any | None = None) -> Any:
    """``W`` as float32 ``[rows, cols]`` on the device (for prefill's GEMM)."""
    if w.kind == "f32":
        return w.qs
    if out is None:
        out = xp().empty((w.rows, w.cols), np.float32)
    blocks, threads = grid_1d(int(w.qs.size))
    if w.kind == "q4_1":
        launch(q4_1_dequantize_kernel, blocks, threads, w.qs, w.d, w.m, out)
    else:
        launch(q8_0_dequantize_kernel, blocks, threads, w.qs, w.d, out)
    return out


def embed(w: DeviceMatrix, ids: Any, out: Any | None = None) -> Any:
    """Rows ``ids [T]`` of the table ``w`` as float32 ``[T, cols]``."""
    ids = xp().ascontiguousarray(xp().asarray(ids, dtype=np.int64).reshape(-1))
    if out is None:
        out = xp().empty((ids.size, w.cols), np.float32)
    blocks, threads = grid_1d(int(ids.size * w.qs.shape[1]))
    if w.kind == "q4_1":
        launch(q4_1_embed_kernel, blocks, threads, w.qs, w.d, w.m, ids, out)
    elif w.kind == "q8_0":
        launch(q8_0_embed_kernel, blocks, threads, w.qs, w.d, ids, out)
    else:
        launch(gather_rows_kernel, blocks, threads, w.qs, ids, out)
    return out


#: (name, Python function, signatures) of every kernel here, for ``compile_check``
KERNELS = [
    ("q4_1_matvec", q4_1_matvec, ["void(uint8[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1])"]),
    ("q8_0_matvec", q8_0_matvec, ["void(int8[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1])"]),
    ("f32_matvec", f32_matvec, ["void(float32[:, ::1], float32[:, ::1], float32[:, ::1])"]),
    ("q4_1_dequantize", q4_1_dequantize, ["void(uint8[:, ::1], float32[:, ::1], float32[:, ::1], float32[:, ::1])"]),
    ("q8_0_dequantize", q8_0_dequantize, ["void(int8[:, ::1], float32[:, ::1], float32[:, ::1])"]),
    ("gather_rows", gather_rows, ["void(float32[:, ::1], int64[::1], float32[:, ::1])"]),
    ("q4_1_embed", q4_1_embed, ["void(uint8[:, ::1], float32[:, ::1], float32[:, ::1], int64[::1], float32[:, ::1])"]),
    ("q8_0_embed", q8_0_embed, ["void(int8[:, ::1], float32[:, ::1], int64[::1], float32[:, ::1])"]),
]

__all__ = ["DeviceMatrix", "KERNELS", "dequantize_into", "embed", "geometry", "matvec", "pack", "stack"]
