"""The OpenAI-compatible HTTP app (chapter 11): ``create_app(model)`` -> a FastAPI app.

========================  ==========================================================
POST /v1/completions      ``prompt`` (text, token ids, or a list of either); SSE with ``stream``
POST /v1/chat/completions ``messages`` through the model's chat template; SSE with ``stream``
GET  /v1/models           the one served model
POST /tokenize            ``{"prompt"}`` or ``{"messages"}`` -> ``{"tokens", "count", "max_model_len"}``
POST /detokenize          ``{"tokens"}`` -> ``{"prompt"}``
GET  /health              liveness: 200 while the process can serve (loading included); 503 wedged
GET  /ready               readiness: 200 when it takes traffic; 503 loading, draining, restarting, failed
GET  /metrics             Prometheus text (:mod:`.metrics`)
========================  ==========================================================

``create_app`` only wires: the state on ``app.state`` (the engine loop, the metrics, the
request observer, the served model's :class:`~.routes.common.ServingState`), the middleware,
the error handlers and the routers of :mod:`.routes` (by concern). The handlers never run the
model: they check and encode, and submit token ids to the :class:`~.loop.EngineLoop`, whose
thread owns the engine. Every refusal comes before the first byte of the answer, in OpenAI's
error shape: 400 naming the field, 401 without the API key (``/health``, ``/ready`` and
``/metrics`` stay open), 404 ``model_not_found``, 413 past ``max_body_bytes``, 431 past
:mod:`.limits`' header bounds, 429 with ``Retry-After`` past ``max_queue`` waiting sequences,
503 when the engine loop is dead or draining; an unexpected error is a 500 ``internal server
error`` and an ``{"event": "internal_error"}`` log line. Faults (chapter 12.3): a request
failed in the engine gets a 500 (or an error event) with a stable message; a request past
``request_timeout`` a 504; a stream not read past ``stream_buffer`` outputs a request, an error
(408); a step past ``step_timeout`` makes the server unready (503); :mod:`.loop` and
:mod:`.supervisor` have the rest.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import TextIO

from fastapi import FastAPI
from opentelemetry.trace import TracerProvider

from ..engine import Engine, RequestOutput, StepStats
from ..loader import Model
from ..tokenizer import Tokenizer
from .body import MAX_BODY_BYTES
from .encode_pool import EncodePool
from .limits import HeaderLimits
from .loop import EngineLoop
from .metrics import ServerMetrics
from .request_log import RequestObserver
from .routes import ROUTERS
from .routes.common import ServingState, install_error_handlers
from .sse import EventStream, sse_events

#: the most outputs a stream keeps per request for a client that does not read them (then they are aborted)
DEFAULT_STREAM_BUFFER = 256
#: the default bound on sequences waiting for the engine (``--max-queue``): past it, 429 and ``Retry-After``
DEFAULT_MAX_QUEUE = 256


def create_app(
    model: Model,
    *,
    served_model_name: str | None = None,
    max_num_seqs: int = 16,
    num_blocks: int = 512,
    block_size: int = 16,
    max_queue: int | None = DEFAULT_MAX_QUEUE,
    api_key: str | None = None,
    warm_up: bool = True,
    max_body_bytes: int = MAX_BODY_BYTES,
    stream_events: EventStream = sse_events,
    request_log: TextIO | None = None,
    log_prompts: bool = False,
    tracer_provider: TracerProvider | None = None,
    request_timeout: float | None = None,
    step_timeout: float | None = None,
    stream_buffer: int | None = DEFAULT_STREAM_BUFFER,
    max_restarts: int = 3,
    restart_window: float = 60.0,
) -> FastAPI:
    """An app serving ``model`` (which needs a tokenizer) through one continuous-batching engine.

    The engine (``max_num_seqs`` running at once, a pool of ``num_blocks`` KV blocks of
    ``block_size`` tokens, at most ``max_queue`` sequences waiting — ``None``: no bound) is built — and
    with ``warm_up`` its kernels compiled — in the engine-loop thread when the app starts; ``/health``
    is 503 until then. The model's name in the API is ``served_model_name`` (default: the file's stem).
    ``stream_events`` writes the SSE events of streamed answers (Exercise 11.6 plugs the learner's in here).
    Each finished request writes one JSON line to ``request_log`` (prompts and outputs only with
    ``log_prompts``) and its spans to ``tracer_provider`` (default: the global one).

    Faults (:mod:`.loop`): ``request_timeout`` seconds is every request's deadline (``None``: none);
    ``step_timeout`` seconds, the most one engine step may take before the server goes unready
    (``None``: no watchdog); ``stream_buffer``, the most outputs a stream keeps per request for a client
    not reading them; ``max_restarts`` fresh engines within ``restart_window`` s (then a failure is final).
    """
    for what, value in (("request_timeout", request_timeout), ("step_timeout", step_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{what} must be > 0 seconds, got {value}")
    tokenizer = model.tokenizer  # ValueError now if the model has none: a server needs text
    name = served_model_name or model.path.stem
    metrics = ServerMetrics(name, model.config.context_length)
    observer = RequestObserver(name, request_log, log_prompts, tracer_provider)
    on_step, on_failure = _observers(metrics, observer)
    engine_loop = EngineLoop(_engine_factory(model, tokenizer, warm_up, num_blocks, block_size, max_num_seqs),
                             max_queue=max_queue, on_step=on_step, max_buffered=stream_buffer,
                             step_timeout=step_timeout, max_restarts=max_restarts, restart_window=restart_window,
                             on_failure=on_failure)
    app = FastAPI(title="llmrs", version="1", lifespan=_lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(HeaderLimits)  # 431 past MAX_HEADERS header lines or MAX_HEADER_BYTES (.limits)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics
    app.state.observer = observer
    app.state.served_model_name = name
    app.state.serving = ServingState(name, tokenizer, model.config, api_key, max_body_bytes, request_timeout,
                                     stream_events, created=int(time.time()))
    install_error_handlers(app)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _observers(metrics: ServerMetrics, observer: RequestObserver
               ) -> tuple[Callable[[list[RequestOutput], StepStats], None], Callable[[dict], None]]:
    """The engine loop's ``on_step`` (metrics, then log lines and traces) and ``on_failure``
    (``llmrs:engine_restarts_total`` for a restart, and the record's log line)."""

    def on_step(outputs: list[RequestOutput], stats: StepStats) -> None:
        metrics.observe_step(outputs, stats)
        observer.observe_step(outputs, stats)

    def on_failure(record: dict) -> None:
        if record.get("action") == "restart":
            metrics.observe_restart()
        observer.log_event(record)

    return on_step, on_failure


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    """The encoding pool and the engine loop live while the app runs."""
    encoder = app.state.encoder = EncodePool()
    app.state.engine_loop.start()
    try:
        yield
    finally:
        app.state.engine_loop.stop()
        encoder.shutdown()


def _engine_factory(model: Model, tokenizer: Tokenizer, warm_up: bool, num_blocks: int, block_size: int,
                    max_num_seqs: int) -> Callable[[], Engine]:
    """What the engine loop calls, in its thread, for its engine and for each fresh one after a failure."""
    built = []

    def make_engine() -> Engine:
        if warm_up and not built:  # a restart reuses the compiled kernels: only the engine state is new
            model.warm_up()
            _warm_up_engine(model, block_size)
        built.append(1)
        return Engine(model.network, tokenizer, num_blocks=num_blocks, block_size=block_size,
                      max_num_seqs=max_num_seqs, policy="priority", parts=model.parts)  # round-robin across calls (.loop)

    return make_engine


def _warm_up_engine(model: Model, block_size: int) -> None:
    """Two throwaway requests, batched, through a small engine of their own: ``model.warm_up``
    compiles the dense products, this the paged-attention prefill and decode and the batched
    step the server runs, so that ``/ready`` means the first request computes, not compiles
    (a few seconds on an empty Numba cache). The server's engine starts fresh: no metrics,
    prefix-cache counters or request ids of these."""
    engine = Engine(model.network, model.tokenizer, num_blocks=8, block_size=block_size, max_num_seqs=2,
                    prefix_caching=False, parts=model.parts)
    for n in (3, block_size + 2):  # one prompt inside a block, one across a block boundary
        engine.add_request([0] * n, max_tokens=3, ignore_eos=True)
    for _ in engine.run():
        pass


__all__ = ["DEFAULT_MAX_QUEUE", "DEFAULT_STREAM_BUFFER", "create_app"]
