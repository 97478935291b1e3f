"""Chapter 11 — Distributed Inference and Serving: your exercises.

Exercise 11.5  Building a Multi-GPU Engine (here: multi-process)  (ch11_distributed_serving.ipynb, section 11.5)
Exercise 11.6  Streaming API                                      (ch11_distributed_serving.ipynb, section 11.6)

Check your work with ``make test-chapter 11`` (or ``make test-exercise E=11.6``).
"""

from __future__ import annotations

import json  # noqa: F401  (for your code)
from collections.abc import AsyncIterator, Callable, Mapping

# Exercise 11.6 uses these (see its region below)
from llmrs_core.engine import RequestOutput  # noqa: F401
from llmrs_core.server.loop import EngineDeadError, ResponseStream  # noqa: F401
from llmrs_core.server.protocol import chat_delta, error_body, response, usage  # noqa: F401
from llmrs_core.server.sse import StreamInfo

# each exercise's region adds its names
__all__: list[str] = []

# -- Exercise 11.5: a multi-process engine ------------------------------------------
# (section 11.5)

# -- Exercise 11.6: a streaming API --------------------------------------------------
# (section 11.6)
#
# What you get from the engine, and the helpers you may use (all from llmrs_core.server):
#
#   stream: ResponseStream   ``async for out in stream`` gives RequestOutputs (request_id, new_text,
#                            new_token_ids, finished, finish_reason, error, logprobs) until every
#                            request of the HTTP call has finished; raises EngineDeadError if the
#                            engine loop died. ``stream.unfinished``: ids of the requests not done yet.
#   info: StreamInfo         response_id, created, model, chat (True: chat chunks), choice_of
#                            (request id -> choice index), prompt_tokens; and
#                            ``info.chunk(index, text, finish_reason, logprobs=())``: one content
#                            or finish chunk (a dict) in the right shape for chat or completions.
#   chat_delta(index, delta, finish_reason), response(kind, id, created, model, choices, usage=None),
#   usage(prompt_tokens, completion_tokens), error_body(message, type, code=...): dicts in
#   OpenAI's shapes. ``info.kind`` is the chunks' "object" field.

__all__ += ["sse_event", "sse_events"]


def sse_event(payload: Mapping) -> bytes:
    """One server-sent event carrying ``payload`` as JSON: ``b"data: {json}\\n\\n"``.

    The JSON is on one line (an SSE event ends at the first blank line, so a newline inside
    the text must stay escaped as ``\\n``), encoded as UTF-8.
    """
    raise NotImplementedError(
        "Exercise 11.6 `sse_event`: not implemented yet — see ch11_distributed_serving.ipynb §11.6"
    )


async def sse_events(
    stream: ResponseStream, info: StreamInfo, include_usage: bool, abort: Callable[[list[str]], None],
) -> AsyncIterator[bytes]:
    """The SSE events of one streamed answer, in OpenAI's order; aborts what is unfinished if the client leaves.

    Yield, each as :func:`sse_event`:

    1. for chat only: one role chunk per choice, ``delta = {"role": "assistant", "content": ""}``;
    2. for every output with text: a chunk with that text (``info.chunk(index, text, None,
       out.logprobs)``); an output with no text sends nothing (unless it carries logprobs);
    3. when an output finishes its request: a chunk with its ``finish_reason`` and no text;
    4. with ``include_usage``, after every choice finished: one chunk with ``"choices": []`` and
       ``usage`` (completion tokens = all the ``new_token_ids`` of the answer);
    5. always last, whatever happened: ``b"data: [DONE]\\n\\n"``.

    Errors: an output with ``finish_reason == "error"`` sends ``error_body(out.error, "server_error",
    code=500)`` as an event, aborts the other requests and ends the stream; an
    ``EngineDeadError`` from the stream sends ``error_body(str(e), "server_error", code=503)``.

    Disconnects: when the client goes away, the server closes this generator (``aclose()``, or it
    cancels the task iterating it): every request in ``stream.unfinished`` must then be passed
    to ``abort`` so that the engine stops computing it.
    """
    raise NotImplementedError(
        "Exercise 11.6 `sse_events`: not implemented yet — see ch11_distributed_serving.ipynb §11.6"
    )
    yield b""  # unreachable: makes this an async generator, as yours will be
