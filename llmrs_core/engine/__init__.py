"""The serving engine (chapter 7): requests, a continuous-batching scheduler, prefix caching.

    scheduler     requests, queues, admission, chunked prefill, preemption
    radix_cache   RadixAttention-style prefix caching over KV blocks
    engine        add_request / abort / step / run: the loop that ties them to the model
    stats         StepStats: the engine after a step, as the server reads it
    interface     what the engine calls on a scheduler and a prefix cache (declared Protocols)
    parts         EngineParts: the classes an engine (and a model's caches) are built from
"""

from .engine import Engine, RequestOutput
from .parts import EngineParts
from .radix_cache import RadixCache
from .scheduler import Request, RequestRejected, RequestStatus, ScheduledChunk, Scheduler
from .stats import RequestStats, StepStats

__all__ = [
    "Engine",
    "EngineParts",
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
