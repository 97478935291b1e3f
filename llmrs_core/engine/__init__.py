"""The serving engine (chapter 7): requests, a continuous-batching scheduler, prefix caching.

    scheduler     requests, queues, admission, chunked prefill, preemption
    radix_cache   RadixAttention-style prefix caching over KV blocks
    engine        add_request / abort / step / run: the loop that ties them to the model
"""

from .engine import Engine, RequestOutput
from .radix_cache import RadixCache
from .scheduler import Request, RequestRejected, RequestStatus, ScheduledChunk, Scheduler

__all__ = [
    "Engine",
    "RadixCache",
    "Request",
    "RequestOutput",
    "RequestRejected",
    "RequestStatus",
    "ScheduledChunk",
    "Scheduler",
]
