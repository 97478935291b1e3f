"""A decode step's layers as one compiled call (chapter 8, "Decode without Python").

At one token per step, Python between the kernels costs as much as a kernel: a dozen backend
calls per layer, each checking its arguments and entering Numba. :func:`decode_layers` runs
every layer of a step whose sequences each add one token, in one call: the kernels the layer
loop calls (:mod:`.ops`, :mod:`.activations`, :func:`.int8.int8_matmul`), in its order.
``LlamaModel._layers`` is the readable form, and the two compute the same bits: none of those
kernels is compiled with ``fastmath``, so this function's copies of them (LLVM optimises them
again here) round as the loop's do. The int8 path's batch invariance rests on that
(``tests/core/test_compiled_decode.py`` checks it). Numba's cache of this module is invalidated
only by edits to this file: after editing :mod:`.ops`, :mod:`.int8` or :mod:`.activations`, touch it.

Shapes: ``x [n, d]``, one row per sequence; the KV pool ``k, v [layers, blocks, Hkv,
block_size, D]`` (the engine's paged pool, or a contiguous cache as one block per layer);
``tables [n, max blocks]``, ``lengths [n]`` (positions attended, the new one's included),
``blocks, offsets [n]`` (where each new key goes), ``positions [n]`` (RoPE).

A matrix is a :class:`Matrix` (an int8 copy's :attr:`~.int8.Int8Rows.kernel_args`, its
activation scheme and rows); a layer a :class:`Layer`, an absent vector or matrix an empty
one (``size == 0``, ``form < 0``), so that every layer has one type and the layers fit in one
typed list.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numba.typed import List

from .activations import quantized
from .int8 import int8_matmul
from .ops import paged_decode_attention, rms_norm, rope, rope_tables, swiglu


class Matrix(NamedTuple):
    """An int8 copy as the compiled step reads it: :attr:`~.int8.Int8Rows.kernel_args`, then the
    activations' ``scheme`` code (:data:`.activations.SCHEME_CODE`), ``block`` and the real ``rows``."""

    form: int
    qs: np.ndarray
    d: np.ndarray
    m: np.ndarray
    qh: np.ndarray
    sc: np.ndarray
    mn: np.ndarray
    scheme: int
    block: int
    rows: int


class Layer(NamedTuple):
    """One block's weights and options. ``wqkv``/``w_gate_up``: Q, K and V (gate and up) as one
    matrix, when they are stored or loaded as one, and then ``wq``... are absent; ``freqs``
    ``[rope_dims / 2]`` float64 (the layer's :class:`~llmrs_core.rope.Rotary`), ``long_freqs`` longrope's
    for a sequence longer than ``original`` (empty: none), ``mscale`` the multiplier; ``window,
    softcap, scale`` the attention options (0: off)."""

    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    bq: np.ndarray
    bk: np.ndarray
    bv: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray
    post_attn_norm: np.ndarray
    post_ffn_norm: np.ndarray
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wqkv: Matrix
    wo: Matrix
    w_gate: Matrix
    w_up: Matrix
    w_gate_up: Matrix
    w_down: Matrix
    freqs: np.ndarray
    long_freqs: np.ndarray
    original: int
    rope_dims: int
    mscale: np.float32
    window: int
    softcap: np.float32
    scale: np.float32


@njit(cache=True)
def _product(x, w):
    """``x [n, cols] @ W.T -> [n, rows]``: the activations quantised for ``w``, then its int8 kernel."""
    xq, xd, xs = quantized(np.ascontiguousarray(x), w.scheme, w.block)
    out = int8_matmul(w.form, w.qs, w.d, w.m, w.qh, w.sc, w.mn, xq, xd, xs)
    return np.ascontiguousarray(out[:, : w.rows])


@njit(cache=True)
def _projections(h, layer, q_out, kv_out):
    """``h [n, d]`` -> ``q [n, q_out]``, ``k, v [n, kv_out]``, biases added."""
    if layer.wqkv.form >= 0:
        qkv = _product(h, layer.wqkv)
        q = np.ascontiguousarray(qkv[:, :q_out])
        k = np.ascontiguousarray(qkv[:, q_out:q_out + kv_out])
        v = np.ascontiguousarray(qkv[:, q_out + kv_out:])
    else:
        q, k, v = _product(h, layer.wq), _product(h, layer.wk), _product(h, layer.wv)
    if layer.bq.size:
        q, k, v = q + layer.bq, k + layer.bk, v + layer.bv
    return q, k, v


