"""What the engine tells its front end after a step (chapters 11, 12): :class:`StepStats`.

The server's metrics, request log, traces and engine loop read the engine through this one
snapshot (``Engine.step_stats``), never through its scheduler, block pool or request table:
vLLM's front end sees its engine's outputs plus a ``SchedulerStats`` (``vllm/v1/metrics/stats.py``)
the same way. A snapshot is plain data: it stays true after the engine moves on or is dropped.

Invariants: ``0 <= kv_blocks_used <= kv_blocks_total``; the three counters are cumulative over
the life of the engine ``engine_id`` names (a fresh engine counts from zero again);
``requests`` holds the requests the caller named that the engine still knows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # engine.py imports this module
    from .engine import RequestMetrics


@dataclass(frozen=True)
class RequestStats:
    """One request as the front end reads it: its sizes, its progress and its times."""

    prompt_tokens: int
    #: the tokens returned to the client so far (an end-of-turn token that ended it is not among them)
    output_token_ids: tuple[int, ...]
    #: tokens of prompt + output whose keys and values are in the cache
    computed_tokens: int
    timing: RequestMetrics
    #: the output text so far (the whole text once the request has finished)
    text: str


@dataclass(frozen=True)
class StepStats:
    """The engine after one iteration of the serving loop (one ``step()``, and the aborts before it)."""

    #: which engine this is (``id(engine)``): its counters below start from zero
    engine_id: int
    #: the ids of the requests in the running batch, and how many wait to run
    running: tuple[str, ...]
    num_waiting: int
    #: KV blocks in some request's block table (blocks kept only by the prefix cache are free:
    #: they are evictable, as in vLLM), and the pool's size
    kv_blocks_used: int
    kv_blocks_total: int
    #: requests preempted; prompt tokens looked up in the prefix cache, and of those found cached
    num_preemptions: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    requests: Mapping[str, RequestStats]

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def kv_cache_usage(self) -> float:
        """The fraction of the pool held by requests, 0..1 (``llmrs:kv_cache_usage_perc``)."""
        return self.kv_blocks_used / self.kv_blocks_total


__all__ = ["RequestStats", "StepStats"]
