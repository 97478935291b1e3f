"""Attention (introduced in chapter 3): softmax, scaled dot-product attention with
causal masking and grouped-query attention, and a tiled online-softmax
("flash") version that gives the same result.

Shapes: ``q`` is ``[Tq, Hq, D]``, ``k`` and ``v`` are ``[Tk, Hkv, D]``, with
``Hq`` a multiple of ``Hkv`` (GQA: query head ``h`` uses KV head
``h // (Hq // Hkv)``). Queries are the *last* ``Tq`` positions of the ``Tk``
keys (``q_offset = Tk - Tq``), which is what both prefill (``Tq == Tk``) and
cached decoding (``Tq == 1``) need: query ``i`` may see keys ``0 .. q_offset + i``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AttentionOptions:
    """What a model family changes in attention (appendix B); every field 0 is Llama's.

    ``window``: sliding-window attention: a query at position ``p`` sees keys ``p - window + 1
    .. p`` (Gemma's local layers). ``softcap``: scores ``s`` become ``softcap * tanh(s / softcap)``
    after scaling (Gemma 2). ``scale``: the factor of ``q . k`` instead of ``1 / sqrt(D)``.
    """

    window: int = 0
    softcap: float = 0.0
    scale: float = 0.0

    @property
    def plain(self) -> bool:
        """Llama's attention: no option set."""
        return self == PLAIN


PLAIN = AttentionOptions()


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax: subtract the max first, so ``exp`` never overflows.

    Rows that are entirely ``-inf`` (everything masked) give zeros, not NaN.
    """
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return e / np.where(s == 0, 1.0, s)


def causal_mask(tq: int, tk: int) -> np.ndarray:
    """``[tq, tk]`` boolean, True where query ``i`` may attend key ``j``: ``j <= (tk - tq) + i``."""
    return np.arange(tk)[None, :] <= (tk - tq) + np.arange(tq)[:, None]


def sliding_window_mask(tq: int, tk: int, window: int) -> np.ndarray:
    """:func:`causal_mask` that also hides keys ``window`` or more positions before the query
    (Gemma's local layers): True where ``0 <= (tk - tq) + i - j < window``."""
    distance = (tk - tq) + np.arange(tq)[:, None] - np.arange(tk)[None, :]
    return (distance >= 0) & (distance < window)


def _check_shapes(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> int:
    if q.ndim != 3 or k.ndim != 3 or v.shape != k.shape:
        raise ValueError(f"expected q [Tq, Hq, D], k and v [Tk, Hkv, D]; got {q.shape}, {k.shape}, {v.shape}")
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"query head_dim {q.shape[2]} != key head_dim {k.shape[2]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads cannot share {k.shape[1]} KV heads evenly")
    if q.shape[0] > k.shape[0]:
        raise ValueError(f"{q.shape[0]} queries but only {k.shape[0]} keys")
    return q.shape[1] // k.shape[1]


def scaled_dot_product_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True
) -> np.ndarray:
    """``softmax(q k^T / sqrt(D) + mask) v`` per head, with GQA. Returns ``[Tq, Hq, D]``."""
    group = _check_shapes(q, k, v)
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    # [Hkv, group, Tq, D] @ [Hkv, 1, D, Tk]: each KV head serves its group of query heads
    qg = q.reshape(tq, hkv, group, d).transpose(1, 2, 0, 3)
    scores = qg @ k.transpose(1, 2, 0)[:, None] / np.sqrt(d).astype(q.dtype)
    if causal:
        scores = np.where(causal_mask(tq, tk), scores, -np.inf)
    out = softmax(scores) @ v.transpose(1, 0, 2)[:, None]  # [Hkv, group, Tq, D]
    return out.transpose(2, 0, 1, 3).reshape(tq, hq, d).astype(q.dtype, copy=False)


def attention_with_options(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True, options: AttentionOptions = PLAIN
) -> np.ndarray:
    """:func:`scaled_dot_product_attention` with a family's window, soft-cap and scale
    (:class:`AttentionOptions`, appendix B); with ``PLAIN`` options, that function itself.

    (The chapter-3 function stays as the chapter writes it, line for line: its diagnoses plant
    a learner's mistakes into its source. This one repeats its few lines with the options.)"""
    if options.plain:
        return scaled_dot_product_attention(q, k, v, causal)
    group = _check_shapes(q, k, v)
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    qg = q.reshape(tq, hkv, group, d).transpose(1, 2, 0, 3)  # [Hkv, group, Tq, D]
    scale = np.float32(options.scale) if options.scale else np.float32(1.0 / np.sqrt(d))
    scores = qg @ k.transpose(1, 2, 0)[:, None] * scale  # [Hkv, group, Tq, Tk]
    if options.softcap:
        cap = np.float32(options.softcap)
        scores = cap * np.tanh(scores / cap)
    if causal:
        mask = sliding_window_mask(tq, tk, options.window) if options.window else causal_mask(tq, tk)
        scores = np.where(mask, scores, -np.inf)
    out = softmax(scores) @ v.transpose(1, 0, 2)[:, None]  # [Hkv, group, Tq, D]
    return out.transpose(2, 0, 1, 3).reshape(tq, hq, d).astype(q.dtype, copy=False)


def flash_attention(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, causal: bool = True, block_size: int = 64
) -> np.ndarray:
    """The same result as :func:`scaled_dot_product_attention`, computed block by block.

    Keys and values are visited in blocks of ``block_size``; for each query we
    keep a running maximum ``m``, a running softmax denominator ``l`` and an
    unnormalised output ``acc``. A new block with a larger maximum rescales
    what came before by ``exp(m_old - m_new)``. The full ``[Tq, Tk]`` score
    matrix never exists: this is FlashAttention's I/O argument, in NumPy.
    """
    group = _check_shapes(q, k, v)
    tq, hq, d = q.shape
    tk, hkv, _ = k.shape
    scale = np.float32(1.0 / np.sqrt(d))
    qg = q.reshape(tq, hkv, group, d).transpose(1, 2, 0, 3).astype(np.float32)  # [Hkv, g, Tq, D]
    m = np.full((hkv, group, tq, 1), -np.inf, dtype=np.float32)
    l_sum = np.zeros((hkv, group, tq, 1), dtype=np.float32)
    acc = np.zeros((hkv, group, tq, d), dtype=np.float32)
    mask = causal_mask(tq, tk) if causal else None
    for start in range(0, tk, block_size):
        stop = min(start + block_size, tk)
        kb = k[start:stop].transpose(1, 2, 0)[:, None].astype(np.float32)  # [Hkv, 1, D, B]
        vb = v[start:stop].transpose(1, 0, 2)[:, None].astype(np.float32)  # [Hkv, 1, B, D]
        s = (qg @ kb) * scale  # [Hkv, g, Tq, B]
        if mask is not None:
            s = np.where(mask[:, start:stop], s, -np.inf)
        m_new = np.maximum(m, s.max(axis=-1, keepdims=True))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)  # rows with nothing visible yet
        p = np.exp(s - safe)
        correction = np.exp(np.where(np.isfinite(m), m - safe, -np.inf))
        l_sum = l_sum * correction + p.sum(axis=-1, keepdims=True)
        acc = acc * correction + p @ vb
        m = m_new
    out = acc / np.where(l_sum == 0, 1.0, l_sum)
    return out.transpose(2, 0, 1, 3).reshape(tq, hq, d).astype(q.dtype, copy=False)
