"""What a KV cache hands the forward pass, checked before it reaches attention (chapter 5).

A learner's cache (Exercises 5.6 and 5.7) reaches the model wrapped in
:class:`~llmrs_core.workbook.checked.CheckedKVCache`, which takes every value the
cache returns through these functions: the RoPE positions, the keys and values to
attend (exactly :meth:`~llmrs_core.kv_cache.base.KVCache.num_attended` of them), and
``length`` after ``write`` and ``advance``; one sequence of a learner's paged pool checks
its block table after every ``reserve`` (:func:`checked_reserve`). A cache that breaks the
:class:`~llmrs_core.kv_cache.base.KVCache` protocol gets a
:class:`CacheProtocolError` that names its method and what was expected —
not a shape error, or a crash, from deep inside a compiled attention kernel.
The checks read shapes and dtypes only: a few comparisons per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..kv_cache.base import KVCache
from ..kv_cache.paged import PagedSequence, blocks_for


class CacheProtocolError(ValueError):
    """A KV cache returned something the forward pass cannot use; the message says what and where."""


#: the exercise a learner's cache class comes from, by its name in chapter 5's exercises.py
_EXERCISES = {"ContiguousKVCache": "Exercise 5.6", "PagedKVCache": "Exercise 5.7"}


def method_name(cache: Any, method: str, args: str | None = None, yours: bool = False) -> str:
    """``ContiguousKVCache.view(layer 0, n_new=3)`` (``args`` in the parentheses); for one sequence
    of a paged pool, the pool's method that answers: ``PagedKVCache.gather(...) (through
    PagedSequence.view)``. The learner's class (``yours``) gets its exercise: ``... (Exercise 5.6)``."""
    through = ""
    if isinstance(cache, PagedSequence):
        pool = {"view": "gather", "write": "write", "advance": "advance"}.get(method)
        if pool is not None:
            cache, method, through = cache.cache, pool, f"through PagedSequence.{method}"
    cls = type(cache)
    notes = [n for n in (through, _EXERCISES.get(cls.__name__, "your exercises.py") if yours else "")
             if n]
    call = f"{cls.__name__}.{method}" + (f"({args})" if args is not None else "")
    return call + (f" ({'; '.join(notes)})" if notes else "")


def _length(cache: KVCache) -> int:
    length = cache.length
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise CacheProtocolError(
            f"{type(cache).__name__}.length is {length!r} ({type(length).__name__}); expected an int, "
            "the number of tokens of the sequence so far"
        )
    return int(length)


def checked_positions(cache: KVCache, n_new: int, yours: bool = False) -> np.ndarray:
    """``cache.positions(n_new)``, checked: ``[n_new]`` integers, at least 0."""
    positions = np.asarray(cache.positions(n_new))
    if positions.shape != (n_new,) or not np.issubdtype(positions.dtype, np.integer):
        raise CacheProtocolError(
            f"{method_name(cache, 'positions', str(n_new), yours=yours)} returned {positions.dtype} of shape {positions.shape}; "
            f"expected [{n_new}] integers, the RoPE positions of the {n_new} new tokens"
        )
    if n_new and positions.min() < 0:
        raise CacheProtocolError(f"{method_name(cache, 'positions', str(n_new), yours=yours)} returned a negative position")
    return positions


