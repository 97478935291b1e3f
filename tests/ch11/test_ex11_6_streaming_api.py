"""Exercise 11.6 — Streaming API: engine outputs -> OpenAI server-sent events.

The learner's ``sse_events`` is driven by a real ``ResponseStream`` that the test feeds with
``RequestOutput``s (the engine's own types, without the engine), and once inside the real server,
read by the official ``openai`` client, and once past a request's deadline (``request_timeout``),
read as raw HTTP. The framing is OpenAI's (and vLLM's, llama.cpp's).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from llmrs_core.engine import RequestOutput
from llmrs_core.server.loop import (
    EngineDeadError,
    RequestTimeoutError,
    ResponseStream,
    SlowConsumerError,
    StreamError,
)
from llmrs_core.server.sse import StreamInfo

WAIT = 30.0


def out(rid: str, text: str, ids: list[int] | None = None, reason: str | None = None,
        error: str | None = None) -> RequestOutput:
    ids = ids if ids is not None else [1] * len(text)
    return RequestOutput(rid, ids, text, reason is not None, reason, error=error)


def run_stream(ex, outputs, *, chat=True, choices=("r0",), include_usage=False, read=None):
    """Feed ``outputs`` to a ResponseStream, run the learner's generator; return (events, aborted ids).

    ``read``: stop after that many events and close the generator (a client that disconnects)."""

    streams = []

    async def main():
        stream = ResponseStream(list(choices), asyncio.get_running_loop())
        streams.append(stream)
        for o in outputs:
            stream.put(o)
        info = StreamInfo("resp-1", 1_700_000_000, "tiny", chat, {rid: i for i, rid in enumerate(choices)}, 7)
        aborted: list[str] = []
        events: list[bytes] = []
        gen = ex.sse_events(stream, info, include_usage, aborted.extend)
        try:
            async for event in gen:
                events.append(event)
                if read is not None and len(events) == read:
                    break
        finally:
            await gen.aclose()
        return events, aborted

    try:
        return asyncio.run(asyncio.wait_for(main(), WAIT))
    except asyncio.TimeoutError:
        failed = [o.request_id for o in outputs if isinstance(o, RequestOutput) and o.finish_reason == "error"]
        if failed and streams and streams[0].unfinished:
            pytest.fail(f"sse_events kept waiting for {streams[0].unfinished}, which will never finish: after an "
                        f"output with finish_reason 'error' (request {failed[0]!r}) send the error event, abort the "
                        "other requests and end the stream")
        pytest.fail("sse_events kept waiting after every request had finished: end when the stream ends "
                    "(``async for out in stream`` does that)")


def parse(events: list[bytes]) -> list[dict | str]:
    """Each event's payload: a dict, or the string "[DONE]". Fails with what is wrong in the framing."""
    payloads = []
    for i, event in enumerate(events):
        assert isinstance(event, bytes), f"event {i} is a {type(event).__name__}; yield bytes (UTF-8)"
        assert event.startswith(b"data: "), f"event {i} must start with b'data: ', got {event[:20]!r}"
        assert event.endswith(b"\n\n"), f"event {i} must end with a blank line (b'\\n\\n'), got ...{event[-10:]!r}"
        body = event[len(b"data: "):-2]
        assert b"\n" not in body, f"event {i} has a newline inside its data: {event!r}"
        payloads.append("[DONE]" if body == b"[DONE]" else json.loads(body.decode("utf-8")))
    return payloads


def chunks_of(payloads):
    assert payloads and payloads[-1] == "[DONE]", (
        f"the stream must end with data: [DONE]; its last event is {payloads[-1] if payloads else 'missing'!r}")
    assert "[DONE]" not in payloads[:-1], "data: [DONE] must come once, at the very end"
    return payloads[:-1]


# -- sse_event ------------------------------------------------------------------------


