"""The serving engine (chapter 7): requests, a continuous-batching scheduler, prefix caching.

    scheduler     requests, queues, admission, chunked prefill, preemption
    radix_cache   RadixAttention-style prefix caching over KV blocks
    engine        add_request / abort / step / run: the loop that ties them to the model
    stats         StepStats: the engine after a step, as the server reads it
"""

from .engine import Engine, RequestOutput
from .radix_cache import RadixCache
from .scheduler import Request, RequestRejected, RequestStatus, ScheduledChunk, Scheduler
from .stats import RequestStats, StepStats

__all__ = [
    "Engine",
    "RadixCache",
    "Request",
    "RequestOutput",
    "RequestRejected",
    "RequestStats",
    "RequestStatus",
    "ScheduledChunk",
    "Scheduler",
    "StepStats",
]
