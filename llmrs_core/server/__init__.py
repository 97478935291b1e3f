"""``llmrs serve``: an OpenAI-compatible streaming server over the continuous-batching engine (chapter 11).

One idea per module:

* :mod:`.loop` — the engine loop: one thread owns the engine; handlers submit
  requests through a queue and read per-request streams of outputs; deadlines, slow
  readers, drain and readiness; it reads the engine through ``Engine.step_stats()``;
* :mod:`.supervisor` — a failed or stalled step: the fresh engine, the watchdog, the crash-loop guard;
* :mod:`.faults` — the loop's states (``LoopState``), its errors and what clients are told;
* :mod:`.protocol` — OpenAI's request fields (checked, named in every error) and response shapes;
* :mod:`.sse` — engine outputs -> server-sent events (and the non-streamed answer);
* :mod:`.metrics` — Prometheus metrics with vLLM's names (``llmrs:`` prefix) and buckets;
* :mod:`.tracing` — OpenTelemetry spans per request (queued, prefill, decode), W3C ``traceparent``;
* :mod:`.request_log` — one JSON log line per finished request, and the hook that writes its spans;
* :mod:`.app` — ``create_app(model)``: wires the state, middleware, error handlers and routers;
* :mod:`.routes` — the routes by concern (generation, tokens, probes), reading ``request.app.state``;
* :mod:`.body` — reading a request's JSON body, bounded (``read_json``, ``read_json_object``);
* :mod:`.encode_pool` — the threads that encode prompts, of their own, short text apart from long;
* :mod:`.limits` — what one connection may take: read timeouts, header size, concurrency;
* :mod:`.serve` — uvicorn in the foreground with a graceful SIGTERM drain (and an exit when the
  engine cannot start), or in a thread.

Needs the ``serve`` extra: ``pip install 'llmrs-core[serve]'``.
"""

from .app import create_app
from .loop import (
    EngineDeadError,
    EngineLoop,
    EngineRequest,
    QueueFullError,
    RequestTimeoutError,
    ResponseStream,
    SlowConsumerError,
    StreamError,
)
from .serve import BackgroundServer, serve

__all__ = [
    "BackgroundServer",
    "EngineDeadError",
    "EngineLoop",
    "EngineRequest",
    "QueueFullError",
    "RequestTimeoutError",
    "ResponseStream",
    "SlowConsumerError",
    "StreamError",
    "create_app",
    "serve",
]