def test_ex11_6_sse_event_is_one_data_line_and_a_blank_line(ex):
    payload = {"text": "é\nthe end", "n": 1}
    event = ex.sse_event(payload)
    assert isinstance(event, bytes), f"sse_event returns bytes; got {type(event).__name__}"
    assert event.startswith(b"data: "), f"an SSE event starts with 'data: '; yours starts with {event[:10]!r}"
    assert event.endswith(b"\n\n") and not event.endswith(b"\n\n\n"), (
        f"an SSE event ends with exactly one blank line, b'\\n\\n'; yours ends with {event[-6:]!r}")
    body = event[len(b"data: "):-2]
    assert b"\n" not in body, (
        "the JSON contains a raw newline, which ends the event early: keep json.dumps's escaped '\\n' "
        "(do not pretty-print with indent)")
    assert json.loads(body.decode("utf-8")) == payload, "the data is not the payload as JSON"


# -- the chunks, in order --------------------------------------------------------------


def test_ex11_6_chat_starts_with_a_role_chunk(ex):
    chunks = chunks_of(parse(run_stream(ex, [out("r0", "Hi", reason="stop")])[0]))
    first = chunks[0]
    assert first["object"] == "chat.completion.chunk", f"chat chunks have object 'chat.completion.chunk': {first}"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}, (
        f"a chat stream starts with the role chunk, delta {{'role': 'assistant', 'content': ''}}; "
        f"your first chunk is {first}")
    assert first["choices"][0]["finish_reason"] is None


def test_ex11_6_content_deltas_carry_the_text_in_order(ex):
    outputs = [out("r0", "Hel"), out("r0", "lo, "), out("r0", "wörld"), out("r0", "", [2], "stop")]
    chunks = chunks_of(parse(run_stream(ex, outputs)[0]))
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:] if c["choices"]]
    assert [t for t in texts if t] == ["Hel", "lo, ", "wörld"], f"the content deltas should be the texts in order: {texts}"
    for c in chunks:
        assert (c["id"], c["created"], c["model"]) == ("resp-1", 1_700_000_000, "tiny"), (
            f"every chunk repeats the response's id, created and model: {c}")


def test_ex11_6_an_output_without_text_sends_no_content_chunk(ex):
    outputs = [out("r0", "a"), out("r0", "", [5]), out("r0", "b"), out("r0", "", [], "stop")]
    chunks = chunks_of(parse(run_stream(ex, outputs)[0]))
    empty = [c for c in chunks[1:] if c["choices"] and c["choices"][0]["delta"] == {"content": ""}]
    assert not empty, ("an output whose new_text is empty (its text is held back: half a character, a "
                       "possible stop string) must not become an empty content chunk")


def test_ex11_6_the_finish_chunk_has_the_reason_and_no_text(ex):
    chunks = chunks_of(parse(run_stream(ex, [out("r0", "done", reason="length")])[0]))
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "length", (
        f"the last chunk of a choice carries its finish_reason ('length' here); yours is {chunks[-1]}")
    assert last["delta"] == {}, (
        f"the finish chunk has an empty delta: the text goes in the chunk before it; yours has {last['delta']}")
    before = chunks[-2]["choices"][0]
    assert before["delta"].get("content") == "done" and before["finish_reason"] is None, (
        "the text of the last output comes in its own chunk, before the finish chunk")


def test_ex11_6_completions_chunks_carry_text(ex):
    chunks = chunks_of(parse(run_stream(ex, [out("r0", "one "), out("r0", "two", reason="stop")], chat=False)[0]))
    assert all(c["object"] == "text_completion" for c in chunks), "completion chunks have object 'text_completion'"
    assert "delta" not in json.dumps(chunks[0]), "completions have no role chunk and no delta: they carry 'text'"
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == "one two", f"the chunks' texts should join to the outputs' texts, 'one two'; yours join to {text!r}"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_ex11_6_usage_chunk_only_when_asked_and_last(ex):
    outputs = [out("r0", "ab", [3, 4]), out("r0", "", [9], "stop")]
    chunks = chunks_of(parse(run_stream(ex, outputs, include_usage=True)[0]))
    last = chunks[-1]
    assert last.get("choices") == [] and "usage" in last, (
        f"with include_usage the last chunk before [DONE] has 'choices': [] and the usage; yours: {last}")
    assert last["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}, (
        f"completion_tokens counts every new_token_id of the answer (3 here); yours: {last['usage']}")
    assert all("usage" not in c for c in chunks[:-1]), "only the final chunk carries usage"
    plain = chunks_of(parse(run_stream(ex, outputs, include_usage=False)[0]))
    assert all("usage" not in c and c["choices"] for c in plain), "without include_usage there is no usage chunk"


