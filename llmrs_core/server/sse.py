"""Engine outputs -> OpenAI server-sent events (chapter 11), and the non-streamed answer.

The framing, as OpenAI's API, vLLM and llama.cpp's server send it:

* every event is ``data: {json}\\n\\n``;
* chat streams start with a role chunk per choice (``delta: {"role": "assistant", "content": ""}``);
  then each piece of new text is a chunk (``delta: {"content": ...}`` for chat, ``text``
  for completions); a choice ends with a chunk that has its ``finish_reason`` and no text;
* with ``stream_options.include_usage``, one last chunk with ``"choices": []`` carries ``usage``;
* a request that fails in the engine (finish reason ``"error"``), or a stream that
  ends early (:class:`~.loop.StreamError`: the engine loop died or is draining, a
  deadline passed, the client read too slowly), sends ``data: {"error": {...}}``
  with the HTTP status as its ``code``;
* the stream always ends with ``data: [DONE]\\n\\n``.

The text pieces come from the engine's :class:`~llmrs_core.output.OutputStream`:
whole characters, stop strings held back — the server adds nothing to them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field

from ..logprobs import TokenLogprob
from .loop import ResponseStream, StreamError
from .protocol import (
    TextOffsets,
    TokenBytes,
    chat_choice,
    chat_delta,
    chat_logprobs,
    completion_choice,
    completion_logprobs,
    error_body,
    response,
    usage,
)

DONE = b"data: [DONE]\n\n"

#: what writes a streamed answer: ``(stream, info, include_usage, abort) -> SSE events``
#: (:func:`sse_events`; Exercise 11.6's learner writes one of these)
EventStream = Callable[["ResponseStream", "StreamInfo", bool, Callable[[list[str]], None]], AsyncIterator[bytes]]


def sse_event(payload: Mapping) -> bytes:
    """One server-sent event: ``data: {json}\\n\\n`` (UTF-8, no ASCII escaping)."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


@dataclass(frozen=True)
class StreamInfo:
    """What every chunk of one response repeats, and how engine requests map to choices.

    ``chat``: chat chunks (``delta``) or completion chunks (``text``); ``choice_of``:
    engine request id -> choice index; ``prompt_tokens``: for ``usage``; ``token_bytes``:
    the tokenizer's, to write log-probabilities (requests that asked for them).
    """

    response_id: str
    created: int
    model: str
    chat: bool
    choice_of: Mapping[str, int]
    prompt_tokens: int
    token_bytes: TokenBytes | None = None
    #: completions' ``text_offset`` of each choice, carried on from chunk to chunk
    _offsets: dict[int, TextOffsets] = field(default_factory=dict, compare=False, repr=False)

    @property
    def kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def logprobs(self, index: int, entries: tuple[TokenLogprob, ...]) -> dict | None:
        """The ``logprobs`` of choice ``index``'s next ``entries`` (``None`` when there are none)."""
        if not entries or self.token_bytes is None:
            return None
        if self.chat:
            return chat_logprobs(entries, self.token_bytes)
        return completion_logprobs(entries, self.token_bytes, self._offsets.setdefault(index, TextOffsets()))

    def chunk(self, index: int, text: str | None, finish_reason: str | None,
              logprobs: tuple[TokenLogprob, ...] = ()) -> dict:
        """One stream chunk of choice ``index``: ``text`` (``None``: none, as in a finish chunk),
        its ``finish_reason``, and the log-probabilities of the tokens it carries, if asked for."""
        lp = self.logprobs(index, logprobs)
        if self.chat:
            delta = {} if text is None else {"content": text}
            choice = chat_delta(index, delta, finish_reason, lp)
        else:
            choice = completion_choice(index, text or "", finish_reason, lp)
        return response(self.kind, self.response_id, self.created, self.model, [choice])


async def sse_events(
    stream: ResponseStream, info: StreamInfo, include_usage: bool, abort: Callable[[list[str]], None],
) -> AsyncIterator[bytes]:
    """The SSE events of one streamed response; aborts what is unfinished if the client leaves.

    ``abort(request_ids)`` is called when the generator is closed or cancelled before every
    request finished (a client that disconnects: Starlette cancels the response).
    """
    completion_tokens = 0
    try:
        if info.chat:
            for index in sorted(set(info.choice_of.values())):
                role = chat_delta(index, {"role": "assistant", "content": ""}, None)
                yield sse_event(response(info.kind, info.response_id, info.created, info.model, [role]))
        async for out in stream:
            index = info.choice_of[out.request_id]
            completion_tokens += len(out.new_token_ids)
            if out.finish_reason == "error":
                yield sse_event(error_body(out.error or "the request failed", "server_error", code=500))
                abort(stream.unfinished)
                break
            if out.new_text or out.logprobs:  # a held-back token still brings its logprob
                yield sse_event(info.chunk(index, out.new_text, None, out.logprobs))
            if out.finished:
                yield sse_event(info.chunk(index, None, out.finish_reason))
        else:
            if include_usage:
                final = response(info.kind, info.response_id, info.created, info.model, [],
                                 usage(info.prompt_tokens, completion_tokens))
                yield sse_event(final)
    except StreamError as e:  # the engine loop died (503), a deadline (504), a slow reader (408)
        yield sse_event(error_body(str(e), "server_error", code=e.status))
    finally:
        if stream.unfinished:
            abort(stream.unfinished)
    yield DONE


@dataclass
class _Choice:
    """One non-streamed choice as it accumulates."""

    pieces: list[str]
    finish_reason: str | None = None
    tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)


async def collect(stream: ResponseStream, info: StreamInfo) -> dict:
    """The whole answer of a non-streamed request, as a dict in OpenAI's shape.

    Raises :class:`~.loop.StreamError`, or ``RuntimeError`` with the engine's message if a
    request failed in the engine (the handler answers 500).
    """
    parts = {index: _Choice([]) for index in set(info.choice_of.values())}
    async for out in stream:
        c = parts[info.choice_of[out.request_id]]
        c.pieces.append(out.new_text)
        c.tokens += len(out.new_token_ids)
        c.logprobs.extend(out.logprobs)
        if out.finished:
            c.finish_reason = out.finish_reason
            if out.finish_reason == "error":
                raise RuntimeError(out.error or "the request failed in the engine")
    choice = chat_choice if info.chat else completion_choice
    choices = [choice(i, "".join(parts[i].pieces), parts[i].finish_reason, info.logprobs(i, tuple(parts[i].logprobs)))
               for i in sorted(parts)]
    kind = "chat.completion" if info.chat else "text_completion"
    return response(kind, info.response_id, info.created, info.model, choices,
                    usage(info.prompt_tokens, sum(c.tokens for c in parts.values())))


__all__ = ["DONE", "EventStream", "StreamInfo", "collect", "sse_event", "sse_events"]
