"""Attention on the device: decode over the paged KV cache, and a tiled online-softmax prefill (chapter 9).

The references are ``kv_cache.paged.paged_attention`` and ``attention.flash_attention``
(causal GQA: query head ``h`` reads KV head ``h // (Hq // Hkv)``; the queries are the last
``Tq`` of the ``Tk`` positions).

**Decode** (:func:`paged_decode`): one thread block per (query head, query). Its threads
split the sequence's positions between them (thread ``j`` takes ``j, j + n, ...``), find
each key through the block table, and keep their own online softmax: a running maximum
``m``, denominator ``l`` and unnormalised output ``acc [D]``. The block then merges the
``n`` partial softmaxes in shared memory, rescaling each by ``exp(m_j - M)``: the split-K
form of FlashDecoding, within one block.

**Prefill** (:func:`flash_prefill`): one thread per query, a block per tile of queries and
one head. The block loads a tile of keys and values into shared memory together, and every
thread folds the tile into its own online softmax (FlashAttention's loop: the ``[Tq, Tk]``
scores never exist). Tiles past the block's last visible key are not loaded.

Shapes: ``q [Tq, Hq, D]``; pools ``[num_blocks, Hkv, block_size, D]``; ``k, v [Tk, Hkv, D]``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import runtime
from .arrays import launch, out_array, pow2_at_least, xp

cuda = runtime.cuda()

MAX_D = 128  # head_dim the kernels' local and shared arrays hold
THREADS = 32  # threads of a decode block; queries of a prefill tile
ACC_SLOTS = THREADS * MAX_D  # the decode block's partial outputs, one [D] row per thread


def paged_decode(q, k_pool, v_pool, table, seq_len, out):  # pragma: no cover - a kernel
    """``out[t, h]``: causal attention of query ``t`` of head ``h`` over ``seq_len`` positions."""
    sm_m = cuda.shared.array(THREADS, np.float32)
    sm_l = cuda.shared.array(THREADS, np.float32)
    sm_acc = cuda.shared.array(ACC_SLOTS, np.float32)
    acc = cuda.local.array(MAX_D, np.float32)
    h, t, j, n = cuda.blockIdx.x, cuda.blockIdx.y, cuda.threadIdx.x, cuda.blockDim.x
    d_head = q.shape[2]
    kv = h // (q.shape[1] // k_pool.shape[1])
    block_size = k_pool.shape[2]
    visible = seq_len - q.shape[0] + t + 1  # keys 0 .. visible - 1
    scale = np.float32(1) / math.sqrt(np.float32(d_head))
    m = -math.inf
    l_sum = np.float32(0)
    for c in range(d_head):
        acc[c] = np.float32(0)
    for p in range(j, visible, n):
        blk = table[p // block_size]
        off = p % block_size
        s = np.float32(0)
        for c in range(d_head):
            s += q[t, h, c] * k_pool[blk, kv, off, c]
        s *= scale
        m_new = max(m, s)
        corr = math.exp(m - m_new)
        e = math.exp(s - m_new)
        l_sum = l_sum * corr + e
        for c in range(d_head):
            acc[c] = acc[c] * corr + e * v_pool[blk, kv, off, c]
        m = m_new
    sm_m[j] = m
    sm_l[j] = l_sum
    for c in range(d_head):
        sm_acc[j * MAX_D + c] = acc[c]
    cuda.syncthreads()
    big = -math.inf
    for i in range(n):
        big = max(big, sm_m[i])
    den = np.float32(0)
    for i in range(n):
        if sm_l[i] > 0:
            den += math.exp(sm_m[i] - big) * sm_l[i]
    for c in range(j, d_head, n):
        num = np.float32(0)
        for i in range(n):
            if sm_l[i] > 0:
                num += math.exp(sm_m[i] - big) * sm_acc[i * MAX_D + c]
        out[t, h, c] = num / den


def flash_prefill(q, k, v, out):  # pragma: no cover - a kernel
    """``out [Tq, Hq, D]``: causal attention, a tile of ``blockDim.x`` queries of one head per block."""
    k_tile = cuda.shared.array((THREADS, MAX_D), np.float32)
    v_tile = cuda.shared.array((THREADS, MAX_D), np.float32)
    acc = cuda.local.array(MAX_D, np.float32)
    mine = cuda.local.array(MAX_D, np.float32)
    i, tile, h = cuda.threadIdx.x, cuda.blockDim.x, cuda.blockIdx.y
    tq, tk, d_head = q.shape[0], k.shape[0], q.shape[2]
    kv = h // (q.shape[1] // k.shape[1])
    offset = tk - tq
    qi = cuda.blockIdx.x * tile + i
    scale = np.float32(1) / math.sqrt(np.float32(d_head))
    m = -math.inf
    l_sum = np.float32(0)
    for c in range(d_head):
        acc[c] = np.float32(0)
        mine[c] = q[qi, h, c] if qi < tq else np.float32(0)
    last = min(tk, offset + min(tq, (cuda.blockIdx.x + 1) * tile))  # keys this block's queries see
    for start in range(0, last, tile):
        p = start + i
        for c in range(d_head):  # thread i loads key and value start + i
            k_tile[i, c] = k[p, kv, c] if p < tk else np.float32(0)
            v_tile[i, c] = v[p, kv, c] if p < tk else np.float32(0)
        cuda.syncthreads()
        if qi < tq:
            for jj in range(min(tile, offset + qi + 1 - start)):
                s = np.float32(0)
                for c in range(d_head):
                    s += mine[c] * k_tile[jj, c]
                s *= scale
                m_new = max(m, s)
                corr = math.exp(m - m_new)
                e = math.exp(s - m_new)
                l_sum = l_sum * corr + e
                for c in range(d_head):
                    acc[c] = acc[c] * corr + e * v_tile[jj, c]
                m = m_new
        cuda.syncthreads()
    if qi < tq:
        for c in range(d_head):
            out[qi, h, c] = acc[c] / l_sum


paged_decode_kernel = cuda.jit(paged_decode)
flash_prefill_kernel = cuda.jit(flash_prefill)


def _check(q: Any, hkv: int, d_head: int) -> None:
    if q.ndim != 3 or q.shape[2] != d_head:
        raise ValueError(f"q must be [Tq, Hq, {d_head}]; got {tuple(q.shape)}")
    if d_head > MAX_D:
        raise ValueError(f"head_dim {d_head} is larger than the kernels' {MAX_D}")
    if q.shape[1] % hkv:
        raise ValueError(f"{q.shape[1]} query heads cannot share {hkv} KV heads evenly")


def paged_attention(q: Any, k_pool: Any, v_pool: Any, block_table: Any, seq_len: int, out: Any = None) -> Any:
    """Causal attention of ``q [Tq, Hq, D]`` (the last ``Tq`` of ``seq_len`` positions) over a
    sequence stored in the pools through ``block_table`` (as ``kv_cache.paged.paged_attention``)."""
    q = xp().ascontiguousarray(q, dtype=np.float32)
    _check(q, k_pool.shape[1], k_pool.shape[3])
    table = xp().ascontiguousarray(xp().asarray(block_table, dtype=np.int32))
    if seq_len > table.size * k_pool.shape[2]:
        raise ValueError(f"seq_len {seq_len} exceeds the {table.size} blocks of the table")
    if q.shape[0] > seq_len:
        raise ValueError(f"{q.shape[0]} queries but only {seq_len} positions")
    out = out_array(out, q.shape)
    launch(paged_decode_kernel, (q.shape[1], q.shape[0]), pow2_at_least(seq_len, THREADS),
           q, k_pool, v_pool, table, np.int32(seq_len), out)
    return out


def contiguous_attention(q: Any, k: Any, v: Any, out: Any = None) -> Any:
    """Causal attention over contiguous ``k, v [Tk, Hkv, D]``: the tiled prefill kernel
    (as ``attention.flash_attention``)."""
    q = xp().ascontiguousarray(q, dtype=np.float32)
    k = xp().ascontiguousarray(k, dtype=np.float32)
    v = xp().ascontiguousarray(v, dtype=np.float32)
    _check(q, k.shape[1], k.shape[2])
    if v.shape != k.shape or q.shape[0] > k.shape[0]:
        raise ValueError(f"expected k and v [Tk, Hkv, D] with Tk >= Tq; got {tuple(k.shape)}, {tuple(v.shape)}")
    out = out_array(out, q.shape)
    tile = pow2_at_least(q.shape[0], THREADS)
    launch(flash_prefill_kernel, (-(-q.shape[0] // tile), q.shape[1]), tile, q, k, v, out)
    return out


KERNELS = [
    ("paged_decode", paged_decode, [
        "void(float32[:, :, ::1], float32[:, :, :, ::1], float32[:, :, :, ::1], int32[::1], int32, float32[:, :, ::1])"
    ]),
    ("flash_prefill", flash_prefill, [
        "void(float32[:, :, ::1], float32[:, :, ::1], float32[:, :, ::1], float32[:, :, ::1])"
    ]),
]

__all__ = ["KERNELS", "contiguous_attention", "paged_attention"]
