"""What the engine needs of a scheduler and of a prefix cache (chapter 7), as vLLM's ``SchedulerInterface``.

:class:`~llmrs_core.engine.scheduler.Scheduler` and
:class:`~llmrs_core.engine.radix_cache.RadixCache` are the engine's own; Exercise 7.6's
scheduler and 7.7's radix cache are the learner's, which the workbook plugs in through
checking wrappers that implement these same interfaces. The engine calls them directly.

A scheduler is built as ``scheduler(pool, max_num_seqs, max_num_batched_tokens, policy,
prefix_cache)`` and a prefix cache as ``prefix_cache(pool.allocator, block_size)``
(:class:`~llmrs_core.engine.parts.EngineParts`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .radix_cache import RadixNode
    from .scheduler import Request, ScheduledChunk


class SchedulerInterface(Protocol):
    """Requests in, one step's work out: :meth:`schedule` returns the chunks (decode tokens and
    prefill chunks of RUNNING requests) whose blocks are reserved in the pool."""

    running: list[Request]
    waiting: Any  # the queue of waiting requests, in the policy's order
    num_preemptions: int
    max_num_seqs: int
    max_num_batched_tokens: int

    def add(self, request: Request) -> None: ...

    def schedule(self) -> list[ScheduledChunk]: ...

    def cache_prompt(self, request: Request) -> None:
        """The request's prompt is computed: its whole blocks may go to the prefix cache now."""

    def finish(self, request: Request, reason: str) -> None: ...

    def abort(self, request: Request) -> None: ...

    @property
    def has_work(self) -> bool: ...


class PrefixCache(Protocol):
    """Whole blocks of token prefixes shared between requests (RadixAttention)."""

    #: counters: lookups made, prompt tokens looked up, and tokens found cached
    lookups: int
    lookup_tokens: int
    hit_tokens: int

    def match_prefix(self, tokens: Sequence[int], count: bool = True) -> tuple[int, list[int], RadixNode]:
        """``(n_tokens, blocks, node)``: the longest cached prefix of ``tokens`` in whole blocks,
        never the whole of ``tokens``."""

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int: ...

    def lock(self, node: RadixNode) -> None: ...

    def unlock(self, node: RadixNode) -> None: ...

    def evict(self, n_blocks: int) -> int: ...

    def clear(self) -> None: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def hit_rate(self) -> float: ...


__all__ = ["PrefixCache", "SchedulerInterface"]
