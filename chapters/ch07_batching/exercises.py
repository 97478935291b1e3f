"""Chapter 7 — Batching Strategies: your exercises.

Exercise 7.6  Implementing a Scheduler                  (ch07_batching.ipynb, section 7.6)
Exercise 7.7  Prefix Caching with RadixAttention        (ch07_batching.ipynb, section 7.7)

Check your work with ``make test-chapter 7`` (or ``make test-exercise E=7.6``).
Then run them for real: ``Engine(net, tokenizer, parts=checked_parts(scheduler=Scheduler,
prefix_cache=RadixCache))`` (``llmrs_core.workbook.checked``: each step of yours checked)
serves requests with your code; so does ``llmrs generate --impl learner`` with several prompts.

The data types are the engine's (``llmrs_core.engine``): a ``Request`` has
``request_id``, ``prompt_ids``, ``output_ids``, ``max_tokens``, ``priority``,
``arrival``, ``num_computed`` (tokens whose K/V are cached), ``status``,
``finish_reason``, ``num_preemptions``, ``prefix_node``, and the properties
``all_ids`` and ``num_tokens``. The KV pool is a ``PagedKVCache``
(chapter 5): ``add_sequence``, ``can_append``, ``reserve`` (raises
``OutOfBlocksError``), ``free``, ``tables``, ``lengths``, ``allocator``.
"""

from __future__ import annotations

from collections.abc import Sequence

from llmrs_core.engine.radix_cache import RadixNode
from llmrs_core.engine.scheduler import Request, RequestRejected, RequestStatus, ScheduledChunk
from llmrs_core.kv_cache.paged import BlockAllocator, OutOfBlocksError, PagedKVCache

__all__ = [
    "OutOfBlocksError",
    "RadixCache",
    "RadixNode",
    "Request",
    "RequestRejected",
    "RequestStatus",
    "ScheduledChunk",
    "Scheduler",
]


# -- Exercise 7.6: a continuous-batching scheduler -----------------------------------------------


class Scheduler:
    """Waiting and running queues over one paged KV cache.

    Attributes to keep: ``cache``, ``max_num_seqs``, ``max_num_batched_tokens``,
    ``policy`` ("fcfs" or "priority"), ``prefix_cache`` (may be None; your
    scheduler may ignore it — Exercise 7.7 is about it), ``waiting`` and
    ``running`` (lists of Request), ``num_preemptions``.
    """

    def __init__(
        self,
        cache: PagedKVCache,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        policy: str = "fcfs",
        prefix_cache: RadixCache | None = None,
    ):
        """Store the settings; empty queues. An unknown policy or a non-positive limit: ``ValueError``."""
        raise NotImplementedError(
            "Exercise 7.6 `Scheduler.__init__`: not implemented yet — see ch07_batching.ipynb §7.6"
        )

    def add(self, request: Request) -> None:
        """Queue ``request`` (status WAITING). If ``prompt + max_tokens`` tokens need more blocks
        than the whole pool has, set status REJECTED and raise ``RequestRejected``: it could never run."""
        raise NotImplementedError(
            "Exercise 7.6 `Scheduler.add`: not implemented yet — see ch07_batching.ipynb §7.6"
        )

    def cache_prompt(self, request: Request) -> None:
        """(provided) Called by the engine when a prompt is computed: offer it to the prefix cache."""
        if self.prefix_cache is not None and request.request_id in self.cache.tables:
            self.prefix_cache.insert(request.prompt_ids[: request.num_computed], self.cache.tables[request.request_id])

    def finish(self, request: Request, reason: str) -> None:
        """A running request is done: remove it from ``running``, status FINISHED with ``reason``,
        and free its blocks (``cache.free(request_id)``)."""
        raise NotImplementedError(
            "Exercise 7.6 `Scheduler.finish`: not implemented yet — see ch07_batching.ipynb §7.6"
        )

    def abort(self, request: Request) -> None:
        """Stop a waiting or running request now: status ABORTED, finish_reason "abort", blocks freed."""
        raise NotImplementedError(
            "Exercise 7.6 `Scheduler.abort`: not implemented yet — see ch07_batching.ipynb §7.6"
        )

    def preempt(self, request: Request) -> None:
        """Free a running request's blocks and put it back at the *front* of ``waiting``:
        ``num_computed = 0`` (it will be recomputed from its tokens), status WAITING,
        ``num_preemptions`` + 1 on both the request and the scheduler."""
        raise NotImplementedError(
            "Exercise 7.6 `Scheduler.preempt`: not implemented yet — see ch07_batching.ipynb §7.6"
        )

    def schedule(self) -> list[ScheduledChunk]:
        """This step's work, within ``max_num_batched_tokens`` tokens in all.

        1. Running requests, oldest first: each computes ``min(num_tokens - num_computed,
           budget left)`` tokens. Reserve the blocks (``cache.reserve(request_id, n)``; add
           the sequence to the cache first if it is new). If the pool is out of blocks,
           preempt the newest running request and try again — if that was this request
           itself, skip it.
        2. Then admit waiting requests while fewer than ``max_num_seqs`` run and budget is
           left: FCFS takes ``waiting[0]``; "priority" takes the lowest ``priority``, then
           the earliest ``arrival``. Reserve its first chunk; if the blocks are not there,
           stop admitting (free anything you added for it). Admitted: status RUNNING, append
           to ``running``.
        Return a ``ScheduledChunk(request, n_tokens)`` per request that computes this step.
        """
        raise NotImplementedError(
            "Exercise 7.6 `Scheduler.schedule`: not implemented yet — see ch07_batching.ipynb §7.6"
        )

    @property
    def has_work(self) -> bool:
        """Anything waiting or running."""
        raise NotImplementedError(
            "Exercise 7.6 `Scheduler.has_work`: not implemented yet — see ch07_batching.ipynb §7.6"
        )


