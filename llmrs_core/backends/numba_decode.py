"""The Numba backend's compiled decode step: the model's layers as :mod:`~llmrs_core.kernels.cpu.decode` reads them.

:func:`compiled_decode` turns the layers into a typed list of
:class:`~llmrs_core.kernels.cpu.decode.Layer` once, at load, or says why it cannot (None: the
model keeps its layer loop for every step): the int8 path only, every matrix with an int8 copy,
and SwiGLU. :class:`CompiledDecode` then takes the steps whose sequences each add one token, in
the engine's paged pool or one contiguous cache.

On by default (``NumbaBackend(compiled_decode=False)`` or ``LLMRS_COMPILED_DECODE=0`` keeps the loop). It
computes the layer loop's bits (:mod:`~llmrs_core.kernels.cpu.decode`): the int8 path promises that a
token's numbers never depend on the step that computes them (batch invariance), and a prompt's step
runs through the loop while a decode step runs through this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numba
import numpy as np

from ..kernels.cpu.activations import SCHEME_CODE
from ..kernels.cpu.decode import Layer, Matrix, decode_layers, layer_list
from ..kernels.cpu.int8 import Int8Rows
from ..kernels.cpu.packing import fused_whole
from ..kv_cache.contiguous import ContiguousKVCache
from .base import DecodeProgram

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..kernels.cpu.packing import PackedMatrix
    from ..model import LayerWeights
    from ..rope import Rotary
    from ..step import StepBatch

_NO_VECTOR = np.zeros(0, np.float32)
_NO_MATRIX = Matrix(-1, *(np.zeros((0, 0), t) for t in (np.uint8, np.float32, np.float32, np.uint8, np.uint8, np.uint8)),
                    0, 32, 0)


def _matrix(copy: Int8Rows) -> Matrix:
    return Matrix(*copy.kernel_args, SCHEME_CODE[copy.scheme], copy.block, copy.rows)


def _vector(v: np.ndarray | None) -> np.ndarray:
    return _NO_VECTOR if v is None else np.ascontiguousarray(v, dtype=np.float32)


def _freqs(rotary: Rotary | None) -> np.ndarray:
    return np.zeros(0) if rotary is None else np.ascontiguousarray(rotary.freqs, dtype=np.float64)


def _together(parts: list[PackedMatrix | None]) -> tuple[Matrix, list[Matrix]] | None:
    """``(whole, parts)``: a file's fused matrix (one part), or the parts the backend fused at load
    (their product is one product of the whole, as ``matmul_many`` makes it), or the parts one by
    one; None where one of them has no int8 copy."""
    present = [p for p in parts if p is not None]
    if any(p.int8 is None for p in present):
        return None
    if len(present) == 1:  # stored fused (Phi-3)
        return _matrix(present[0].int8), [_NO_MATRIX] * (len(parts) - 1)
    whole = fused_whole(present)
    if whole is not None and whole.int8 is not None:
        return _matrix(whole.int8), [_NO_MATRIX] * len(parts)
    return _NO_MATRIX, [_matrix(p.int8) for p in present]


def _layer(w: LayerWeights) -> Layer | None:
    """One layer as the compiled step reads it, or None where it cannot run it."""
    qkv = _together([w.wqkv] if w.wqkv is not None else [w.wq, w.wk, w.wv])
    gate_up = _together([w.w_gate_up] if w.w_gate_up is not None else [w.w_gate, w.w_up])
    if qkv is None or gate_up is None or w.wo.int8 is None or w.w_down.int8 is None:
        return None
    (wqkv, (wq, wk, wv)) = (qkv[0], (qkv[1] + [_NO_MATRIX] * 3)[:3])
    (w_gate_up, (w_gate, w_up)) = (gate_up[0], (gate_up[1] + [_NO_MATRIX] * 2)[:2])
    return Layer(
        _vector(w.attn_norm), _vector(w.ffn_norm), _vector(w.bq), _vector(w.bk), _vector(w.bv),
        _vector(w.q_norm), _vector(w.k_norm), _vector(w.post_attn_norm), _vector(w.post_ffn_norm),
        wq, wk, wv, wqkv, _matrix(w.wo.int8), w_gate, w_up, w_gate_up, _matrix(w.w_down.int8),
        _freqs(w.rotary), _freqs(w.rotary.long), int(w.rotary.original), int(w.rotary.dims), np.float32(w.rotary.mscale),
        int(w.attn.window), np.float32(w.attn.softcap), np.float32(w.attn.scale),
    )


def compiled_decode(layers: list[LayerWeights], config: ModelConfig, interleaved: bool,
                    threads: int) -> CompiledDecode | None:
    """The compiled step for ``layers`` on the int8 path, or None where one of them cannot run in it
    (see the module docstring)."""
    if config.family.activation != "silu":
        return None
    compiled = [_layer(w) for w in layers]
    if any(layer is None for layer in compiled):
        return None
    return CompiledDecode(layer_list(compiled), config, interleaved, threads)


class CompiledDecode(DecodeProgram):
    """Decode steps in one call of :func:`~llmrs_core.kernels.cpu.decode.decode_layers`."""

    def __init__(self, layers: Any, config: ModelConfig, interleaved: bool, threads: int):
        self.layers = layers
        c = config
        self.shape = (c.n_heads, c.n_kv_heads, c.head_dim, c.intermediate_size, np.float32(c.rms_norm_eps), interleaved)
        self.threads = threads

    def _slots(self, step: StepBatch) -> tuple | None:
        """``(k, v, tables, lengths, blocks, offsets)`` for the step, or None where it is not one of
        one token per sequence in the engine's pool or in one contiguous cache with room."""
        if any(size != 1 for size in step.sizes):
            return None
        if step.pool is not None and not step.apart:
            s = step.slots
            return step.pool.k, step.pool.v, s.tables, s.lengths, s.blocks, s.offsets
        cache = step.caches[0]
        if len(step.caches) != 1 or not isinstance(cache, ContiguousKVCache) or step.unrotated[0] \
                or cache.length >= cache.max_tokens:  # a full cache: the layer loop raises CacheFullError
            return None
        at = np.array([cache.length], np.int64)
        zero = np.zeros(1, np.int64)
        # [layers, Hkv, max_tokens, D] is a pool of one block of max_tokens positions per layer
        return cache.k[:, None], cache.v[:, None], zero.reshape(1, 1), at + 1, zero, at

    def run(self, x: np.ndarray, step: StepBatch) -> np.ndarray | None:
        slots = self._slots(step)
        if slots is None:
            return None
        if numba.get_num_threads() != self.threads:  # as NumbaBackend.matmul: the pool is per thread
            numba.set_num_threads(self.threads)
        positions = np.ascontiguousarray(step.positions, dtype=np.int64)
        return decode_layers(np.ascontiguousarray(x, dtype=np.float32), self.layers, *slots, positions, *self.shape)


__all__ = ["CompiledDecode", "compiled_decode"]