def checked_view(
    cache: KVCache, layer: int, n_new: int, length: int, n_kv_heads: int, head_dim: int, yours: bool = False
) -> tuple[Any, Any]:
    """``cache.view(layer, n_new)``, checked against what attention needs.

    ``length`` is the cache's length when the step began: ``write`` must not
    have changed it. Keys and values must be float ``[Tk, Hkv, D]`` alike, with
    ``Tk = cache.num_attended(n_new)``: ``length + n_new`` for a cache that keeps
    every position (the new tokens' queries are the last ``n_new`` of the ``Tk``
    keys, so a view without them, or one position short, would attend the wrong keys).
    """
    now = _length(cache)
    if now != length:
        raise CacheProtocolError(
            f"{method_name(cache, 'write', yours=yours)} changed length from {length} to {now}: every layer writes the same "
            "positions, so only advance() moves length on"
        )
    try:
        keys, values = cache.view(layer, n_new)
    except (TypeError, ValueError) as e:
        if "unpack" not in str(e):
            raise
        raise CacheProtocolError(f"{method_name(cache, 'view', yours=yours)} must return two arrays, (keys, values)") from None
    tk = int(cache.num_attended(n_new))
    counted = f"length {length} + n_new {n_new}" if tk == length + n_new else f"the {tk} keys the cache keeps"
    want = f"[{tk}, {n_kv_heads}, {head_dim}] ({counted})"
    for name, a in (("keys", keys), ("values", values)):
        shape, dtype = getattr(a, "shape", None), getattr(a, "dtype", None)
        if shape is None or dtype is None:
            raise CacheProtocolError(
                f"{method_name(cache, 'view', f'layer {layer}, n_new={n_new}', yours=yours)} returned {name} of type "
                f"{type(a).__name__}; expected an array {want}"
            )
        ok = (
            len(shape) == 3 and tuple(shape) == (tk, n_kv_heads, head_dim)
            and np.issubdtype(np.dtype(dtype), np.floating)
        )
        if not ok:
            raise CacheProtocolError(
                f"{method_name(cache, 'view', f'layer {layer}, n_new={n_new}', yours=yours)} returned {name} of shape "
                f"{tuple(shape)} ({dtype}); expected floats {want}{_hint(tuple(shape), tk, n_new)}"
            )
    if tuple(keys.shape) != tuple(values.shape):
        raise CacheProtocolError(
            f"{method_name(cache, 'view', f'layer {layer}, n_new={n_new}', yours=yours)} returned keys {tuple(keys.shape)} but "
            f"values {tuple(values.shape)}; they must match"
        )
    return keys, values


def _hint(shape: tuple, tk: int, n_new: int) -> str:
    """The likely mistake behind a view of ``shape`` where ``[tk, Hkv, D]`` was due."""
    if len(shape) != 3 or shape[0] == tk:
        return ""
    if n_new and shape[0] == tk - n_new:
        return f" — the {n_new} token(s) just written are missing: view(layer, n_new) must include them"
    if abs(shape[0] - tk) == 1:
        return f" — one position {'short' if shape[0] < tk else 'too many'}: off by one"
    return ""


def checked_advance(cache: KVCache, n_new: int, length: int, yours: bool = False) -> None:
    """``cache.advance(n_new)``, then ``length`` must have grown from ``length`` by exactly ``n_new``."""
    cache.advance(n_new)
    now = _length(cache)
    if now != length + n_new:
        raise CacheProtocolError(
            f"after {method_name(cache, 'advance', str(n_new), yours=yours)} length is {now}; expected {length} + {n_new} = "
            f"{length + n_new}"
        )


def checked_reserve(pool: Any, seq: Any, n: int, yours: bool = False) -> None:
    """After ``pool.reserve(seq, n)``: the block table of ``seq`` holds exactly the blocks that
    ``lengths[seq] + n`` tokens take, distinct blocks in use (ids ``0 .. num_blocks - 1``), and
    the blocks the ``n`` new tokens go to are held by ``seq`` alone (copy-on-write done), so
    that ``write`` may fill them. A :class:`~llmrs_core.kv_cache.paged.PagedKVCache` (or the
    learner's, Exercise 5.7) that breaks this gets a :class:`CacheProtocolError` naming its ``reserve``."""
    where = method_name(pool, "reserve", f"{seq!r}, {n}", yours=yours)
    length, table, bs = pool.lengths[seq], pool.tables[seq], pool.block_size
    counts = pool.allocator.ref_counts
    want = blocks_for(length + n, bs)
    if len(table) != want:
        raise CacheProtocolError(
            f"after {where} the block table holds {len(table)} block(s); {length} + {n} tokens in blocks of "
            f"{bs} take {want} (a new block only when the tokens cross a block boundary: ceil((length + n) / "
            "block_size))"
        )
    bad = [b for b in table if isinstance(b, bool) or not isinstance(b, (int, np.integer))
           or not 0 <= b < len(counts) or counts[b] <= 0]
    if bad:
        raise CacheProtocolError(
            f"after {where} the block table holds {bad}, not blocks in use (ids 0..{len(counts) - 1} with a "
            "reference count of at least 1)"
        )
    if len(set(table)) != len(table):
        raise CacheProtocolError(f"after {where} the block table {list(table)} holds a block twice")
    shared = [int(table[i]) for i in range(length // bs, want) if counts[table[i]] != 1]  # the blocks written
    if shared:
        raise CacheProtocolError(
            f"after {where} the new tokens go to block(s) {shared}, shared with another sequence: reserve "
            "copies a shared, partly filled last block first (copy-on-write), so that write never changes "
            "another sequence's keys"
        )


__all__ = [
    "CacheProtocolError", "checked_advance", "checked_positions", "checked_reserve", "checked_view", "method_name",
]