# -- Exercise 7.7: a radix tree of cached prefixes -----------------------------------------------


class RadixCache:
    """Cached prompt prefixes as a radix tree whose edges own KV blocks.

    Use the engine's :class:`RadixNode` (``tokens``, ``blocks``, ``parent``, ``children``
    keyed by the tuple of an edge's first ``block_size`` token ids, ``lock_count``,
    ``last_access``). Everything is in whole blocks: an edge's ``tokens`` has
    ``len(blocks) * block_size`` ids. Keep ``allocator``, ``block_size``, ``root``
    (an empty RadixNode) and the counters ``lookups``, ``lookup_tokens``, ``hit_tokens``.
    """

    def __init__(self, allocator: BlockAllocator, block_size: int):
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.__init__`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    def match_prefix(self, tokens: Sequence[int], count: bool = True) -> tuple[int, list[int], RadixNode]:
        """``(n_tokens, blocks, node)``: the longest cached prefix of ``tokens`` in whole blocks —
        but never all of ``tokens`` (at most ``(len - 1) // block_size`` blocks: the last token
        must be computed for its logits). If the match ends inside an edge, split the edge at
        that block boundary and return the upper part as ``node``. Update ``last_access`` of
        the nodes on the path (a counter that increases with every call). With ``count``, add
        to ``lookups``, ``lookup_tokens`` (``len(tokens)``) and ``hit_tokens`` (the match)."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.match_prefix`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    def insert(self, tokens: Sequence[int], blocks: Sequence[int]) -> int:
        """Cache the whole blocks of ``tokens`` (held in ``blocks``): follow the existing path
        as far as it matches, then add one new edge with the remaining blocks, taking a
        reference on each (``allocator.incref``). Return how many blocks were newly cached."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.insert`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    def lock(self, node: RadixNode) -> None:
        """``lock_count + 1`` on ``node`` and every ancestor below the root."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.lock`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    def unlock(self, node: RadixNode) -> None:
        """``lock_count - 1`` on the same path; below zero is a ``RuntimeError``."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.unlock`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    def evict(self, n_blocks: int) -> int:
        """Remove unlocked leaves, least recently used first, until ``n_blocks`` blocks went back
        to the pool (or none is left): ``decref`` each of a leaf's blocks (one counts as freed if
        its reference count was 1) and detach the leaf. Return the number freed."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.evict`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    def clear(self) -> None:
        """Evict everything that is not locked."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.clear`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    @property
    def num_blocks(self) -> int:
        """Blocks held by the tree."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.num_blocks`: not implemented yet — see ch07_batching.ipynb §7.7"
        )

    @property
    def hit_rate(self) -> float:
        """``hit_tokens / lookup_tokens`` (0 before any lookup)."""
        raise NotImplementedError(
            "Exercise 7.7 `RadixCache.hit_rate`: not implemented yet — see ch07_batching.ipynb §7.7"
        )
