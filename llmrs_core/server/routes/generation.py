"""``POST /v1/completions`` and ``POST /v1/chat/completions`` (chapter 11).

A handler never runs the model: it parses and checks the body (:mod:`..protocol`), refuses
text that cannot fit the context in O(n) before anything renders or encodes it, encodes the
prompts in the encoding pool, and submits token ids to the engine loop; every refusal comes
before the first byte of the answer. The k-th sequence of a call (prompts × ``n``) has
priority k, so the engine admits concurrent calls round-robin. A client that disconnects
aborts its requests before the next engine step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from ...validation import check_fits_context, check_token_ids, precheck_chat, precheck_text, prompt_ids
from ..body import read_json, wait_disconnect
from ..encode_pool import text_size
from ..faults import QueueFullError, StreamError
from ..loop import EngineRequest, ResponseStream
from ..protocol import APIError, GenerationRequest, new_id, parse_chat_request, parse_completion_request
from ..sse import StreamInfo, collect
from ..tracing import context_from_headers
from .common import ServingState, authorised, check_model, serving

#: the default generation budget of /v1/completions (OpenAI's and vLLM's); chat's is the rest of the context
DEFAULT_COMPLETION_MAX_TOKENS = 16

router = APIRouter(dependencies=[Depends(authorised)])


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await generate(request, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await generate(request, chat=True)


async def generate(request: Request, chat: bool) -> Response:
    """One generation call: check, encode, submit; then stream the answer or collect it."""
    state = serving(request)
    body = await read_json(request, state.max_body_bytes)
    req = parse_chat_request(body) if chat else parse_completion_request(body)
    check_model(state, req)
    prechecked(state, req, chat)
    encoded = await request.app.state.encoder.run(text_size([req.prompts, req.template_data]), encode, state,
                                                  req, chat)
    response_id = new_id("chatcmpl" if chat else "cmpl")
    requests, choice_of, prompt_of = engine_requests(req, encoded, response_id)
    stream = await submit(request, req, requests, prompt_of)
    info = StreamInfo(response_id, req.created, state.model_name, chat, choice_of,
                      sum(len(ids) for ids, _ in encoded), state.tokenizer.token_bytes)
    if req.stream:
        return stream_response(request, stream, info, req.include_usage)
    return await collected_response(request, stream, info)


def prechecked(state: ServingState, req: GenerationRequest, chat: bool) -> None:
    """Refuse text that cannot fit the context before it is rendered or encoded: O(n), on the
    event loop, so a huge prompt is a 400 at once and never waits for (or holds) an encoder."""
    config = state.config
    for i, prompt in enumerate(req.prompts):
        where = f"prompt {i}: " if len(req.prompts) > 1 else ""
        try:
            if chat:
                precheck_chat(prompt, state.tokenizer, config.context_length, req.max_tokens or 1, req.template_data)
            elif isinstance(prompt, str):
                precheck_text([prompt], state.tokenizer, config.context_length,
                              req.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS)
        except ValueError as e:
            raise APIError(400, f"{where}{e}", param="messages" if chat else "prompt") from None


def encode(state: ServingState, req: GenerationRequest, chat: bool) -> list[tuple[list[int], int]]:
    """Each prompt's token ids and generation budget, checked (runs in a worker thread)."""
    tokenizer, config = state.tokenizer, state.config
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


def engine_requests(req: GenerationRequest, encoded: list[tuple[list[int], int]], response_id: str
                    ) -> tuple[list[EngineRequest], dict[str, int], dict[str, object]]:
    """The call's engine requests (prompts × ``n``, the k-th with priority k), each one's choice
    index, and each one's prompt as the client sent it."""
    requests, choice_of, prompt_of = [], {}, {}
    for p, (ids, max_tokens) in enumerate(encoded):
        for j in range(req.n):
            rid = f"{response_id}-{p * req.n + j}"
            choice_of[rid] = p * req.n + j
            prompt_of[rid] = req.prompts[p]
            requests.append(EngineRequest(rid, ids, max_tokens, req.sampling_for(j), req.stop, req.ignore_eos,
                                          req.logprobs, priority=p * req.n + j))
    return requests, choice_of, prompt_of


async def submit(request: Request, req: GenerationRequest, requests: list[EngineRequest],
                 prompt_of: dict[str, object]) -> ResponseStream:
    """Register the requests with the observer and the metrics, and hand them to the engine loop;
    its refusals become 429, 503/504 or 400."""
    app_state, ids = request.app.state, list(prompt_of)
    client = f"{request.client.host}:{request.client.port}" if request.client else ""
    app_state.observer.register(ids, client, context_from_headers(request.headers), prompt_of)
    if req.n > 1:  # the n choices of a prompt count its tokens once, as usage.prompt_tokens does
        for p in range(len(requests) // req.n):
            app_state.metrics.share_prompt([r.request_id for r in requests[p * req.n:(p + 1) * req.n]])
    try:
        try:
            return await app_state.engine_loop.submit(requests, timeout=serving(request).request_timeout,
                                                      bounded=req.stream)
        except BaseException:
            app_state.observer.discard(ids)
            app_state.metrics.forget(ids)
            raise
    except QueueFullError as e:
        raise APIError(429, str(e), code="rate_limit_exceeded", headers={"Retry-After": "1"}) from None
    except StreamError as e:  # draining or dead (503), past the deadline already (504)
        raise APIError(e.status, str(e)) from None
    except ValueError as e:  # RequestRejected: can never fit the pool, say
        raise APIError(400, str(e), param="max_tokens") from None


def stream_response(request: Request, stream: ResponseStream, info: StreamInfo, include_usage: bool
                    ) -> StreamingResponse:
    """The answer as server-sent events, written by the app's ``stream_events``."""
    stream_events, engine_loop = serving(request).stream_events, request.app.state.engine_loop

    async def events() -> AsyncIterator[bytes]:
        try:  # closing the events closes the writer at once (its finally aborts what is unfinished)
            async with contextlib.aclosing(stream_events(stream, info, include_usage, engine_loop.abort)) as writer:
                async for event in writer:
                    if not isinstance(event, bytes):  # a plugged-in writer (Exercise 11.6) gone wrong
                        raise TypeError(f"the stream writer (stream_events: Exercise 11.6's sse_events "
                                        f"when plugged in) yielded {type(event).__name__}, not the "
                                        "bytes of one SSE event")
                    yield event
        finally:
            stream.close()  # its deadline, if any, is over

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def collected_response(request: Request, stream: ResponseStream, info: StreamInfo) -> Response:
    """The whole answer as one JSON body; 499 (and the requests aborted) if the client left first."""
    answer = asyncio.ensure_future(collect(stream, info))
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:  # the client left (or this handler was cancelled): stop its requests in the engine
        gone.cancel()
        stream.close()
        if not answer.done():
            answer.cancel()
            request.app.state.engine_loop.abort(stream.unfinished)
    if not answer.done() or answer.cancelled():
        return Response(status_code=499)  # nobody reads it; nginx's "client closed request"
    try:
        return JSONResponse(answer.result())
    except StreamError as e:  # dead or stalled (503), its deadline (504)
        raise APIError(e.status, str(e)) from None
    except RuntimeError as e:  # the request failed in the engine (a stable message: .loop.REQUEST_FAILED)
        raise APIError(500, str(e), code=500) from None


__all__ = ["DEFAULT_COMPLETION_MAX_TOKENS", "router"]
