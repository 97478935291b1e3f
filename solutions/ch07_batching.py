"""Chapter 7 solutions: the engine's scheduler and radix prefix cache (llmrs_core.engine)."""

from llmrs_core.engine.radix_cache import RadixCache, RadixNode
from llmrs_core.engine.scheduler import Request, RequestRejected, RequestStatus, ScheduledChunk, Scheduler
from llmrs_core.kv_cache.paged import OutOfBlocksError

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