def test_ex11_6_two_choices_each_get_role_text_and_finish(ex):
    outputs = [out("a", "x"), out("b", "y"), out("b", "", [1], "stop"), out("a", "z", reason="length")]
    chunks = chunks_of(parse(run_stream(ex, outputs, choices=("a", "b"))[0]))
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role")]
    assert sorted(roles) == [0, 1], f"each choice gets its own role chunk first; role chunks for indexes {roles}"
    text = {0: "", 1: ""}
    reasons = {}
    for c in chunks:
        choice = c["choices"][0]
        text[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"]:
            reasons[choice["index"]] = choice["finish_reason"]
    assert text == {0: "xz", 1: "y"}, f"each output goes to its choice's index (info.choice_of): {text}"
    assert reasons == {0: "length", 1: "stop"}, f"each choice ends with its own finish_reason: {reasons}"


# -- errors -------------------------------------------------------------------------------


def test_ex11_6_a_failed_request_sends_an_error_event_and_aborts_the_others(ex):
    outputs = [out("a", "x"), out("a", "", [], "error", error="request 'a' failed in sampling")]
    events, aborted = run_stream(ex, outputs, choices=("a", "b"))
    payloads = parse(events)
    chunks_of(payloads)
    errors = [p for p in payloads if isinstance(p, dict) and "error" in p]
    assert errors, "a request that failed (finish_reason 'error') must send data: {\"error\": {...}}"
    assert errors[0]["error"]["message"] == "request 'a' failed in sampling" and errors[0]["error"]["code"] == 500
    assert set(aborted) == {"b"}, f"after an error the other unfinished requests are aborted; you aborted {aborted}"


def test_ex11_6_a_dead_engine_sends_an_error_event_then_done(ex):
    try:
        events, _ = run_stream(ex, [out("r0", "x"), EngineDeadError("the engine loop failed: boom")])
    except EngineDeadError:
        pytest.fail("the EngineDeadError from `async for out in stream` escaped your generator: the client's stream "
                    "just breaks off. Catch it, send error_body(str(e), 'server_error', code=503), then [DONE]")
    payloads = parse(events)
    chunks_of(payloads)
    errors = [p for p in payloads if isinstance(p, dict) and "error" in p]
    assert errors and errors[0]["error"]["code"] == 503 and "boom" in errors[0]["error"]["message"], (
        "when the stream raises EngineDeadError, send an error event (code 503) with its message, then [DONE]")


ENDED_EARLY = {
    "deadline": (RequestTimeoutError("the request did not finish within its deadline of 1 s (--request-timeout); "
                                     "it was aborted"), 504),
    "slow reader": (SlowConsumerError("the client did not read its stream: 8 outputs were waiting for it"), 408),
}


def catch_stream_error(error: StreamError) -> str:
    return (f"Catch StreamError, the base of all three ways a stream ends early — EngineDeadError (503), "
            f"RequestTimeoutError (504), SlowConsumerError (408) — and send error_body(str(e), 'server_error', "
            f"code=e.status) ({error.status} here), then [DONE]")


@pytest.mark.parametrize("kind", ENDED_EARLY)
def test_ex11_6_a_stream_that_ends_early_sends_its_status_then_done(ex, kind):
    error, status = ENDED_EARLY[kind]
    try:
        events, _ = run_stream(ex, [out("r0", "x"), error])
    except StreamError as e:
        pytest.fail(f"the {type(e).__name__} from `async for out in stream` escaped your generator (you catch "
                    f"EngineDeadError only?): the client's response breaks off, with no error event and no [DONE]. "
                    + catch_stream_error(error), pytrace=False)
    payloads = parse(events)
    chunks_of(payloads)
    errors = [p for p in payloads if isinstance(p, dict) and "error" in p]
    assert errors, f"the stream raised {type(error).__name__}: send an error event for it. {catch_stream_error(error)}"
    assert errors[0]["error"]["code"] == status and errors[0]["error"]["message"] == str(error), (
        f"the error event of a {type(error).__name__} has code e.status ({status}) and message str(e); yours: "
        f"{errors[0]['error']}")


# -- disconnects -----------------------------------------------------------------------------


def test_ex11_6_a_client_that_leaves_aborts_its_unfinished_requests(ex):
    events, aborted = run_stream(ex, [out("r0", "a"), out("r0", "b"), out("r0", "c")], read=2)
    assert aborted == ["r0"], (
        "the client read two events and left (the server closed your generator): its request must be "
        f"passed to abort, or the engine keeps generating for nobody; abort got {aborted}. "
        "Put the abort in a finally: block")


def test_ex11_6_a_cancelled_response_aborts_its_requests(ex):
    async def main():
        stream = ResponseStream(["r0", "r1"], asyncio.get_running_loop())
        stream.put(out("r0", "a"))
        info = StreamInfo("resp-1", 1, "tiny", True, {"r0": 0, "r1": 1}, 3)
        aborted: list[str] = []
        got: list[bytes] = []

        async def consume():
            async for event in ex.sse_events(stream, info, False, aborted.extend):
                got.append(event)

        task = asyncio.create_task(consume())
        while len(got) < 3:  # two role chunks and "a"; then it waits for the engine
            await asyncio.sleep(0.01)
            if task.done():
                task.result()
                pytest.fail(f"the stream ended early, after {got}")
        task.cancel()  # what Starlette does when the client disconnects
        try:
            await task
        except asyncio.CancelledError:
            return aborted
        pytest.fail("your sse_events swallowed the cancellation (asyncio.CancelledError) and ended normally: "
                    "the server cancels the response when the client leaves; abort in a finally: block and let the "
                    "cancellation go on")

    try:
        aborted = asyncio.run(asyncio.wait_for(main(), WAIT))
    except asyncio.TimeoutError:
        pytest.fail("sse_events sent fewer than 3 events for two chat choices and the output 'a' (a role chunk "
                    "for each choice, then the text) before it waited for the engine")
    assert sorted(aborted) == ["r0", "r1"], (
        "the response was cancelled while waiting for the engine (the client disconnected): both unfinished "
        f"requests must be aborted; abort got {aborted}")


def test_ex11_6_a_finished_answer_aborts_nothing(ex):
    _, aborted = run_stream(ex, [out("r0", "a", reason="stop")])
    assert not aborted, f"every request finished, so there is nothing to abort; you aborted {aborted}"


# -- in the real server, through the official openai client ------------------------------------


def checked(sse_events, problems: list):
    """The learner's writer as the server calls it, noting in ``problems`` an event that is not an SSE event's
    bytes, or an exception it raised (the server would only break the connection)."""

    async def events(stream, info, include_usage, abort):
        gen = sse_events(stream, info, include_usage, abort)
        try:
            async for event in gen:
                if not (isinstance(event, bytes) and event.startswith(b"data: ") and event.endswith(b"\n\n")):
                    problems.append(event)
                yield event
        except Exception as e:  # noqa: BLE001 - reported in the learner's terms by blame_sse_events
            problems.append(e)
            raise
        finally:
            await gen.aclose()

    return events


def blame_sse_events(problems: list) -> None:
    for p in problems[:1]:
        if isinstance(p, Exception):
            pytest.fail(f"inside the server your sse_events (Exercise 11.6) raised {type(p).__name__}: {p}")
        pytest.fail(f"inside the server your sse_events (Exercise 11.6) yielded {p!r:.120}: every event is the "
                    "bytes b'data: {json}\\n\\n' (what your sse_event makes)")


def test_ex11_6_in_the_server_through_the_openai_client(ex, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    import llmrs_core as llmrs
    from llmrs_core.server import BackgroundServer, create_app
    from llmrs_core.testing import write_tiny_llama

    # a stub, a crash or a framing mistake shows here, in the terms above, not inside the server
    chunks_of(parse(run_stream(ex, [out("r0", "a", reason="stop")], include_usage=True)[0]))
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    model = llmrs.load(path, backend="numpy")
    messages = [{"role": "user", "content": "hi"}]
    want = model.chat(messages, max_tokens=8)
    problems: list = []
    app = create_app(model, served_model_name="tiny", warm_up=False, stream_events=checked(ex.sse_events, problems))
    with BackgroundServer(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
        try:
            chunks = list(client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=8, temperature=0, stream=True,
                stream_options={"include_usage": True}))
        except openai.OpenAIError as e:
            blame_sse_events(problems)
            pytest.fail(f"the openai client failed on your stream: {type(e).__name__}: {e}")
    blame_sse_events(problems)
    assert chunks[0].choices[0].delta.role == "assistant", "the openai client saw no role chunk first"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text, f"the streamed text {text!r} differs from model.chat's {want.text!r}"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(want.token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == want.finish_reason


def test_ex11_6_a_request_timeout_in_the_server_sends_504_then_done(ex, tmp_path):
    """``--request-timeout`` in the real server, with your writer plugged in: the engine thread is held at its
    second forward pass (no request can finish), the deadline passes, and the raw HTTP body must end with the 504
    error event and ``data: [DONE]``, as the engine's own writer sends them."""
    pytest.importorskip("fastapi")
    import httpx

    import llmrs_core as llmrs
    from llmrs_core.server import BackgroundServer, create_app
    from llmrs_core.testing import write_tiny_llama
    from llmrs_core.testing.faults import inject_faults

    # a stub, a crash or a framing mistake shows here, in the terms above, not inside the server
    chunks_of(parse(run_stream(ex, [out("r0", "a", reason="stop")])[0]))
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    model = llmrs.load(path, backend="numpy")
    faults = inject_faults(model, stall_at=2, stall_s=WAIT)  # released below; a bound, so nothing can hang
    problems: list = []
    app = create_app(model, served_model_name="tiny", warm_up=False, request_timeout=1.0,
                     stream_events=checked(ex.sse_events, problems))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "late"}], "max_tokens": 50, "stream": True,
            "ignore_eos": True, "temperature": 0}
    with BackgroundServer(app) as url:
        try:
            with httpx.Client(base_url=url, timeout=WAIT, trust_env=False) as http, \
                    http.stream("POST", "/v1/chat/completions", json=body) as response:
                text = response.read().decode()
        except httpx.HTTPError as e:
            escaped = [p for p in problems if isinstance(p, StreamError)]
            if escaped:
                pytest.fail(f"past the request's deadline the stream raised {type(escaped[0]).__name__}, your "
                            f"sse_events let it escape, and the client's response broke off ({type(e).__name__}: "
                            f"{e}). " + catch_stream_error(escaped[0]), pytrace=False)
            blame_sse_events(problems)
            raise
        finally:
            faults.release()
    blame_sse_events(problems)
    assert response.status_code == 200, f"HTTP {response.status_code}: {text[:300]}"
    payloads = chunks_of(parse([e.encode() + b"\n\n" for e in text.split("\n\n") if e]))
    errors = [p["error"] for p in payloads if isinstance(p, dict) and "error" in p]
    assert errors and errors[0]["code"] == 504 and "deadline of 1 s" in errors[0]["message"], (
        f"past its deadline a stream sends the RequestTimeoutError as an error event with code 504; the events "
        f"were {payloads}")
