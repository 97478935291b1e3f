"""The small operations of a decode step as Numba kernels (chapter 8, section 8.4).

At one token per step the matrix products are only part of the time: a
NumPy expression such as RMSNorm makes several temporary arrays and several
passes over ``x``, each with its own Python call. These kernels do each
operation in one pass with no temporaries. They compute the same functions
as ``llmrs_core.layers``, ``rope`` and ``attention`` (the references they
are tested against); ``fastmath`` may change the last bits. SwiGLU is not
here: NumPy's ``tanh`` is SIMD-vectorised and Numba's is a scalar libm call
per element, so ``layers.swiglu`` (3 µs for 1,536 values) beats a Numba loop
(10 µs) — measure before you rewrite.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


# error_model="numpy": a division by zero gives inf/NaN (caught once per step by the model,
# with a message that blames the weights) instead of Numba's ZeroDivisionError from a kernel.
@njit(fastmath=True, cache=True, error_model="numpy")
def rms_norm(x, weight, eps):
    """``x [T, d]`` -> ``x / sqrt(mean(x**2) + eps) * weight``, float32."""
    t_count, dim = x.shape
    out = np.empty((t_count, dim), np.float32)
    for t in range(t_count):
        ss = np.float32(0)
        for i in range(dim):
            ss += x[t, i] * x[t, i]
        inv = np.float32(1) / np.sqrt(ss / np.float32(dim) + np.float32(eps))
        for i in range(dim):
            out[t, i] = x[t, i] * inv * weight[i]
    return out


@njit(cache=True)
def rope_tables(positions, freqs):
    """``cos, sin`` ``[T, D/2]`` float32 of ``position * freq``, the angles formed in float64."""
    t_count, half = positions.shape[0], freqs.shape[0]
    cos = np.empty((t_count, half), np.float32)
    sin = np.empty((t_count, half), np.float32)
    for t in range(t_count):
        for i in range(half):
            a = np.float64(positions[t]) * freqs[i]
            cos[t, i] = np.float32(math.cos(a))
            sin[t, i] = np.float32(math.sin(a))
    return cos, sin


@njit(fastmath=True, cache=True)
def rope(x, cos, sin, interleaved):
    """Rotate ``x [T, H, D]`` by the tables of :func:`rope_tables`: pairs ``(2i, 2i+1)``
    when ``interleaved`` (GGUF), else ``(i, i + D/2)`` (Hugging Face). Returns a new array."""
    t_count, heads, dim = x.shape
    half = dim // 2
    out = np.empty((t_count, heads, dim), np.float32)
    for t in range(t_count):
        for h in range(heads):
            for i in range(half):
                if interleaved:
                    a, b = 2 * i, 2 * i + 1
                else:
                    a, b = i, i + half
                e, o = x[t, h, a], x[t, h, b]
                out[t, h, a] = e * cos[t, i] - o * sin[t, i]
                out[t, h, b] = e * sin[t, i] + o * cos[t, i]
    return out


#: the attention kernels' options switched off, ``window, softcap, scale`` (Llama's attention). The
#: kernels take them explicitly, never as defaults: an omitted argument is a compile-time constant
#: to Numba, and a second specialisation folded around it need not round as the engine's does.
NO_OPTIONS = (0, np.float32(0), np.float32(0))


@njit(fastmath=True, cache=True, error_model="numpy")
def _attend(q, t, h, k, v, kh, limit, out, window, softcap, scale):
    """``out[t, h] =`` softmax-weighted sum of ``v[first:limit, kh]`` for query ``q[t, h]`` against
    ``k[first:limit, kh]`` (``k, v [Tk, Hkv, D]``): scores, softmax, weighted sum, in one pass each.
    Both attention kernels below call this, so they compute the same numbers.

    The query is position ``limit - 1``. Family options (``attention.AttentionOptions``):
    ``window`` > 0 hides keys ``window`` or more positions back (``first = limit - window``);
    ``softcap`` > 0 turns each scaled score ``s`` into ``softcap * tanh(s / softcap)``;
    ``scale`` > 0 replaces ``1 / sqrt(D)``."""
    dim = q.shape[2]
    if scale <= 0:
        scale = np.float32(1.0 / math.sqrt(dim))
    first = max(0, limit - window) if window > 0 else 0
    scores = np.empty(limit - first, np.float32)
    best = np.float32(-np.inf)
    for s in range(first, limit):
        acc = np.float32(0)
        for e in range(dim):
            acc += q[t, h, e] * k[s, kh, e]
        acc *= scale
        if softcap > 0:
            acc = softcap * np.tanh(acc / softcap)
        scores[s - first] = acc
        best = max(best, acc)
    total = np.float32(0)
    for s in range(limit - first):
        p = np.exp(scores[s] - best)
        scores[s] = p
        total += p
    inv = np.float32(1) / total
    for s in range(first, limit):
        p = scores[s - first] * inv
        for e in range(dim):
            out[t, h, e] += p * v[s, kh, e]


@njit(parallel=True, fastmath=True, cache=True, error_model="numpy")  # see rms_norm
def attention(q, k, v, window, softcap, scale):
    """Causal GQA attention: ``q [Tq, Hq, D]``, ``k, v [Tk, Hkv, D]`` -> ``[Tq, Hq, D]``.
    ``window``, ``softcap``, ``scale``: a family's options (see :func:`_attend`; 0 is off).

    The queries are the last ``Tq`` of the ``Tk`` positions (query ``t`` sees
    keys ``0 .. Tk - Tq + t``). One pass per (query, head) pair: scores,
    softmax, weighted sum of values, touching only the keys the query may
    see — half the work of a masked ``[Tq, Tk]`` product in prefill, and no
    ``[Hq, Tq, Tk]`` temporary. The pairs run in parallel.
    """
    tq, hq, dim = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    out = np.zeros((tq, hq, dim), np.float32)
    for pair in prange(tq * hq):
        t, h = pair // hq, pair % hq
        _attend(q, t, h, k, v, h // group, tk - tq + t + 1, out, window, softcap, scale)
    return out


@njit(parallel=True, fastmath=True, cache=True, error_model="numpy")
def paged_decode_attention(q, k_pool, v_pool, tables, lengths, window, softcap, scale):
    """One decode token per sequence, its keys and values read from a block pool in place:
    ``q [n, Hq, D]``, ``k_pool, v_pool [num_blocks, Hkv, block_size, D]`` (one layer's),
    ``tables`` int64 ``[n, max blocks]``, ``lengths`` int64 ``[n]`` -> ``[n, Hq, D]``.

    One parallel loop over (sequence, KV head) pairs for the whole batch, instead of a
    gather and a kernel call per sequence from Python: each pair copies its head's keys and
    values into a contiguous scratch (``[length, 1, D]``, in L1/L2) and its query heads attend
    there through :func:`_attend`, the same code as :func:`attention`, so a sequence's
    numbers are the contiguous cache's.
    """
    n, hq, dim = q.shape
    hkv, block_size = k_pool.shape[1], k_pool.shape[2]
    group = hq // hkv
    out = np.zeros((n, hq, dim), np.float32)
    for pair in prange(n * hkv):
        i, kh = pair // hkv, pair % hkv
        length = lengths[i]
        k = np.empty((length, 1, dim), np.float32)
        v = np.empty((length, 1, dim), np.float32)
        for s in range(length):
            block, slot = tables[i, s // block_size], s % block_size
            for e in range(dim):
                k[s, 0, e] = k_pool[block, kh, slot, e]
                v[s, 0, e] = v_pool[block, kh, slot, e]
        for h in range(kh * group, (kh + 1) * group):
            _attend(q, i, h, k, v, 0, length, out, window, softcap, scale)
    return out


def attention_prefill(q: np.ndarray, k: np.ndarray, v: np.ndarray, chunk: int = 128) -> np.ndarray:
    """Causal GQA attention for many queries, through BLAS: same arguments and result as :func:`attention`.

    For a long prompt the score and value products are real matrix products,
    and sgemm does them several times faster than a Numba loop (the ``exp``
    of the softmax is vectorised in NumPy and not in Numba). The queries go
    in chunks of ``chunk``; chunk ``[c0, c1)`` multiplies only the keys it
    may see, ``0 .. Tk - Tq + c1``, and masks only its last ``c1 - c0``
    columns — about 5/8 of a full ``[Tq, Tk]`` product at 4 chunks.
    """
    tq, hq, dim = q.shape
    tk, hkv = k.shape[0], k.shape[1]
    group = hq // hkv
    offset = tk - tq
    qg = q.reshape(tq, hkv, group, dim).transpose(1, 2, 0, 3) * np.float32(1.0 / math.sqrt(dim))
    kt = k.transpose(1, 2, 0)[:, None]  # [Hkv, 1, D, Tk]
    vt = v.transpose(1, 0, 2)[:, None]  # [Hkv, 1, Tk, D]
    out = np.empty((hkv, group, tq, dim), np.float32)
    for c0 in range(0, tq, chunk):
        c1 = min(c0 + chunk, tq)
        end = offset + c1
        scores = qg[:, :, c0:c1] @ kt[..., :end]  # [Hkv, group, c, end]
        upper = np.triu(np.ones((c1 - c0, c1 - c0), dtype=bool), 1)  # key after query: hidden
        scores[..., offset + c0:end][..., upper] = -np.inf
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out[:, :, c0:c1] = scores @ vt[..., :end, :]
    return out.transpose(2, 0, 1, 3).reshape(tq, hq, dim)


__all__ = ["attention", "attention_prefill", "paged_decode_attention", "rms_norm", "rope", "rope_tables"]
