"""What a model's caches and an :class:`~llmrs_core.engine.Engine`'s state are built from (chapters 5 and 7).

The engine's own classes by default; the workbook's learner facade (``--impl learner``) gives
the learner's, each wrapped in a checking wrapper that implements the same interface, so the
engine never tells the two apart. ``load()``'s :class:`~llmrs_core.loader.Model` holds the
parts for its backend (``model.parts``) and passes them on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineParts:
    """Each field builds one part (a class, or a factory with the class's signature).

    ``kv_cache``: one sequence's cache for ``model.generate`` and ``LlamaModel.forward``,
    built as ``kv_cache(config, max_tokens, xp=xp)`` (a :class:`~llmrs_core.kv_cache.base.KVCache`;
    Exercise 5.6). ``paged_kv_cache``: the batching engine's block pool,
    ``paged_kv_cache(config, num_blocks=n, block_size=b, xp=xp)`` (Exercise 5.7).
    ``scheduler``: ``scheduler(pool, max_num_seqs, max_num_batched_tokens, policy, prefix_cache)``
    (Exercise 7.6; :class:`~llmrs_core.engine.interface.SchedulerInterface`). ``prefix_cache``:
    ``prefix_cache(pool.allocator, block_size)`` (Exercise 7.7;
    :class:`~llmrs_core.engine.interface.PrefixCache`).
    """

    scheduler: Callable[..., Any]
    prefix_cache: Callable[..., Any]
    kv_cache: Callable[..., Any]
    paged_kv_cache: Callable[..., Any]

    @classmethod
    def engines_own(cls) -> EngineParts:
        """The engine's own classes (``llmrs_core.engine`` and ``llmrs_core.kv_cache``)."""
        from ..kv_cache.contiguous import ContiguousKVCache
        from ..kv_cache.paged import PagedKVCache
        from .radix_cache import RadixCache
        from .scheduler import Scheduler

        return cls(scheduler=Scheduler, prefix_cache=RadixCache, kv_cache=ContiguousKVCache,
                   paged_kv_cache=PagedKVCache)


__all__ = ["EngineParts"]
