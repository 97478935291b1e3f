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
from llmrs_core.server.loop import EngineDeadError, ResponseStream, StreamError  # noqa: F401
from llmrs_core.server.protocol import chat_delta, error_body, response, usage  # noqa: F401
from llmrs_core.server.sse import StreamInfo

# each exercise's region adds its names
__all__: list[str] = []

# -- Exercise 11.5: a multi-process engine ------------------------------------------
# (section 11.5)
#
# Weights are stored [out, in] (y = x @ W.T). Megatron's "column-parallel" linear keeps a band of
# output features = a band of our ROWS; "row-parallel" keeps a band of input features = our COLUMNS
# and yields a partial sum that an all-reduce completes. Helpers you may use:
#   layers.rms_norm(x, weight, eps), layers.linear(x, w) (= x @ w.T), layers.swiglu(gate, up),
#   rope.apply_rope_interleaved(x [T, H, D], positions [T], theta),
#   attention.scaled_dot_product_attention(q [T, Hq, D], k [T, Hkv, D], v, causal=True) -> [T, Hq, D],
#   comm.all_reduce(x) (sums x over the ranks, in place), comm.rank, comm.world_size.

import numpy as np  # noqa: E402

from llmrs_core import attention, layers, rope  # noqa: E402, F401
from llmrs_core.config import ModelConfig  # noqa: E402
from llmrs_core.distributed import Communicator  # noqa: E402

__all__ += ["parallel_block", "shard_block", "split_cols", "split_rows"]


def split_rows(w: np.ndarray, parts: int, index: int) -> np.ndarray:
    """Column-parallel shard ``index`` of ``parts``: the band of rows (output features) of
    ``w [out, in]`` -> ``[out / parts, in]``. ``ValueError`` if ``out`` does not divide evenly."""
    raise NotImplementedError(
        "Exercise 11.5 `split_rows`: not implemented yet — see ch11_distributed_serving.ipynb §11.5"
    )


def split_cols(w: np.ndarray, parts: int, index: int) -> np.ndarray:
    """Row-parallel shard ``index`` of ``parts``: the band of columns (input features) of
    ``w [out, in]`` -> ``[out, in / parts]``, C-contiguous. ``ValueError`` if ``in`` does not divide evenly."""
    raise NotImplementedError(
        "Exercise 11.5 `split_cols`: not implemented yet — see ch11_distributed_serving.ipynb §11.5"
    )


def shard_block(w: dict[str, np.ndarray], rank: int, world_size: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s part of one decoder block's float32 weights.

    ``w`` has ``attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down`` (each ``[out, in]``;
    norms ``[d]``). Return the same keys: Q, K, V, gate and up column-parallel; o_proj (``wo``) and
    down row-parallel; the norms whole. (With ``world_size`` dividing the KV heads, equal row bands
    of Q and K/V keep whole heads, and each rank's query heads use its own KV heads.)
    """
    raise NotImplementedError(
        "Exercise 11.5 `shard_block`: not implemented yet — see ch11_distributed_serving.ipynb §11.5"
    )


def parallel_block(x: np.ndarray, shard: dict[str, np.ndarray], comm: Communicator,
                   config: ModelConfig) -> np.ndarray:
    """One decoder block, tensor-parallel, for a whole sequence from position 0 (no cache).

    ``x [T, d]``: the residual stream, the same on every rank; ``shard``: this rank's weights
    (:func:`shard_block`); ``config``: the whole model's (this rank has ``n_heads / world_size``
    query heads and ``n_kv_heads / world_size`` KV heads of ``head_dim``). Returns the block's
    output ``[T, d]``, the same on every rank::

        h = rms_norm(x, attn_norm);  q, k, v = h Wq^T, h Wk^T, h Wv^T   (this rank's heads)
        x = x + attention(rope(q), rope(k), v) Wo^T                      (a partial sum: ...?)
        h = rms_norm(x, ffn_norm)
        x = x + swiglu(h Wgate^T, h Wup^T) Wdown^T                       (a partial sum: ...?)
    """
    raise NotImplementedError(
        "Exercise 11.5 `parallel_block`: not implemented yet — see ch11_distributed_serving.ipynb §11.5"
    )


# -- Exercise 11.6: a streaming API --------------------------------------------------
# (section 11.6)
#
# What you get from the engine, and the helpers you may use (all from llmrs_core.server):
#
#   stream: ResponseStream   ``async for out in stream`` gives RequestOutputs (request_id, new_text,
#                            new_token_ids, finished, finish_reason, error, logprobs) until every
#                            request of the HTTP call has finished; raises a StreamError if it
#                            ends early (see sse_events). ``stream.unfinished``: ids of the requests
#                            not done yet.
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
    code=500)`` as an event, aborts the other requests and ends the stream. The stream itself
    raises a ``StreamError`` when it ends early, one of three kinds, each with its HTTP status as
    ``e.status``: ``EngineDeadError`` (503: the engine loop died or the server is draining),
    ``RequestTimeoutError`` (504: the request ran past ``--request-timeout``) and
    ``SlowConsumerError`` (408: the client read too slowly). Catch ``StreamError`` — all three —
    and send ``error_body(str(e), "server_error", code=e.status)``; then ``[DONE]`` as always.
    Whatever escapes your generator breaks the HTTP response off: the client gets neither.

    Disconnects: when the client goes away, the server closes this generator (``aclose()``, or it
    cancels the task iterating it): every request in ``stream.unfinished`` must then be passed
    to ``abort`` so that the engine stops computing it.
    """
    raise NotImplementedError(
        "Exercise 11.6 `sse_events`: not implemented yet — see ch11_distributed_serving.ipynb §11.6"
    )
    yield b""  # unreachable: makes this an async generator, as yours will be
