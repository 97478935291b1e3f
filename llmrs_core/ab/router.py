"""The A/B router (chapter 12, section 12.4): one OpenAI-compatible front for several variants.

``create_router(upstreams)`` -> a FastAPI app, its own process in front of one
server per variant (``llmrs ab serve`` starts them). For each
``/v1/chat/completions`` or ``/v1/completions`` request it

1. picks the variant from the request's ``user`` (sticky and weighted:
   :mod:`llmrs_core.ab.assign`; without ``user``, a weighted random draw);
2. forwards the body with httpx to that variant's server, its ``model`` set to
   the model that server serves (asked once from its ``/v1/models``), and for
   a stream ``stream_options.include_usage`` on, so the router learns the
   token count (the usage chunk is passed on only if the client asked for it);
3. answers with the upstream's status and body, and an ``x-llmrs-variant: NAME``
   header; records the request (:mod:`llmrs_core.ab.record`) and its metrics
   (:mod:`llmrs_core.ab.metrics`, ``variant`` label).

An upstream that cannot be reached gives the client a 502 naming the variant;
one that does not answer within ``timeout`` seconds, a 504; one that breaks
in the middle of a stream, an error event (``data: {"error": ...}``) and the
end of the stream. Never a hang. ``/health``: the router is alive (200);
``/ready``: every variant's ``/ready`` (or, for a server without one, ``/health``)
answers 200 (else 503, naming which).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import TextIO

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ..server.body import MAX_BODY_BYTES, read_json
from ..server.protocol import APIError, error_body
from .assign import assign, check_weights, user_hash
from .metrics import RouterMetrics
from .record import RecordWriter, RequestRecord
from .variants import Upstream, check_variants

VARIANT_HEADER = "x-llmrs-variant"
#: request headers passed on to the upstream (the rest are the router's own connection's)
FORWARDED_HEADERS = ("authorization", "traceparent", "tracestate")


def _content(event: dict) -> str:
    """The text an SSE chunk carries (chat ``delta.content`` or completions ``text``)."""
    text = ""
    for choice in event.get("choices") or ():
        delta = choice.get("delta")
        text += (delta.get("content") or "") if isinstance(delta, dict) else (choice.get("text") or "")
    return text


def create_router(
    upstreams: Sequence[Upstream],
    *,
    salt: str = "",
    served_model_name: str = "ab",
    request_log: TextIO | None = None,
    timeout: float = 300.0,
    connect_timeout: float = 5.0,
    max_body_bytes: int = MAX_BODY_BYTES,
    rng: random.Random | None = None,
) -> FastAPI:
    """A router over ``upstreams`` (:class:`~llmrs_core.ab.variants.Upstream`: name, base URL, weight).

    ``salt`` makes this experiment's split independent of another's; ``served_model_name``
    is the model clients name (``null`` also accepted); ``request_log`` gets one JSON line
    per request; ``timeout``: seconds an upstream may take to send its next byte;
    ``rng``: the draws of requests without ``user`` (default: a fresh generator).
    """
    check_variants(upstreams)
    by_name = {u.name: u for u in upstreams}
    weights = check_weights({u.name: u.weight for u in upstreams})
    metrics = RouterMetrics(weights)
    writer = RecordWriter(request_log)
    rng = rng or random.Random()
    upstream_model: dict[str, str] = {}
    clients: dict[str, httpx.AsyncClient] = {}
    limits = httpx.Timeout(timeout, connect=connect_timeout)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for u in upstreams:
            clients[u.name] = httpx.AsyncClient(base_url=u.url, timeout=limits, trust_env=False)
        try:
            yield
        finally:
            for c in clients.values():
                await c.aclose()

    app = FastAPI(title="llmrs ab", version="1", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics
    app.state.upstreams = by_name

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    def failure(rec: RequestRecord, status: int, reason: str, message: str) -> JSONResponse:
        rec.status, rec.error = status, message
        rec.e2e_s = None
        metrics.observe(rec, reason)
        writer.write(rec)
        return JSONResponse(error_body(message, "server_error", code=reason), status_code=status,
                            headers={VARIANT_HEADER: rec.variant})

    def unreachable(rec: RequestRecord, e: httpx.HTTPError) -> JSONResponse:
        u = by_name[rec.variant]
        if isinstance(e, httpx.TimeoutException):
            return failure(rec, 504, "upstream_timeout",
                           f"variant {u.name!r} ({u.url}) did not answer within {timeout:g} s ({type(e).__name__})")
        return failure(rec, 502, "upstream_unavailable",
                       f"variant {u.name!r} ({u.url}) is unavailable: {type(e).__name__}: {e}".rstrip(": "))

    async def model_of(name: str) -> str:
        """The model the variant's server serves (its first in /v1/models), asked once."""
        if name not in upstream_model:
            r = await clients[name].get("/v1/models", timeout=min(timeout, 10.0))
            r.raise_for_status()
            upstream_model[name] = r.json()["data"][0]["id"]
        return upstream_model[name]

    async def proxy(request: Request, endpoint: str) -> Response:
        arrival = time.perf_counter()
        body = await read_json(request, max_body_bytes)
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        user = body.get("user")
        if user is not None and not isinstance(user, str):
            raise APIError(400, f"user must be a string, got {type(user).__name__}", param="user")
        asked = body.get("model")
        if asked is not None and asked != served_model_name:
            raise APIError(404, f"the model {asked!r} does not exist; this router serves {served_model_name!r}",
                           param="model", code="model_not_found")
        stream = body.get("stream") is True
        name = assign(user, weights, salt, rng)
        rec = RequestRecord(name, None if user is None else user_hash(user, salt),
                            "chat" if endpoint.endswith("chat/completions") else "completions", stream,
                            time=time.time())
        client = clients[name]
        try:
            body["model"] = await model_of(name)
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
            if isinstance(e, httpx.HTTPError):
                return unreachable(rec, e)
            return failure(rec, 502, "upstream_unavailable",
                           f"variant {name!r} ({by_name[name].url}): /v1/models gave no model ({type(e).__name__})")
        wants_usage = False
        if stream:
            options = body.get("stream_options")
            wants_usage = isinstance(options, dict) and options.get("include_usage") is True
            body["stream_options"] = {**(options if isinstance(options, dict) else {}), "include_usage": True}
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        upstream_request = client.build_request("POST", endpoint, json=body, headers=headers)
        try:
            response = await client.send(upstream_request, stream=True)
        except httpx.HTTPError as e:
            return unreachable(rec, e)
        rec.status = response.status_code
        if response.status_code != 200 or not stream:
            try:
                content = await response.aread()
            except httpx.HTTPError as e:
                return unreachable(rec, e)
            finally:
                await response.aclose()
            rec.e2e_s = time.perf_counter() - arrival
            reason = None
            if response.status_code == 200:
                with contextlib.suppress(ValueError, AttributeError, TypeError):
                    usage = json.loads(content).get("usage") or {}
                    rec.prompt_tokens, rec.completion_tokens = usage.get("prompt_tokens"), usage.get("completion_tokens")
            else:
                reason = f"http_{response.status_code // 100}xx"
                rec.error = content[:500].decode("utf-8", errors="replace")
            metrics.observe(rec, reason)
            writer.write(rec)
            return Response(content, status_code=response.status_code,
                            media_type=response.headers.get("content-type", "application/json"),
                            headers={VARIANT_HEADER: name})
        return StreamingResponse(relay(response, rec, arrival, wants_usage), media_type="text/event-stream",
                                 headers={VARIANT_HEADER: name, "Cache-Control": "no-cache"})

    async def relay(response: httpx.Response, rec: RequestRecord, arrival: float,
                    wants_usage: bool) -> AsyncIterator[bytes]:
        """The upstream's SSE events, passed on one by one, timed; the usage chunk only if asked for."""
        first = last = None
        reason = None
        done = False  # data: [DONE] passed on: a client leaving after it left nothing unread
        lines: list[str] = []
        try:
            async for line in response.aiter_lines():
                if line:
                    lines.append(line)
                    continue
                if not lines:
                    continue
                event, lines = "\n".join(lines), []
                data = event[len("data: "):] if event.startswith("data: ") else None
                payload = None
                if data is not None and data != "[DONE]":
                    with contextlib.suppress(ValueError):
                        payload = json.loads(data)
                if isinstance(payload, dict):
                    if "error" in payload:
                        reason, rec.error = "upstream_error", json.dumps(payload["error"])[:500]
                    elif _content(payload):
                        last = time.perf_counter()
                        first = first or last
                    usage = payload.get("usage")
                    if isinstance(usage, dict) and not payload.get("choices"):
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        rec.completion_tokens = usage.get("completion_tokens")
                        if not wants_usage:
                            continue
                done = done or data == "[DONE]"
                yield (event + "\n\n").encode("utf-8")
        except httpx.HTTPError as e:
            u = by_name[rec.variant]
            reason = "upstream_timeout" if isinstance(e, httpx.TimeoutException) else "upstream_broke"
            rec.error = f"variant {u.name!r} ({u.url}) broke off the stream: {type(e).__name__}: {e}".rstrip(": ")
            yield f"data: {json.dumps(error_body(rec.error, 'server_error', code=reason))}\n\n".encode()
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:  # the client left: closing the upstream response aborts it there
            if not done:
                reason, rec.error = "client_disconnected", "the client disconnected"
            raise
        finally:
            await response.aclose()
            now = time.perf_counter()
            rec.e2e_s = now - arrival
            if first is not None:
                rec.ttft_s = first - arrival
                n = rec.completion_tokens
                if n is not None and n > 1 and last is not None:
                    rec.tpot_s = (last - first) / (n - 1)
            metrics.observe(rec, reason)
            writer.write(rec)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await proxy(request, "/v1/chat/completions")

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await proxy(request, "/v1/completions")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": served_model_name, "object": "model", "owned_by": "llmrs",
                                            "variants": {n: w for n, w in weights.items()}}]}

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/ready")
    async def ready() -> JSONResponse:
        async def check(name: str) -> str:
            try:  # llmrs serve's readiness is /ready; servers without one (404) answer /health
                r = await clients[name].get("/ready", timeout=min(timeout, 2.0))
                if r.status_code == 404:
                    r = await clients[name].get("/health", timeout=min(timeout, 2.0))
            except httpx.HTTPError as e:
                return f"unavailable: {type(e).__name__}"
            return "ok" if r.status_code == 200 else f"not ready: HTTP {r.status_code}"

        states = dict(zip(by_name, await asyncio.gather(*(check(n) for n in by_name))))
        ok = all(s == "ok" for s in states.values())
        return JSONResponse({"status": "ok" if ok else "not ready", "variants": states},
                            status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=RouterMetrics.CONTENT_TYPE)

    return app


__all__ = ["FORWARDED_HEADERS", "VARIANT_HEADER", "create_router"]