@njit(cache=True)
def _rotate(x, cos, sin, layer, interleaved):
    """RoPE of ``x [n, H, D]`` on its first ``layer.rope_dims`` dimensions, times ``layer.mscale``."""
    dims = layer.rope_dims
    if dims == x.shape[2]:
        y = rope(x, cos, sin, interleaved)
        return y * layer.mscale if layer.mscale != 1 else y
    y = rope(np.ascontiguousarray(x[:, :, :dims]), cos, sin, interleaved)
    out = x.copy()
    out[:, :, :dims] = y * layer.mscale if layer.mscale != 1 else y
    return out


@njit(cache=True)
def _attention(h, layer, k_pool, v_pool, tables, lengths, blocks, offsets, positions, heads, kv_heads, dim,
               eps, interleaved):
    """The attention half of a layer for ``h [n, d]`` (normed): projections, q/k norms, RoPE, the
    new keys and values written at ``blocks, offsets``, attention over the pool -> ``[n, heads * dim]``."""
    n = h.shape[0]
    q, k, v = _projections(h, layer, heads * dim, kv_heads * dim)
    q, k, v = q.reshape(n, heads, dim), k.reshape(n, kv_heads, dim), v.reshape(n, kv_heads, dim)
    if layer.q_norm.size:
        q = rms_norm(q.reshape(-1, dim), layer.q_norm, eps).reshape(n, heads, dim)
        k = rms_norm(k.reshape(-1, dim), layer.k_norm, eps).reshape(n, kv_heads, dim)
    cos, sin = rope_tables(positions, layer.freqs)
    if layer.long_freqs.size:  # longrope: a sequence longer than `original` after the step turns by the long factors
        long_cos, long_sin = rope_tables(positions, layer.long_freqs)
        for j in range(n):
            if lengths[j] > layer.original:
                cos[j], sin[j] = long_cos[j], long_sin[j]
    q, k = _rotate(q, cos, sin, layer, interleaved), _rotate(k, cos, sin, layer, interleaved)
    for j in range(n):
        k_pool[blocks[j], :, offsets[j], :] = k[j]
        v_pool[blocks[j], :, offsets[j], :] = v[j]
    out = paged_decode_attention(q, k_pool, v_pool, tables, lengths, layer.window, layer.softcap, layer.scale)
    return out.reshape(n, heads * dim)


@njit(cache=True)
def _mlp(h, layer, ff):
    """SwiGLU MLP of ``h [n, d]`` (normed) -> ``[n, d]``."""
    if layer.w_gate_up.form >= 0:
        both = _product(h, layer.w_gate_up)
        gate, up = both[:, :ff], both[:, ff:]
    else:
        gate, up = _product(h, layer.w_gate), _product(h, layer.w_up)
    return _product(swiglu(gate, up), layer.w_down)


@njit(cache=True)
def _listed(first):
    layers = List()
    layers.append(first)
    return layers


@njit(cache=True)
def _append(layers, layer):
    layers.append(layer)


def layer_list(layers: list[Layer]) -> List:
    """``layers`` as the typed list :func:`decode_layers` takes, built by compiled (and cached)
    functions: a typed list's methods called from Python compile anew in every process."""
    listed = _listed(layers[0])
    for layer in layers[1:]:
        _append(listed, layer)
    return listed


@njit(cache=True)
def decode_layers(x, layers, k, v, tables, lengths, blocks, offsets, positions, heads, kv_heads, dim, ff, eps,
                  interleaved):
    """Every layer of a decode step: ``x [n, d]`` (the embeddings) -> ``[n, d]`` (before the final
    norm), writing each layer's new keys and values into ``k[layer], v[layer]``. ``layers``: a
    typed list of :class:`Layer`; ``eps`` float32; ``interleaved``: GGUF's RoPE pairs (else
    Hugging Face's halves). As ``LlamaModel.forward_batch``'s loop, one operation after another."""
    for i in range(len(layers)):
        layer = layers[i]
        h = rms_norm(x, layer.attn_norm, eps)
        out = _product(_attention(h, layer, k[i], v[i], tables, lengths, blocks, offsets, positions, heads,
                                  kv_heads, dim, eps, interleaved), layer.wo)
        if layer.post_attn_norm.size:
            out = rms_norm(out, layer.post_attn_norm, eps)
        x = x + out
        out = _mlp(rms_norm(x, layer.ffn_norm, eps), layer, ff)
        if layer.post_ffn_norm.size:
            out = rms_norm(out, layer.post_ffn_norm, eps)
        x = x + out
    return x


__all__ = ["Layer", "Matrix", "decode_layers", "layer_list"]
