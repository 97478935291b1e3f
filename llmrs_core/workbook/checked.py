"""Checking wrappers: a learner's cache, pool, scheduler or prefix cache behind the engine's interfaces.

The engine calls ``cache.view(...)`` and ``scheduler.schedule()`` directly and checks nothing.
A learner's class (Exercises 5.6, 5.7, 7.6, 7.7) reaches it wrapped in one of these, which
implement the same interfaces and check every value on its way to the engine
(:mod:`~llmrs_core.workbook.cache_checks`, :mod:`~llmrs_core.workbook.scheduler_checks`), so a
mistake is named — ``ContiguousKVCache.view(layer 0, n_new=3) (Exercise 5.6) returned keys of
shape ...`` — before attention's kernel, or the block pool, sees it.

* :class:`CheckedKVCache`: one sequence (a :class:`~llmrs_core.kv_cache.base.KVCache`);
* :class:`CheckedPagedKVCache`: a block pool whose sequences are checked, their ``reserve`` too;
* :class:`CheckedScheduler`, :class:`CheckedPrefixCache`: chapter 7's
  :mod:`~llmrs_core.engine.interface`;
* :func:`checked_parts`: :class:`~llmrs_core.engine.parts.EngineParts` with given classes wrapped.

``yours``: the class is the learner's, and messages name its exercise.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Sequence
from operator import attrgetter
from typing import Any

import numpy as np

from ..engine.interface import PrefixCache, SchedulerInterface
from ..engine.parts import EngineParts
from ..kv_cache.base import KVCache
from ..kv_cache.paged import PagedSequence
from .cache_checks import checked_advance, checked_positions, checked_reserve, checked_view
from .scheduler_checks import checked_match, checked_schedule


def _delegated(*names: str) -> tuple[property, ...]:
    """Read-only properties that read the wrapped object's (``self.inner``'s) attributes ``names``."""
    return tuple(property(attrgetter(f"inner.{name}")) for name in names)


class CheckedKVCache(KVCache):
    """``inner``, one sequence's cache, with every value it hands the forward pass checked."""

    def __init__(self, inner: KVCache, yours: bool = False):
        self.inner, self.yours = inner, yours
        self._start: int | None = None  # the length when the step began (at positions())
        self._heads: tuple[int, int] = (0, 0)  # Hkv, D of the keys written

    @property
    def length(self) -> int:  # type: ignore[override]
        return self.inner.length

    @property
    def stores_unrotated_keys(self) -> bool:  # type: ignore[override]
        return self.inner.stores_unrotated_keys

    def positions(self, n_new: int) -> np.ndarray:
        positions = checked_positions(self.inner, n_new, yours=self.yours)
        self._start = self.inner.length
        return positions

    def write(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        self._heads = (k.shape[1], k.shape[2])
        self.inner.write(layer, k, v)

    def view(self, layer: int, n_new: int) -> tuple[np.ndarray, np.ndarray]:
        start = self.inner.length if self._start is None else self._start
        return checked_view(self.inner, layer, n_new, start, *self._heads, yours=self.yours)

    def advance(self, n_new: int) -> None:
        start = self.inner.length if self._start is None else self._start
        checked_advance(self.inner, n_new, start, yours=self.yours)
        self._start = None

    def num_attended(self, n_new: int) -> int:
        return self.inner.num_attended(n_new)

    def key_positions(self, n_new: int) -> np.ndarray:
        return self.inner.key_positions(n_new)


class CheckedPagedSequence(PagedSequence):
    """One sequence of a pool whose ``reserve`` is checked each time it makes room (copy-on-write done)."""

    def __init__(self, cache: Any, seq: Hashable, yours: bool = False):
        super().__init__(cache, seq)
        self.yours = yours

    def reserve(self, n: int) -> None:
        super().reserve(n)
        checked_reserve(self.cache, self.seq, n, yours=self.yours)


class CheckedPagedKVCache:
    """``inner``, a block pool (Exercise 5.7's interface), whose :meth:`sequence` gives checked
    sequences; everything else is the pool's own (the scheduler edits ``tables`` in place)."""

    def __init__(self, inner: Any, yours: bool = False):
        self.inner, self.yours = inner, yours

    tables, lengths, allocator, block_size, block_bytes = _delegated(
        "tables", "lengths", "allocator", "block_size", "block_bytes")

    def sequence(self, seq: Hashable) -> CheckedKVCache:
        return CheckedKVCache(CheckedPagedSequence(self.inner, seq, self.yours), self.yours)

    def add_sequence(self, seq: Hashable) -> None:
        self.inner.add_sequence(seq)

    def can_append(self, seq: Hashable, n: int) -> bool:
        return self.inner.can_append(seq, n)

    def reserve(self, seq: Hashable, n: int) -> None:
        self.inner.reserve(seq, n)

    def fork(self, src: Hashable, dst: Hashable) -> None:
        self.inner.fork(src, dst)

    def free(self, seq: Hashable) -> None:
        self.inner.free(seq)

    def memory(self) -> dict[str, float]:
        return self.inner.memory()


class CheckedScheduler(SchedulerInterface):
    """``inner`` with every schedule checked against what one engine step needs."""

    def __init__(self, inner: Any, pool: Any):
        self.inner = inner
        # the pool named in messages is the learner's own class, where it is theirs
        self._pool, self._pool_yours = (pool.inner, pool.yours) if isinstance(pool, CheckedPagedKVCache) \
            else (pool, False)
        self._requests: dict[str, Any] = {}  # every request added: the ones the engine queued

    running, waiting, num_preemptions, max_num_seqs, max_num_batched_tokens = _delegated(  # type: ignore[assignment]
        "running", "waiting", "num_preemptions", "max_num_seqs", "max_num_batched_tokens")

    def add(self, request: Any) -> None:
        self._requests[request.request_id] = request
        self.inner.add(request)

    def schedule(self) -> list:
        return checked_schedule(self.inner, self.inner.schedule(), self._requests, self._pool, self._pool_yours)

    def cache_prompt(self, request: Any) -> None:
        self.inner.cache_prompt(request)

    def finish(self, request: Any, reason: str) -> None:
        self.inner.finish(request, reason)

    def abort(self, request: Any) -> None:
        self.inner.abort(request)

    @property
    def has_work(self) -> bool:
        return self.inner.has_work


class CheckedPrefixCache(PrefixCache):
    """``inner`` with every prefix match checked before the scheduler shares its blocks."""

    def __init__(self, inner: Any, allocator: Any, block_size: int):
        self.inner, self._allocator, self._block_size = inner, allocator, block_size

    lookups, lookup_tokens, hit_tokens, num_blocks, hit_rate = _delegated(  # type: ignore[assignment]
        "lookups", "lookup_tokens", "hit_tokens", "num_blocks", "hit_rate")

    def match_prefix(self, tokens: Sequence[int], count: bool = True) -> tuple:
        result = self.inner.match_prefix(tokens, count)
        return checked_match(self.inner, tokens, result, self._block_size, self._allocator.ref_counts)

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        return self.inner.insert(tokens, blocks)

    def lock(self, node: Any) -> None:
        self.inner.lock(node)

    def unlock(self, node: Any) -> None:
        self.inner.unlock(node)

    def evict(self, n_blocks: int) -> int:
        return self.inner.evict(n_blocks)

    def clear(self) -> None:
        self.inner.clear()


def _cache(cls: type, yours: bool, *args: Any, **kwargs: Any) -> CheckedKVCache:
    return CheckedKVCache(cls(*args, **kwargs), yours)


def _pool(cls: type, yours: bool, *args: Any, **kwargs: Any) -> CheckedPagedKVCache:
    return CheckedPagedKVCache(cls(*args, **kwargs), yours)


def _scheduler(cls: type, pool: Any, *args: Any) -> CheckedScheduler:
    return CheckedScheduler(cls(pool, *args), pool)


def _prefix_cache(cls: type, allocator: Any, block_size: int) -> CheckedPrefixCache:
    return CheckedPrefixCache(cls(allocator, block_size), allocator, block_size)


def checked_parts(scheduler: type | None = None, prefix_cache: type | None = None, kv_cache: type | None = None,
                  paged_kv_cache: type | None = None, yours: bool = False) -> EngineParts:
    """The engine's own parts, except that each class given here takes their place, wrapped in its
    checks (``yours``: the caches are the learner's, and messages name their exercise)."""
    own = EngineParts.engines_own()
    wrap: Callable[..., Any] = functools.partial
    return EngineParts(
        scheduler=own.scheduler if scheduler is None else wrap(_scheduler, scheduler),
        prefix_cache=own.prefix_cache if prefix_cache is None else wrap(_prefix_cache, prefix_cache),
        kv_cache=own.kv_cache if kv_cache is None else wrap(_cache, kv_cache, yours),
        paged_kv_cache=own.paged_kv_cache if paged_kv_cache is None else wrap(_pool, paged_kv_cache, yours),
    )


__all__ = ["CheckedKVCache", "CheckedPagedKVCache", "CheckedPrefixCache", "CheckedScheduler", "checked_parts"]
