"""The Numba backend: quantised weights, fused kernels, parallel loops (chapter 8).

Weights stay quantised in memory (SmolLM2: about 110 MB instead of the NumPy backend's 540 MB of
float32), repacked once at load into the layout of ``llmrs_core.kernels.cpu.packing``. A decode step
multiplies straight from the 4- and 8-bit codes (``kernels.cpu.matmul``); prompt processing dequantises
a band of rows at a time and lets BLAS multiply; the small operations are ``kernels.cpu.ops``.

Int8 path (default with AVX2, ``int8.int8_unavailable``): llama.cpp's int8 arithmetic
(``kernels.cpu.int8``) from an int8 copy of each quantised matrix, the only copy kept (the packed
arrays are freed; an embedding's rows are dequantised from the file's bytes). It agrees with
llama.cpp (top-5 rule), not with NumPy; ``exact=True`` (``--exact``) keeps the float kernels, which do.
Decode steps run in one compiled call with the loop's bits (``backends.numba_decode``; ``LLMRS_COMPILED_DECODE=0``: the loop).

Batch invariance, the int8 path's contract: a token's numbers depend only on its own
sequence and position, never on the step that computes them: every kernel computes each row
(each query) alone, so a request gives the same greedy tokens cold or through the prefix
cache, alone or batched, in one prefill or in chunks, before or after a preemption
(tests/core/test_batch_invariance.py); F32/F16/BF16 matrices go through BLAS, invariant
to float32 rounding only. What it costs: chapter 8.5 ("The int8 path and batch invariance").

The exact path chooses by step size instead — the float Numba kernels up to ``kmatmul.SMALL_BATCH``
rows, BLAS above — and so is reproducible run to run but equal across batch shapes only to float32 rounding.

Threads: ``threads`` (default: every core Numba may use) sets Numba's pool;
BLAS is given the same number only around the exact path's prompt-processing
products and one thread otherwise, so the two pools do not fight over cores
(``kernels.cpu.threads``). Creating the backend therefore sets the process's
BLAS to one thread: NumPy products of your own in the same process run on one
thread until you raise it (``threadpoolctl.threadpool_limits``).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numba
import numpy as np
from numba import njit, prange

from ..attention import PLAIN, AttentionOptions, attention_with_options
from ..kernels.cpu import matmul as kmatmul
from ..kernels.cpu import ops
from ..kernels.cpu.heap import keep_freed_buffers
from ..kernels.cpu.int8 import (
    Int8Rows,
    int8_instructions,
    int8_rows,
    int8_rows_from_blocks,
    int8_rows_unsigned,
    int8_unavailable,
    matmul_int8,
)
from ..kernels.cpu.packing import PackedMatrix, fuse, fused_whole, pack_float, pack_raw, unsigned_parts
from ..kernels.cpu.threads import BlasThreads, describe, set_threads
from ..quant.types import GGMLType
from ..rope import rope_frequencies
from .base import Backend, DecodeProgram
from .numba_decode import compiled_decode

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..formats.source import WeightSource
    from ..model import LayerWeights


@njit(parallel=True, cache=True)
def _embed_q8(qs, d, ids, out):
    bs = qs.shape[2]
    for i in prange(ids.shape[0]):
        g, lane = ids[i] // qs.shape[3], ids[i] % qs.shape[3]
        for b in range(qs.shape[1]):
            for j in range(bs):
                out[i, bs * b + j] = d[g, b, lane] * np.float32(qs[g, b, j, lane])


@njit(parallel=True, cache=True)
def _embed_q4(qs, d, m, ids, out):
    for i in prange(ids.shape[0]):
        g, lane = ids[i] // qs.shape[3], ids[i] % qs.shape[3]
        for b in range(qs.shape[1]):
            for j in range(16):
                byte = qs[g, b, j, lane]
                out[i, 32 * b + j] = d[g, b, lane] * np.float32(byte & 15) + m[g, b, lane]
                out[i, 32 * b + 16 + j] = d[g, b, lane] * np.float32(byte >> 4) + m[g, b, lane]


def _kernel_options(options: AttentionOptions) -> tuple[int, np.float32, np.float32]:
    """``window, softcap, scale`` as the attention kernels take them (one type each: one compilation)."""
    return int(options.window), np.float32(options.softcap), np.float32(options.scale)


def _release(packed: PackedMatrix, stored: tuple[np.ndarray, GGMLType] | None) -> None:
    """Keep only the int8 copy of a matrix that has one and whose stored bytes give its rows:
    the packed arrays would be a second copy, the int8 path never reads them."""
    if packed.int8 is not None and stored is not None:
        packed.keep_int8_only(stored)


class NumbaBackend(Backend):
    name = "numba"

    def __init__(self, threads: int | None = None, exact: bool = False, compiled_decode: bool | None = None):
        self.threads = set_threads(threads)
        keep_freed_buffers()  # a prompt's large temporaries reused, not faulted in again per product
        #: run decode steps through the compiled layer loop (``backends.numba_decode``) on the int8 path:
        #: on unless switched off (here or by ``LLMRS_COMPILED_DECODE=0``), see :meth:`decode_program`
        self.compiled_decode = (os.environ.get("LLMRS_COMPILED_DECODE") != "0") if compiled_decode is None \
            else compiled_decode
        #: why decode runs on the float kernels, or None when it runs on the int8 ones
        self.int8_reason = "exact=True" if exact else int8_unavailable()
        #: on the exact path, steps of up to this many tokens stay in Numba's kernels (products
        #: and attention) and longer ones go through BLAS; the int8 path never uses BLAS
        self.numba_rows = kmatmul.SMALL_BATCH
        #: one decode token; on the exact path also the longest step on Numba's kernels and the
        #: shortest through BLAS; on the int8 path a chunk of prompt rows (the rows-of-four loop)
        self.warm_up_sizes = (1, self.numba_rows, self.numba_rows + 1) if self.int8_reason else (1, 5)
        self.blas = BlasThreads()
        self.blas.set(1)
        self._freqs: dict[tuple[int, float], np.ndarray] = {}
        self._scratch = np.empty(0, np.float32)  # dequantised band for BLAS, reused across calls
        self._blas_step = False  # set by begin_step: this step's products go through BLAS

    def begin_step(self, n_tokens: int, sizes: tuple[int, ...] = ()) -> None:
        # The step decides the mode of all of it: its products (see matmul) and its attention,
        # which must not start Numba threads between BLAS calls. On the int8 path nothing
        # depends on the step (batch invariance: see the module docstring).
        self._blas_step = self.int8_reason is not None and n_tokens > self.numba_rows

    def _pack(self, source: WeightSource, name: str) -> PackedMatrix:
        shape = source.tensors[name].shape
        stored = source.blocks(name)
        if stored is not None and len(shape) == 2:
            packed = pack_raw(stored[0], stored[1], shape)
            if packed is not None:
                return packed
        return pack_float(source.float32(name), source.tensors[name].type_name)

    def _int8_copy(self, source: WeightSource, name: str, packed: PackedMatrix) -> Int8Rows | None:
        """The int8 kernels' copy of a matrix: the K-quants' whose form keeps their scales as stored
        (Q4_K, Q6_K, Q3_K) and the types no packed form holds (Q5_1, Q5_K, Q2_K, kept as float32)
        from its stored blocks, the rest from its packed form."""
        stored = source.blocks(name)
        copy = int8_rows_from_blocks(stored[0], GGMLType(stored[1]).name, packed.shape) if stored else None
        if copy is not None:
            return copy
        copy = int8_rows(packed)
        parts = unsigned_parts(stored[0], stored[1], packed.shape) if stored is not None and copy is None else None
        return copy if parts is None else int8_rows_unsigned(*parts, GGMLType(stored[1]).name)

    def load_matrix(self, source: WeightSource, name: str) -> PackedMatrix:
        packed = self._pack(source, name)
        if self.int8_reason is None:
            packed.int8 = self._int8_copy(source, name, packed)
            _release(packed, source.blocks(name))
        return packed

    def load_matrices(self, source: WeightSource, names: list[str]) -> list[PackedMatrix]:
        parts = [self._pack(source, name) for name in names]
        fused = fuse(parts)
        if fused is None:
            if self.int8_reason is None:
                for name, p in zip(names, parts):
                    p.int8 = self._int8_copy(source, name, p)
                    _release(p, source.blocks(name))
            return parts
        whole = fused[0].fused
        if self.int8_reason is None and whole is not None:
            copies = [self._int8_copy(source, name, p) for name, p in zip(names, fused)]
            stacked = Int8Rows.stack(copies) if all(c is not None for c in copies) else None
            # parts of two copy forms (Q5_0's planes and Q8_0's bytes): the whole in the form both fit
            whole.int8 = stacked if stacked is not None else int8_rows(whole)
            if whole.int8 is not None:  # the parts' copies are views of the whole's rows
                for name, p in zip(names, fused):
                    start = p.first_group * whole.qs.shape[3]
                    p.int8 = whole.int8.row_slice(start, start + p.rows)
                    _release(p, source.blocks(name))
                whole.keep_int8_only(None)  # nothing reads the whole's rows
        return fused

    def matmul_many(self, x: np.ndarray, ws: list[PackedMatrix]) -> list[np.ndarray]:
        whole = fused_whole(ws)
        if whole is not None:
            y = self.matmul(x, whole)
            start, parts = 0, []
            for w in ws:
                parts.append(y[:, start: start + w.rows])
                start += w.rows
            return parts
        return [self.matmul(x, w) for w in ws]

    def embed(self, table: PackedMatrix, ids: np.ndarray) -> np.ndarray:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if table.released:
            return table.rows_of(ids)  # the file's rows, dequantised: the values the packed form held
        if table.kind == "f32":
            return table.qs[ids]
        out = np.empty((ids.size, table.cols), np.float32)
        if table.kind == "q8":
            _embed_q8(table.qs, table.d, ids, out)
        else:
            _embed_q4(table.qs, table.d, table.m, ids, out)
        return out

    def matmul(self, x: np.ndarray, w: PackedMatrix) -> np.ndarray:
        # Numba's thread count belongs to the calling thread and to the process, not to
        # this backend: put ours back if another backend or thread changed it.
        if numba.get_num_threads() != self.threads:
            numba.set_num_threads(self.threads)
        if w.int8 is not None:
            return matmul_int8(x, w.int8)  # the int8 path: any step, each row alone
        if self.int8_reason is None and w.kind != "f32":
            return kmatmul.matmul_rowwise(x, w)  # a packed matrix without a copy: still each row alone
        if x.shape[0] <= self.numba_rows and w.kind != "f32":
            return kmatmul.matmul(x, w)  # the exact path's small steps (and a BLAS step's head rows)
        return self._blas_matmul(x, w)

    def _blas_matmul(self, x: np.ndarray, w: PackedMatrix) -> np.ndarray:
        """``x @ W.T`` through kmatmul's BLAS path: BLAS on this backend's threads for the call
        only, the dequantised band in the reused scratch."""
        size = kmatmul.BAND_ROWS * w.cols
        if self._scratch.size < size:
            self._scratch = np.empty(size, np.float32)
        self.blas.set(self.threads)
        try:
            return kmatmul.matmul(x, w, self._scratch[:size].reshape(kmatmul.BAND_ROWS, w.cols))
        finally:
            self.blas.set(1)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        return ops.rms_norm(np.ascontiguousarray(x, dtype=np.float32), weight, np.float32(eps))

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
        # the compiled decode step's SwiGLU (kernels.cpu.ops), so that its bits are the loop's
        # (the kernel takes the fused product's halves as they are: strided views, no copies)
        return ops.swiglu(np.asarray(gate, dtype=np.float32), np.asarray(up, dtype=np.float32))

    def rope(self, x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
        key = (x.shape[-1], float(theta))
        if key not in self._freqs:
            self._freqs[key] = rope_frequencies(x.shape[-1], theta)
        return self.rope_frequencies(x, positions, self._freqs[key])

    def rope_frequencies(self, x: np.ndarray, positions: np.ndarray, freqs: np.ndarray) -> np.ndarray:
        cos, sin = ops.rope_tables(np.ascontiguousarray(positions, dtype=np.int64), freqs)
        return ops.rope(np.ascontiguousarray(x, dtype=np.float32), cos, sin, self.rope_layout == "interleaved")

    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray,
                  options: AttentionOptions = PLAIN) -> np.ndarray:
        # A step whose products ran in the Numba kernels attends in the Numba kernel: every
        # step of the int8 path (its per-query routine is what makes it batch-invariant), and
        # the exact path's short steps. The exact path's long steps (a long prompt, or decode
        # tokens batched with another request's prefill chunk) attend through BLAS: a Numba
        # parallel region between BLAS calls must wait for OpenBLAS's spinning threads to
        # give up their cores (kernels.cpu.threads).
        if not self._blas_step:
            # The contiguous cache hands over transposed views ([Hkv, T, D] storage seen as
            # [T, Hkv, D]); Numba compiles a strided array without SIMD, and a copy plus the
            # vectorised kernel is faster than the kernel on the view (21 vs 34 µs at 150 tokens).
            return ops.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                                 *_kernel_options(options))
        self.blas.set(self.threads)
        try:
            if not options.plain:  # the families' options live in the reference and the Numba kernel
                return attention_with_options(q, k, v, causal=True, options=options)
            return ops.attention_prefill(q, k, v)
        finally:
            self.blas.set(1)

    def paged_decode_attention(self, q, k_pool, v_pool, tables, lengths, options: AttentionOptions = PLAIN):
        if self._blas_step:  # no Numba parallel region between BLAS calls (see attention)
            return super().paged_decode_attention(q, k_pool, v_pool, tables, lengths, options)
        return ops.paged_decode_attention(np.ascontiguousarray(q), k_pool, v_pool, tables, lengths,
                                          *_kernel_options(options))

    def decode_program(self, layers: list[LayerWeights], config: ModelConfig) -> DecodeProgram | None:
        # The compiled step computes the loop's bits (no kernel it calls uses fastmath), so a token's
        # numbers do not depend on which of the two ran its step: the int8 path's batch invariance.
        if self.int8_reason is not None or not self.compiled_decode:
            return None
        return compiled_decode(layers, config, self.rope_layout == "interleaved", self.threads)

    def describe(self) -> str:
        decode = (f"int8 ({int8_instructions()})" if self.int8_reason is None
                  else f"float kernels ({self.int8_reason})")
        return f"numba ({describe(self.threads)}; decode: {decode})"


__all__ = ["NumbaBackend"]
