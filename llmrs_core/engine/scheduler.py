"""Requests and the continuous-batching scheduler (chapter 7).

Every engine step the scheduler decides who runs and how many tokens each
computes, under three limits: at most ``max_num_seqs`` running requests, at
most ``max_num_batched_tokens`` tokens in the step (decode tokens and
prefill chunks together — *chunked prefill*), and the KV blocks free in the
pool. Running requests go first (one decode token each, or the next chunk
of their prompt); then waiting requests are admitted in policy order (FCFS,
or priority: lower number first, then arrival).

When a running request needs a block and none is free, the scheduler first
evicts unlocked prefix-cache entries, then **preempts** the newest running
request: its blocks are freed and it goes back to the front of the queue, to
be recomputed from its tokens later (vLLM's recompute policy). A request
that could never fit in the whole pool is rejected when it arrives, instead
of waiting forever.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

from ..kv_cache.paged import OutOfBlocksError, PagedKVCache, blocks_for
from .radix_cache import RadixCache, RadixNode


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"
    REJECTED = "rejected"


class RequestRejected(ValueError):
    """A request can never be served (too long for the pool or the model); the message says why."""


_arrivals = itertools.count()


@dataclass(eq=False)
class Request:
    """One generation request and its progress.

    ``num_computed`` counts the tokens of ``prompt_ids + output_ids`` whose
    keys and values are in the cache; the next step computes from there.
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    priority: int = 0
    arrival: int = field(default_factory=lambda: next(_arrivals))
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    prefix_node: RadixNode | None = None

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def finished(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED, RequestStatus.REJECTED)


@dataclass(frozen=True)
class ScheduledChunk:
    """``request`` computes ``n_tokens`` tokens from ``request.num_computed`` in this step."""

    request: Request
    n_tokens: int


class Scheduler:
    """Waiting and running queues over one paged KV cache (and optionally a prefix cache)."""

    def __init__(
        self,
        cache: PagedKVCache,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        policy: str = "fcfs",
        prefix_cache: RadixCache | None = None,
    ):
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"unknown scheduling policy {policy!r}; use 'fcfs' or 'priority'")
        if max_num_seqs <= 0 or max_num_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be positive")
        self.cache = cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.prefix_cache = prefix_cache
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.num_preemptions = 0

    # -- arrivals and departures ---------------------------------------------------

    def add(self, request: Request) -> None:
        """Queue ``request``; raise ``RequestRejected`` if it could never fit in the pool."""
        bs = self.cache.block_size
        needed = blocks_for(len(request.prompt_ids) + request.max_tokens, bs)
        total = self.cache.allocator.num_blocks
        if needed > total:
            request.status = RequestStatus.REJECTED
            request.finish_reason = "rejected"
            raise RequestRejected(
                f"request {request.request_id}: {len(request.prompt_ids)} prompt + {request.max_tokens} "
                f"new tokens need {needed} KV blocks of {bs}, but the whole pool has {total}"
            )
        request.status = RequestStatus.WAITING
        self.waiting.append(request)

    def _release(self, request: Request, remember: bool) -> None:
        """Return a request's blocks; with ``remember``, first hand its full blocks to the prefix cache."""
        rid = request.request_id
        if rid in self.cache.tables:
            if remember and self.prefix_cache is not None:
                self.prefix_cache.insert(request.all_ids[: request.num_computed], self.cache.tables[rid])
            self.cache.free(rid)
        if request.prefix_node is not None and self.prefix_cache is not None:
            self.prefix_cache.unlock(request.prefix_node)
        request.prefix_node = None

    def cache_prompt(self, request: Request) -> None:
        """Offer a request's freshly computed prompt blocks to the prefix cache.

        Called when its prefill completes, so requests admitted after it can
        share the prompt while it is still running (not only once it ends).
        """
        if self.prefix_cache is not None and request.request_id in self.cache.tables:
            self.prefix_cache.insert(request.prompt_ids[: request.num_computed], self.cache.tables[request.request_id])

    def finish(self, request: Request, reason: str) -> None:
        self.running.remove(request)
        request.status, request.finish_reason = RequestStatus.FINISHED, reason
        self._release(request, remember=True)

    def abort(self, request: Request) -> None:
        """Stop ``request`` now, wherever it is, and free every block it holds."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        else:
            return
        request.status, request.finish_reason = RequestStatus.ABORTED, "abort"
        self._release(request, remember=False)

    def preempt(self, request: Request) -> None:
        """Free ``request``'s blocks and requeue it first; it will be recomputed.

        Its blocks are not handed to the prefix cache: preemption is for
        freeing memory, and cached blocks would keep it.
        """
        self.running.remove(request)
        self._release(request, remember=False)
        request.num_computed = 0
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.insert(0, request)

    # -- one step ---------------------------------------------------------------------

    def _reserve(self, request: Request, n: int) -> bool:
        """Blocks for ``n`` more tokens of ``request``, evicting cached prefixes if needed."""
        rid = request.request_id
        if rid not in self.cache.tables:
            self.cache.add_sequence(rid)
        if not self.cache.can_append(rid, n) and self.prefix_cache is not None:
            self.prefix_cache.evict(max(1, n // self.cache.block_size + 1))
        try:
            self.cache.reserve(rid, n)
            return True
        except OutOfBlocksError:
            return False

    def _next_waiting(self) -> Request:
        if self.policy == "priority":
            return min(self.waiting, key=lambda r: (r.priority, r.arrival))
        return self.waiting[0]

    def _match_prefix(self, request: Request) -> None:
        if self.prefix_cache is None or request.num_computed:
            return
        matched, blocks, node = self.prefix_cache.match_prefix(request.all_ids)
        if not matched:
            return
        rid = request.request_id
        self.cache.add_sequence(rid)
        for b in blocks:
            self.cache.allocator.incref(b)
        self.cache.tables[rid] = list(blocks)
        self.cache.lengths[rid] = matched
        request.num_computed = matched
        request.prefix_node = node
        self.prefix_cache.lock(node)

    def schedule(self) -> list[ScheduledChunk]:
        """Pick this step's work; reserves the KV blocks it needs."""
        budget = self.max_num_batched_tokens
        chunks: list[ScheduledChunk] = []
        for request in list(self.running):
            if budget == 0:
                break
            if request not in self.running:  # preempted below, for an older request
                continue
            n = min(request.num_tokens - request.num_computed, budget)
            while not self._reserve(request, n):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is request:
                    break
            else:
                chunks.append(ScheduledChunk(request, n))
                budget -= n
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self._next_waiting()
            self._match_prefix(request)
            n = min(request.num_tokens - request.num_computed, budget)
            if not self._reserve(request, n):
                self._release(request, remember=False)
                request.num_computed = 0
                break  # wait for blocks to come back
            self.waiting.remove(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            chunks.append(ScheduledChunk(request, n))
            budget -= n
        return chunks

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

