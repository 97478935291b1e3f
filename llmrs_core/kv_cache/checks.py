"""What a KV cache hands the forward pass, checked before it reaches attention (chapter 5).

A cache can be the learner's (Exercises 5.6 and 5.7 plug into the model), so
``LlamaModel.forward_batch`` takes every value a cache returns through these
functions: the RoPE positions, the keys and values to attend, and ``length``
after ``write`` and ``advance``. A cache that breaks the
:class:`~llmrs_core.kv_cache.base.KVCache` protocol gets a
:class:`CacheProtocolError` that names its method and what was expected —
not a shape error, or a crash, from deep inside a compiled attention kernel.
The checks read shapes and dtypes only: a few comparisons per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .base import KVCache
from .paged import PagedSequence


class CacheProtocolError(ValueError):
    """A KV cache returned something the forward pass cannot use; the message says what and where."""


def _method(cache: KVCache, method: str) -> str:
    """``ContiguousKVCache.view``; for one sequence of a paged pool, the pool's method that answers."""
    if isinstance(cache, PagedSequence):
        pool = {"view": "gather", "write": "write", "advance": "advance"}.get(method)
        if pool is not None:
            return f"{type(cache.cache).__name__}.{pool} (through PagedSequence.{method})"
    return f"{type(cache).__name__}.{method}"


def _length(cache: KVCache) -> int:
    length = cache.length
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)):
        raise CacheProtocolError(
            f"{type(cache).__name__}.length is {length!r} ({type(length).__name__}); expected an int, "
            "the number of tokens of the sequence so far"
        )
    return int(length)


def checked_positions(cache: KVCache, n_new: int) -> np.ndarray:
    """``cache.positions(n_new)``, checked: ``[n_new]`` integers, at least 0."""
    positions = np.asarray(cache.positions(n_new))
    if positions.shape != (n_new,) or not np.issubdtype(positions.dtype, np.integer):
        raise CacheProtocolError(
            f"{_method(cache, 'positions')}({n_new}) returned {positions.dtype} of shape {positions.shape}; "
            f"expected [{n_new}] integers, the RoPE positions of the {n_new} new tokens"
        )
    if n_new and positions.min() < 0:
        raise CacheProtocolError(f"{_method(cache, 'positions')}({n_new}) returned a negative position")
    return positions


def checked_view(
    cache: KVCache, layer: int, n_new: int, length: int, n_kv_heads: int, head_dim: int
) -> tuple[Any, Any]:
    """``cache.view(layer, n_new)``, checked against what attention needs.

    ``length`` is the cache's length when the step began: ``write`` must not
    have changed it. Keys and values must be float ``[Tk, Hkv, D]`` alike, with
    ``n_new <= Tk <= length + n_new`` (the new tokens' own keys are attended;
    nothing that was never written can be).
    """
    now = _length(cache)
    if now != length:
        raise CacheProtocolError(
            f"{_method(cache, 'write')} changed length from {length} to {now}: every layer writes the same "
            "positions, so only advance() moves length on"
        )
    try:
        keys, values = cache.view(layer, n_new)
    except (TypeError, ValueError) as e:
        if "unpack" not in str(e):
            raise
        raise CacheProtocolError(f"{_method(cache, 'view')} must return two arrays, (keys, values)") from None
    want = f"[Tk, {n_kv_heads}, {head_dim}] with {n_new} <= Tk <= {length + n_new} (length {length} + n_new {n_new})"
    for name, a in (("keys", keys), ("values", values)):
        shape, dtype = getattr(a, "shape", None), getattr(a, "dtype", None)
        if shape is None or dtype is None:
            raise CacheProtocolError(
                f"{_method(cache, 'view')}(layer {layer}, n_new={n_new}) returned {name} of type "
                f"{type(a).__name__}; expected an array {want}"
            )
        ok = (
            len(shape) == 3 and tuple(shape[1:]) == (n_kv_heads, head_dim)
            and n_new <= shape[0] <= length + n_new and np.issubdtype(np.dtype(dtype), np.floating)
        )
        if not ok:
            raise CacheProtocolError(
                f"{_method(cache, 'view')}(layer {layer}, n_new={n_new}) returned {name} of shape "
                f"{tuple(shape)} ({dtype}); expected floats {want}"
            )
    if tuple(keys.shape) != tuple(values.shape):
        raise CacheProtocolError(
            f"{_method(cache, 'view')}(layer {layer}, n_new={n_new}) returned keys {tuple(keys.shape)} but "
            f"values {tuple(values.shape)}; they must match"
        )
    return keys, values


def checked_advance(cache: KVCache, n_new: int, length: int) -> None:
    """``cache.advance(n_new)``, then ``length`` must have grown from ``length`` by exactly ``n_new``."""
    cache.advance(n_new)
    now = _length(cache)
    if now != length + n_new:
        raise CacheProtocolError(
            f"after {_method(cache, 'advance')}({n_new}) length is {now}; expected {length} + {n_new} = "
            f"{length + n_new}"
        )


__all__ = ["CacheProtocolError", "checked_advance", "checked_positions", "checked_view"]
