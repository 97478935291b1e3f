"""The OpenAI-compatible HTTP app (chapter 11): ``create_app(model)`` -> a FastAPI app.

Routes:

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

The handlers never run the model: they parse and check the body
(:mod:`.protocol`), refuse text that cannot fit the context in O(n) before
anything renders or encodes it (``validation.precheck_text``/``precheck_chat``:
every string a chat template sees, and ``/tokenize``'s text), encode the prompt
in the encoding pool (:mod:`.encode_pool`: threads of its own, short text apart
from long) — completions'
text with special-token text kept as text (``allow_special=False``), chat
messages through ``Tokenizer.encode_chat`` (only the template makes control
tokens) — and submit token ids to the :class:`~.loop.EngineLoop`, whose
thread owns the engine. Every refusal happens before the first byte of the
answer, in OpenAI's error shape: 400 naming the field, 401 without the API
key (``/health``, ``/ready`` and ``/metrics`` stay open), 404 ``model_not_found``, 413 for
a body over ``max_body_bytes``, 431 for headers past :mod:`.limits`' bounds, 429 with ``Retry-After`` past ``max_queue``
waiting requests (:data:`DEFAULT_MAX_QUEUE` unless told otherwise), 503 when the
engine loop is dead or draining. A client that disconnects, streaming or not,
aborts its requests before the next engine step.

One client cannot hold the engine for the others: a call brings at most
``protocol.MAX_SEQUENCES`` sequences (prompts × ``n``) and at most
``validation.MAX_STOP_STRINGS`` stop strings, and the engine (policy
``"priority"``) admits the sequences of concurrent calls round-robin: the k-th
sequence of a call has priority k (:mod:`.loop`, Fairness).

Faults (chapter 12.3, :mod:`.loop`): a request that failed in the engine gets a
500 (or an error event in its stream, then ``[DONE]``) with a stable message
and code (its error, with the exception, goes to the request log only; any
other unexpected error is a 500 ``internal server error`` and an
``{"event": "internal_error"}`` line); if the model fails a probe too, the loop restarts
with a fresh engine (``llmrs:engine_restarts_total``; one JSON line
``{"event": "engine_failure", ...}`` with the step's batch in the request log,
or on stderr without one); a request past ``request_timeout`` a 504; a stream
whose client does not read it, past ``stream_buffer`` outputs a request, an error (408)
and its requests aborted; a step past ``step_timeout`` makes the server
unready and fails what is in flight (503).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
import traceback
from collections.abc import AsyncIterator
from typing import Any, TextIO

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry.trace import TracerProvider
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..engine import Engine
from ..loader import Model
from ..tokenizer.messages import check_template_kwargs, check_tools
from ..validation import check_fits_context, check_token_ids, precheck_chat, precheck_text, prompt_ids
from .encode_pool import EncodePool, text_size
from .limits import HeaderLimits
from .loop import ENGINE_FAILED, EngineLoop, EngineRequest, QueueFullError, StreamError
from .metrics import ServerMetrics
from .protocol import (
    APIError,
    GenerationRequest,
    error_body,
    new_id,
    parse_chat_request,
    parse_completion_request,
)
from .request_log import RequestObserver
from .sse import EventStream, StreamInfo, collect, sse_events
from .tracing import context_from_headers

#: the most outputs a stream keeps per request for a client that does not read them (then they are aborted)
DEFAULT_STREAM_BUFFER = 256
#: the default generation budget of /v1/completions (OpenAI's and vLLM's); chat's is the rest of the context
DEFAULT_COMPLETION_MAX_TOKENS = 16
MAX_BODY_BYTES = 8 * 2**20
#: the default bound on sequences waiting for the engine (``--max-queue``): past it, 429 and ``Retry-After``
DEFAULT_MAX_QUEUE = 256
#: the message of a 500 for an unexpected error (the exception goes to the log, never to a client)
INTERNAL_ERROR = "internal server error (the server's log has the details)"


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
    ``block_size`` tokens, at most ``max_queue`` sequences waiting — ``None``: no bound) is built — and with ``warm_up`` its kernels compiled — in the
    engine-loop thread when the app starts; ``/health`` is 503 until then. The model's
    name in the API is ``served_model_name`` (default: the file's stem). ``stream_events``
    writes the SSE events of streamed answers (Exercise 11.6 plugs the learner's in here).
    Each finished request writes one JSON line to ``request_log`` (prompts and outputs
    only with ``log_prompts``) and its spans to ``tracer_provider`` (default: the global
    one) — :mod:`.request_log`, :mod:`.tracing`.

    Faults (:mod:`.loop`): ``request_timeout`` seconds is every request's deadline
    (``None``: none); ``step_timeout`` seconds, the most one engine step may take before
    the server goes unready (``None``: no watchdog); ``stream_buffer``, the most outputs
    a stream keeps per request for a client that does not read them; ``max_restarts`` fresh engines
    within ``restart_window`` seconds, after which an engine failure is final.
    """
    for what, value in (("request_timeout", request_timeout), ("step_timeout", step_timeout)):
        if value is not None and not value > 0:
            raise ValueError(f"{what} must be > 0 seconds, got {value}")
    tokenizer = model.tokenizer  # ValueError now if the model has none: a server needs text
    name = served_model_name or model.path.stem
    config = model.config
    metrics = ServerMetrics(name, config.context_length)
    observer = RequestObserver(name, request_log, log_prompts, tracer_provider)

    def on_step(engine: Engine, outputs: list) -> None:
        metrics.observe_step(engine, outputs)
        observer.observe_step(engine, outputs)

    built = []

    def make_engine() -> Engine:
        if warm_up and not built:  # a restart reuses the compiled kernels: only the engine state is new
            model.warm_up()
            _warm_up_engine(model, block_size)
        built.append(1)
        return Engine(model.network, tokenizer, num_blocks=num_blocks, block_size=block_size,
                      max_num_seqs=max_num_seqs, policy="priority", parts=model.parts)  # round-robin across calls (.loop)

    def on_failure(record: dict) -> None:
        if record.get("action") == "restart":
            metrics.observe_restart()
        observer.log_event(record)

    engine_loop = EngineLoop(make_engine, max_queue=max_queue, on_step=on_step, max_buffered=stream_buffer,
                             step_timeout=step_timeout, max_restarts=max_restarts, restart_window=restart_window,
                             on_failure=on_failure)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        encoder = app.state.encoder = EncodePool()
        engine_loop.start()
        try:
            yield
        finally:
            engine_loop.stop()
            encoder.shutdown()

    app = FastAPI(title="llmrs", version="1", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(HeaderLimits)  # 431 past MAX_HEADERS header lines or MAX_HEADER_BYTES (.limits)
    app.state.engine_loop = engine_loop
    app.state.metrics = metrics
    app.state.observer = observer
    app.state.served_model_name = name

    # -- errors, in OpenAI's shape -------------------------------------------------------

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail), "invalid_request_error", code=e.status_code),
                            status_code=e.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        """A bug: the client gets a stable message; the exception and its traceback go to the log."""
        observer.log_event({"event": "internal_error", "time": round(time.time(), 3), "method": request.method,
                            "path": request.url.path, "error": f"{type(e).__name__}: {e}",
                            "traceback": "".join(traceback.format_exception(e))})
        return JSONResponse(error_body(INTERNAL_ERROR, "server_error", code=500), status_code=500)

    async def authorised(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise APIError(401, "a valid API key is required: Authorization: Bearer KEY", code="invalid_api_key")

    guarded = [Depends(authorised)]

    # -- generation ---------------------------------------------------------------------

    def check_model(req: GenerationRequest | dict) -> None:
        asked = req.model if isinstance(req, GenerationRequest) else req.get("model")
        if asked is not None and asked != name:
            raise APIError(404, f"the model {asked!r} does not exist; this server serves {name!r}",
                           param="model", code="model_not_found")

    def prechecked(req: GenerationRequest, chat: bool) -> None:
        """Refuse text that cannot fit the context before it is rendered or encoded: O(n), on the
        event loop, so a huge prompt is a 400 at once and never waits for (or holds) an encoder."""
        for i, prompt in enumerate(req.prompts):
            where = f"prompt {i}: " if len(req.prompts) > 1 else ""
            try:
                if chat:
                    precheck_chat(prompt, tokenizer, config.context_length, req.max_tokens or 1, req.template_data)
                elif isinstance(prompt, str):
                    precheck_text([prompt], tokenizer, config.context_length,
                                  req.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS)
            except ValueError as e:
                raise APIError(400, f"{where}{e}", param="messages" if chat else "prompt") from None

    def encode(req: GenerationRequest, chat: bool) -> list[tuple[list[int], int]]:
        """Each prompt's token ids and generation budget, checked (runs in a worker thread)."""
        param = "messages" if chat else "prompt"
        out = []
        for i, prompt in enumerate(req.prompts):
            where = f"prompt {i}: " if len(req.prompts) > 1 else ""
            try:
                if chat:
                    ids = tokenizer.encode_chat(prompt, tools=req.tools, chat_template_kwargs=req.chat_template_kwargs)
                    max_tokens = req.max_tokens if req.max_tokens is not None else max(
                        config.context_length - len(ids), 1)
                    ids = check_token_ids(ids, config.vocab_size)
                    check_fits_context(len(ids), max_tokens, config.context_length)
                else:
                    max_tokens = req.max_tokens if req.max_tokens is not None else DEFAULT_COMPLETION_MAX_TOKENS
                    ids = prompt_ids(prompt, tokenizer, config.vocab_size, config.context_length, max_tokens,
                                     allow_special=False)
            except ValueError as e:
                raise APIError(400, f"{where}{e}", param=param) from None
            out.append((ids, max_tokens))
        return out

    async def generate(request: Request, chat: bool) -> Response:
        body = await read_json(request, max_body_bytes)
        req = parse_chat_request(body) if chat else parse_completion_request(body)
        check_model(req)
        prechecked(req, chat)
        encoded = await request.app.state.encoder.run(text_size([req.prompts, req.template_data]), encode, req, chat)
        response_id = new_id("chatcmpl" if chat else "cmpl")
        requests, choice_of, prompt_of = [], {}, {}
        for p, (ids, max_tokens) in enumerate(encoded):
            for j in range(req.n):
                rid = f"{response_id}-{p * req.n + j}"
                choice_of[rid] = p * req.n + j
                prompt_of[rid] = req.prompts[p]
                requests.append(EngineRequest(rid, ids, max_tokens, req.sampling_for(j), req.stop, req.ignore_eos,
                                              req.logprobs, priority=p * req.n + j))
        client = f"{request.client.host}:{request.client.port}" if request.client else ""
        observer.register(list(choice_of), client, context_from_headers(request.headers), prompt_of)
        if req.n > 1:  # the n choices of a prompt count its tokens once, as usage.prompt_tokens does
            for p in range(len(encoded)):
                metrics.share_prompt([r.request_id for r in requests[p * req.n:(p + 1) * req.n]])
        try:
            try:
                stream = await engine_loop.submit(requests, timeout=request_timeout, bounded=req.stream)
            except BaseException:
                observer.discard(list(choice_of))
                metrics.forget(list(choice_of))
                raise
        except QueueFullError as e:
            raise APIError(429, str(e), code="rate_limit_exceeded", headers={"Retry-After": "1"}) from None
        except StreamError as e:  # draining or dead (503), past the deadline already (504)
            raise APIError(e.status, str(e)) from None
        except ValueError as e:  # RequestRejected: can never fit the pool, say
            raise APIError(400, str(e), param="max_tokens") from None
        info = StreamInfo(response_id, req.created, name, chat, choice_of, sum(len(ids) for ids, _ in encoded),
                          tokenizer.token_bytes)
        if req.stream:
            async def events() -> AsyncIterator[bytes]:
                try:  # closing the events closes the writer at once (its finally aborts what is unfinished)
                    async with contextlib.aclosing(
                            stream_events(stream, info, req.include_usage, engine_loop.abort)) as writer:
                        async for event in writer:
                            if not isinstance(event, bytes):  # a plugged-in writer (Exercise 11.6) gone wrong
                                raise TypeError(f"the stream writer (stream_events: Exercise 11.6's sse_events "
                                                f"when plugged in) yielded {type(event).__name__}, not the "
                                                "bytes of one SSE event")
                            yield event
                finally:
                    stream.close()  # its deadline, if any, is over

            return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        answer = asyncio.ensure_future(collect(stream, info))
        gone = asyncio.ensure_future(wait_disconnect(request))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:  # the client left (or this handler was cancelled): stop its requests in the engine
            gone.cancel()
            stream.close()
            if not answer.done():
                answer.cancel()
                engine_loop.abort(stream.unfinished)
        if not answer.done() or answer.cancelled():
            return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
        try:
            return JSONResponse(answer.result())
        except StreamError as e:  # dead or stalled (503), its deadline (504)
            raise APIError(e.status, str(e)) from None
        except RuntimeError as e:  # the request failed in the engine (a stable message: .loop.REQUEST_FAILED)
            raise APIError(500, str(e), code=500) from None

    @app.post("/v1/completions", dependencies=guarded)
    async def completions(request: Request) -> Response:
        return await generate(request, chat=False)

    @app.post("/v1/chat/completions", dependencies=guarded)
    async def chat_completions(request: Request) -> Response:
        return await generate(request, chat=True)

    # -- the rest -----------------------------------------------------------------------

    @app.get("/v1/models", dependencies=guarded)
    async def models() -> dict:
        card = {"id": name, "object": "model", "created": started, "owned_by": "llmrs",
                "max_model_len": config.context_length}
        return {"object": "list", "data": [card]}

    @app.post("/tokenize", dependencies=guarded)
    async def tokenize(request: Request) -> dict:
        body = await read_json(request, max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        unknown = set(body) - {"model", "prompt", "messages", "tools", "chat_template_kwargs"}
        if unknown:
            raise APIError(400, f"{sorted(unknown)[0]!r} is not supported by /tokenize", param=sorted(unknown)[0])
        check_model(body)
        if ("prompt" in body) == ("messages" in body):
            raise APIError(400, "give either prompt (text) or messages", param="prompt")
        data: dict = {}
        if "messages" in body:
            for field_name, check in (("tools", check_tools), ("chat_template_kwargs", check_template_kwargs)):
                try:
                    data[field_name] = check(body.get(field_name))
                except ValueError as e:
                    raise APIError(400, str(e), param=field_name) from None
        elif "tools" in body or "chat_template_kwargs" in body:
            raise APIError(400, "tools and chat_template_kwargs go with messages, not prompt", param="prompt")

        def run() -> list[int]:
            try:
                if "messages" in body:
                    return tokenizer.encode_chat(body["messages"], **data)
                if not isinstance(body["prompt"], str):
                    raise ValueError(f"prompt must be text, got {type(body['prompt']).__name__}")
                return tokenizer.encode(body["prompt"], allow_special=False)
            except ValueError as e:
                raise APIError(400, str(e), param="messages" if "messages" in body else "prompt") from None

        try:  # text too long for the context is refused before it is encoded, here on the event loop
            if "messages" in body:
                precheck_chat(body["messages"], tokenizer, config.context_length, 0, data)
            elif isinstance(body["prompt"], str):
                precheck_text([body["prompt"]], tokenizer, config.context_length, 0)
        except ValueError as e:
            raise APIError(400, str(e), param="messages" if "messages" in body else "prompt") from None
        ids = await request.app.state.encoder.run(text_size([body.get("messages") or body["prompt"], data]), run)
        return {"tokens": ids, "count": len(ids), "max_model_len": config.context_length}

    @app.post("/detokenize", dependencies=guarded)
    async def detokenize(request: Request) -> dict:
        body = await read_json(request, max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        unknown = set(body) - {"model", "tokens"}
        if unknown:
            raise APIError(400, f"{sorted(unknown)[0]!r} is not supported by /detokenize", param=sorted(unknown)[0])
        check_model(body)
        tokens = body.get("tokens")
        if tokens == []:
            return {"prompt": ""}
        try:
            ids = check_token_ids(tokens, config.vocab_size, what="tokens")
        except ValueError as e:
            raise APIError(400, str(e), param="tokens") from None
        return {"prompt": tokenizer.decode(ids)}

    def status_body(state: str) -> dict:
        """The probes' body: the state, restarts, and for a failed loop the stable ENGINE_FAILED (the
        reason itself, which may name a request and its error, is in the log: probes are public)."""
        body: dict = {"status": state}
        if engine_loop.restarts:
            body["restarts"] = engine_loop.restarts
        if engine_loop.error is not None:
            body["error"] = ENGINE_FAILED
        return body

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness: 503 only when the process cannot serve again without a restart."""
        state = engine_loop.state
        if engine_loop.wedged:
            return JSONResponse(status_body(state), status_code=503)
        return JSONResponse({"status": "ok"} if state == "ready" else status_body(state))

    @app.get("/ready")
    async def ready() -> JSONResponse:
        """Readiness: 200 only while requests are taken."""
        if engine_loop.accepting:
            return JSONResponse(status_body("ready"))
        return JSONResponse(status_body(engine_loop.state), status_code=503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=ServerMetrics.CONTENT_TYPE)

    started = int(time.time())
    return app


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


async def read_json(request: Request, max_bytes: int) -> Any:
    """The body as JSON; 413 past ``max_bytes`` (read no further), 400 if it is not JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise APIError(413, f"the request body is {int(declared):,} bytes; the limit is {max_bytes:,}")
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise APIError(413, f"the request body is over the limit of {max_bytes:,} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # gone before its body was in (or cut off by the body timeout): no traceback
        raise APIError(400, f"the client disconnected after {size:,} bytes of its body") from None
    try:
        return json.loads(b"".join(chunks))
    except (ValueError, RecursionError) as e:  # JSONDecodeError and bad UTF-8 are ValueErrors
        raise APIError(400, f"the request body is not valid JSON: {e}") from None


async def wait_disconnect(request: Request) -> None:
    """Return when the client has gone away (for a request whose body was read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


__all__ = ["create_app"]
