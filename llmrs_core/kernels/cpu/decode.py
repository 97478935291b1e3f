"""One decode step of a decoder block in a single compiled call (chapter 8, section 8.4).

At one token per step the kernels of ``matmul`` and ``ops`` take about
4.5 ms of SmolLM2's ~6.5 ms; the rest is Python between them — some 17
calls per layer, each checking its arguments, allocating its result and
dispatching into Numba. :func:`decode_layer` does a whole block — RMSNorm,
Q/K/V, RoPE, the cache write, attention, the output projection, the MLP —
in one call, so the Python cost is paid once per layer. It calls the same
kernels (``q4_matvec``, ``q8_matvec``, ``ops.attention`` ...), which keep
their own ``prange`` parallelism, so the arithmetic is the op-by-op path's
and the results agree to float rounding.

Used by :meth:`NumbaBackend.decode_step` for a single sequence, one token,
in a float32 :class:`~llmrs_core.kv_cache.contiguous.ContiguousKVCache`;
everything else (prompts, batches, paged or evicting caches) goes op by op.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .matmul import q4_matvec, q8_matvec
from .ops import attention, rms_norm


@njit(fastmath=True, cache=True)
def packed_matvec(is_q4, qs, d, m, x):
    """``W x`` for a packed matrix of either form (``is_q4``: the Q4 form, else Q8)."""
    if is_q4:
        return q4_matvec(qs, d, m, x)
    return q8_matvec(qs, d, x)


@njit(fastmath=True, cache=True)
def _rotate(v, heads, dim, cos, sin, interleaved):
    """RoPE on ``v [heads * dim]`` in place, for one position (tables ``[dim / 2]``)."""
    half = dim // 2
    for h in range(heads):
        base = h * dim
        for i in range(half):
            if interleaved:
                a, b = base + 2 * i, base + 2 * i + 1
            else:
                a, b = base + i, base + i + half
            e, o = v[a], v[b]
            v[a] = e * cos[i] - o * sin[i]
            v[b] = e * sin[i] + o * cos[i]


@njit(fastmath=True, cache=True)
def decode_layer(
    x, attn_norm, ffn_norm, eps,
    qkv_q4, qkv_qs, qkv_d, qkv_m,
    o_q4, o_qs, o_d, o_m,
    gu_q4, gu_qs, gu_d, gu_m,
    dn_q4, dn_qs, dn_d, dn_m,
    k_cache, v_cache, pos, cos, sin, interleaved,
    n_heads, n_kv_heads, head_dim, hidden, intermediate,
):
    """One decoder block for one token: ``x [d]`` -> the block's output ``[d]``.

    ``qkv_*`` is the fused Q/K/V matrix and ``gu_*`` the fused gate/up one
    (see ``packing.fuse``); ``*_q4`` says which packed form each matrix has.
    ``k_cache, v_cache [Hkv, max_tokens, D]`` are this layer's cache
    arrays; the token's K and V are written at ``pos``. ``cos, sin [D/2]``
    are the RoPE tables for ``pos``.
    """
    q_out, kv_out = n_heads * head_dim, n_kv_heads * head_dim
    h = rms_norm(x.reshape(1, hidden), attn_norm, eps)[0]
    qkv = packed_matvec(qkv_q4, qkv_qs, qkv_d, qkv_m, h)
    q = qkv[:q_out].copy()
    k = qkv[q_out:q_out + kv_out].copy()
    _rotate(q, n_heads, head_dim, cos, sin, interleaved)
    _rotate(k, n_kv_heads, head_dim, cos, sin, interleaved)
    for kh in range(n_kv_heads):
        for e in range(head_dim):
            k_cache[kh, pos, e] = k[kh * head_dim + e]
            v_cache[kh, pos, e] = qkv[q_out + kv_out + kh * head_dim + e]
    keys = k_cache[:, : pos + 1].transpose((1, 0, 2))
    values = v_cache[:, : pos + 1].transpose((1, 0, 2))
    att = attention(q.reshape(1, n_heads, head_dim), keys, values).reshape(q_out)
    x = x + packed_matvec(o_q4, o_qs, o_d, o_m, att)[:hidden]
    h = rms_norm(x.reshape(1, hidden), ffn_norm, eps)[0]
    gu = packed_matvec(gu_q4, gu_qs, gu_d, gu_m, h)
    act = np.empty(intermediate, np.float32)
    for i in range(intermediate):
        g = gu[i]
        act[i] = g * (np.float32(0.5) * (np.float32(1) + np.tanh(np.float32(0.5) * g))) * gu[intermediate + i]
    return x + packed_matvec(dn_q4, dn_qs, dn_d, dn_m, act)[:hidden]


__all__ = ["decode_layer", "packed_matvec"]
