"""`llmrs serve` (chapter 11) on a tiny random model with a byte-level tokenizer, through the real
`openai` client and raw HTTP: endpoints, SSE framing, request fields, errors, concurrency,
cancellation, overload and a dying engine loop. Servers listen on 127.0.0.1, on a free port, in a
thread (`BackgroundServer`), and are always stopped; nothing here asserts a duration.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import re
import threading
import time

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.sampling import SamplingParams  # noqa: E402
from llmrs_core.server import BackgroundServer, EngineLoop, EngineRequest, create_app  # noqa: E402
from llmrs_core.server.loop import ENGINE_FAILED  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402

PROMPTS = [f"prompt {i}: " + "abcdefghij"[: 1 + i % 10] for i in range(32)]
WAIT = 30.0  # seconds: the bound on every wait below (a hang fails, it does not block CI)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    return llmrs.load(path, backend="numpy")


class Live:
    """A running server: its URL, app, engine loop and clients."""

    def __init__(self, app, url):
        self.app, self.url = app, url
        self.loop: EngineLoop = app.state.engine_loop
        assert self.loop.ready.wait(WAIT), "the engine did not get ready"
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
        self.http = httpx.Client(base_url=url, timeout=WAIT)

    def metric(self, name: str) -> float:
        text = self.http.get("/metrics").text
        values = [float(m.group(1)) for m in re.finditer(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.M)]
        assert values, f"{name} is not in /metrics"
        return sum(values)

    def wait_idle(self) -> None:
        deadline = time.monotonic() + WAIT
        while self.metric("llmrs:num_requests_running") or self.metric("llmrs:num_requests_waiting"):
            assert time.monotonic() < deadline, "the engine did not go idle"
            time.sleep(0.01)

    def assert_no_request_state(self) -> None:
        """The pool is back to idle (free + evictable prefix cache) and the engine keeps no request."""
        self.wait_idle()
        deadline = time.monotonic() + WAIT
        while self.loop._streams or self.loop.engine.requests:  # released after the last step's metrics
            assert time.monotonic() < deadline, "request state was left behind"
            time.sleep(0.01)
        engine = self.loop.engine
        cached = engine.prefix_cache.num_blocks if engine.prefix_cache else 0
        assert engine.cache.allocator.num_free + cached == engine.cache.allocator.num_blocks
        assert not engine.cache.tables and not engine.has_unfinished()


def live(model, **kwargs):
    kwargs.setdefault("served_model_name", "tiny")
    kwargs.setdefault("warm_up", False)
    app = create_app(model, **kwargs)
    return app, BackgroundServer(app)


@pytest.fixture(scope="module")
def server(tiny):
    app, background = live(tiny, num_blocks=128, max_num_seqs=16)
    with background as url:
        yield Live(app, url)


def alone(model, prompt, max_tokens, chat=False):
    """The greedy completion of one prompt, outside the server."""
    if chat:
        return model.chat([{"role": "user", "content": prompt}], max_tokens=max_tokens)
    return model.generate(prompt, max_tokens=max_tokens)


def sse_lines(response: httpx.Response) -> list[str]:
    """The raw events of a streamed response, checking the framing: `data: ...` then a blank line."""
    body = response.read().decode()
    assert body.endswith("data: [DONE]\n\n"), body[-200:]
    events = body.split("\n\n")
    assert events[-1] == ""
    for e in events[:-1]:
        assert e.startswith("data: ") and "\n" not in e, e
    return [e[len("data: "):] for e in events[:-1]]


# -- endpoints and shapes --------------------------------------------------------------------


def test_completion_matches_generate_and_has_openai_shape(server, tiny):
    r = server.client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
    want = alone(tiny, "hello", 8)
    assert r.object == "text_completion" and r.id.startswith("cmpl-") and r.created > 0 and r.model == "tiny"
    assert [c.index for c in r.choices] == [0]
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == want.finish_reason
    assert r.usage.prompt_tokens == 5 and r.usage.completion_tokens == len(want.token_ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_chat_matches_model_chat(server, tiny):
    r = server.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0)
    want = alone(tiny, "hi", 6, chat=True)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == want.prompt_tokens


def test_streamed_completion_framing_and_usage_chunk(server):
    body = {"model": "tiny", "prompt": "stream me", "max_tokens": 10, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    with server.http.stream("POST", "/v1/completions", json=body) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(e) for e in sse_lines(response)[:-1]]
    *chunks, last = events
    assert last["choices"] == [] and last["usage"]["prompt_tokens"] == 9
    assert all(e["object"] == "text_completion" and "usage" not in e for e in chunks)
    assert len({e["id"] for e in events}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    text = "".join(c["choices"][0]["text"] for c in chunks)
    plain = server.client.completions.create(model="tiny", prompt="stream me", max_tokens=10, temperature=0)
    assert text == plain.choices[0].text and last["usage"]["completion_tokens"] == plain.usage.completion_tokens


def test_streamed_chat_through_the_client(server, tiny):
    stream = server.client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == alone(tiny, "hi", 6, chat=True).text


def test_without_include_usage_there_is_no_usage_chunk(server):
    chunks = list(server.client.completions.create(model="tiny", prompt="x", max_tokens=3, stream=True))
    assert chunks and all(c.usage is None and c.choices for c in chunks)


def reference_logprobs(model, prompt_ids: list[int], generated: list[int]) -> np.ndarray:
    """log_softmax of the model's own full forward pass (no paged cache, no engine) at each
    generated position: ``[len(generated), vocab]``."""
    logits = model.logits(prompt_ids + generated[:-1])[len(prompt_ids) - 1:]
    x = logits.astype(np.float64) - logits.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def token_bytes_of(text: str) -> bytes:
    """A logprobs token back to its bytes (``bytes:\\xe2\\x80`` for a piece of a character)."""
    if text.startswith("bytes:"):
        return bytes(int(h, 16) for h in text[len("bytes:"):].split("\\x")[1:])
    return text.encode()


def test_completion_logprobs_are_the_models_and_have_openai_shape(server, tiny):
    r = server.client.completions.create(model="tiny", prompt="hello", max_tokens=6, temperature=0, logprobs=3)
    lp, text = r.choices[0].logprobs, r.choices[0].text
    ids = tiny.tokenizer.encode("hello", allow_special=False)
    generated = alone(tiny, "hello", 6).token_ids
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 6
    raw = [token_bytes_of(t) for t in lp.tokens]
    assert b"".join(raw) == tiny.tokenizer.decode_bytes(generated) and raw == [
        tiny.tokenizer.token_bytes(i) for i in generated]
    decoder, chars, want_offsets = codecs.getincrementaldecoder("utf-8")(errors="replace"), 0, []
    for data in raw:  # characters completed before each token, as Python's own UTF-8 decoder counts them
        want_offsets.append(chars)
        chars += len(decoder.decode(data))
    assert lp.text_offset == want_offsets
    want = reference_logprobs(tiny, ids, generated)
    # float32 logits of one model through two code paths (paged batch vs one full pass), in float64
    # log-softmax: differences of a few float32 ulps of logits of order 10 (~1e-5), where a wrong
    # position or a missing normalisation is off by 0.1 or more
    np.testing.assert_allclose(lp.token_logprobs, want[np.arange(6), generated], atol=1e-4)
    for step, top in enumerate(lp.top_logprobs):
        values = list(top.values())
        assert len(top) == 3 and values == sorted(values, reverse=True)
        assert values[0] == lp.token_logprobs[step], "the greedy token is the most likely one"
        np.testing.assert_allclose(values, np.sort(want[step])[::-1][:3], atol=1e-4)
    assert len(text) == len(b"".join(raw).decode("utf-8", errors="replace"))


def test_streamed_chat_logprobs_pair_with_the_tokens(server, tiny):
    messages = [{"role": "user", "content": "hi"}]
    chunks = list(server.client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=6, temperature=0.8, seed=3, logprobs=True, top_logprobs=2,
        stream=True, extra_body={"ignore_eos": True}))  # six tokens, whatever is sampled
    entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(entries) == 6 and bytes(b for e in entries for b in e.bytes).decode(errors="replace") == text
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 2
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob
        assert e.logprob <= e.top_logprobs[0].logprob, "nothing is more likely than the most likely"
    plain = server.client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, logprobs=True,
                                                  extra_body={"ignore_eos": True})
    assert len(plain.choices[0].logprobs.content) == 6
    assert all(e.top_logprobs == [] for e in plain.choices[0].logprobs.content)
    without = server.client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert without.choices[0].logprobs is None


def test_stop_string_ends_the_text_before_it(server, tiny):
    full = alone(tiny, "hello", 20).text
    stop = full[5:7]
    want = full[: full.index(stop)]
    r = server.client.completions.create(model="tiny", prompt="hello", max_tokens=20, temperature=0, stop=[stop])
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    chunks = list(server.client.completions.create(model="tiny", prompt="hello", max_tokens=20, temperature=0,
                                                   stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want


def test_n_choices_and_seed_reproduce(server):
    kw = dict(model="tiny", prompt="sample", max_tokens=12, temperature=1.0, n=2, seed=7)
    a = server.client.completions.create(**kw)
    b = server.client.completions.create(**kw)
    assert [c.index for c in a.choices] == [0, 1]
    assert [c.text for c in a.choices] == [c.text for c in b.choices], "the same seed must give the same samples"
    assert a.choices[0].text != a.choices[1].text, "the n choices must be different samples"
    assert a.usage.prompt_tokens == 6 and a.usage.completion_tokens == 24
    stream = server.client.completions.create(**kw, stream=True)
    texts = {0: "", 1: ""}
    for chunk in stream:
        texts[chunk.choices[0].index] += chunk.choices[0].text
    assert [texts[0], texts[1]] == [c.text for c in a.choices]


def test_prompt_forms_token_ids_and_batches(server, tiny):
    ids = tiny.tokenizer.encode("hello")
    by_ids = server.client.completions.create(model="tiny", prompt=ids, max_tokens=5, temperature=0)
    by_text = server.client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    batch = server.client.completions.create(model="tiny", prompt=["hello", "world"], max_tokens=5, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1]
    assert batch.choices[0].text == by_text.choices[0].text
    assert batch.choices[1].text == alone(tiny, "world", 5).text


def test_special_token_text_in_a_completion_prompt_stays_text(server, tiny):
    r = server.http.post("/tokenize", json={"prompt": "<|endoftext|>"}).json()
    assert r["tokens"] == list(b"<|endoftext|>") and r["count"] == 13 and r["max_model_len"] == 512


def test_models_tokenize_detokenize(server, tiny):
    models = server.client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    ids = server.http.post("/tokenize", json={"prompt": "héllo"}).json()["tokens"]
    assert ids == tiny.tokenizer.encode("héllo")
    assert server.http.post("/detokenize", json={"tokens": ids}).json() == {"prompt": "héllo"}
    chat = server.http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == tiny.tokenizer.encode_chat([{"role": "user", "content": "hi"}])


def test_health_and_metrics(server):
    assert server.http.get("/health").json() == {"status": "ok"}
    assert server.http.get("/ready").json() == {"status": "ready"}
    server.client.completions.create(model="tiny", prompt="count me", max_tokens=4, temperature=0)
    text = server.http.get("/metrics").text
    for name in ("llmrs:num_requests_running", "llmrs:num_requests_waiting", "llmrs:kv_cache_usage_perc",
                 "llmrs:prompt_tokens_total", "llmrs:generation_tokens_total",
                 "llmrs:time_to_first_token_seconds_bucket", "llmrs:inter_token_latency_seconds_bucket"):
        assert name in text, name
    assert server.metric("llmrs:generation_tokens_total") >= 4
    assert server.metric("llmrs:time_to_first_token_seconds_count") >= 1


# -- bad input: every endpoint, every refusal names its field ------------------------------


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "8"}, "max_tokens"),
    ({"prompt": "x", "temperature": 2.5}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_k": 1.5}, "top_k"),
    ({"prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ({"prompt": "x", "seed": -1}, "seed"),
    ({"prompt": "x", "n": 0}, "n"),
    ({"prompt": "x", "stop": 5}, "stop"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "logprobs": 21}, "logprobs"),
    ({"prompt": "x", "logprobs": -1}, "logprobs"),
    ({"prompt": "x", "logprobs": True}, "logprobs"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "suffix": "y"}, "suffix"),
    ({"prompt": "x", "logit_bias": {"1": 2}}, "logit_bias"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [1, 999]}, "prompt"),
    ({}, "prompt"),
    ({"prompt": "x" * 600}, "prompt"),
    ({"prompt": "x", "max_tokens": 600}, "prompt"),
    ({"prompt": "x", "model": 3}, "model"),
])
def test_completion_bad_input_is_a_400_naming_the_field(server, body, param):
    r = server.http.post("/v1/completions", json={"model": "tiny", **body} if "model" not in body else body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error" and error["message"]
    assert set(error) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("body, param", [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": []}, "tools"),
    ({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": [{"role": "user", "content": "hi"}], "logprobs": "yes"}, "logprobs"),
    ({"messages": [{"role": "user", "content": "x" * 600}]}, "messages"),
])
def test_chat_bad_input_is_a_400_naming_the_field(server, body, param):
    r = server.http.post("/v1/chat/completions", json={"model": "tiny", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_context_overflow_message_gives_both_numbers(server):
    with pytest.raises(openai.BadRequestError) as e:
        server.client.completions.create(model="tiny", prompt="hello", max_tokens=510)
    assert "5 tokens" in str(e.value) and "510" in str(e.value) and "512" in str(e.value)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize"])
def test_malformed_bodies_are_400_not_500(server, path):
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe", b"[" * 100_000):
        r = server.http.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 400, (raw[:10], r.text)
        assert r.json()["error"]["message"]


def test_tokenize_and_detokenize_bad_input(server):
    assert server.http.post("/tokenize", json={"prompt": 5}).json()["error"]["param"] == "prompt"
    assert server.http.post("/tokenize", json={}).status_code == 400
    assert server.http.post("/tokenize", json={"prompt": "a", "extra": 1}).json()["error"]["param"] == "extra"
    assert server.http.post("/tokenize", json={"messages": []}).json()["error"]["param"] == "messages"
    assert server.http.post("/detokenize", json={"tokens": [1, 10**6]}).json()["error"]["param"] == "tokens"
    assert server.http.post("/detokenize", json={"tokens": "abc"}).status_code == 400
    assert server.http.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


def test_unknown_model_is_404_model_not_found(server):
    with pytest.raises(openai.NotFoundError) as e:
        server.client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        server.client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert server.http.post("/tokenize", json={"model": "gpt-4", "prompt": "x"}).status_code == 404


def test_unknown_route_and_method_in_openai_shape(server):
    r = server.http.get("/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    assert server.http.get("/v1/completions").status_code == 405


def test_a_body_over_the_limit_is_413(tiny):
    app, background = live(tiny, max_body_bytes=1000)
    with background as url:
        r = httpx.post(url + "/v1/completions", content=b'{"prompt": "' + b"x" * 2000 + b'"}', timeout=WAIT)
        assert r.status_code == 413 and "error" in r.json()


def test_api_key_guards_v1_but_not_health_ready_or_metrics(tiny):
    app, background = live(tiny, api_key="sekrit")
    with background as url:
        Live(app, url)
        anonymous = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0, timeout=WAIT)
        with pytest.raises(openai.AuthenticationError):
            anonymous.completions.create(model="tiny", prompt="x", max_tokens=1)
        with pytest.raises(openai.AuthenticationError):
            anonymous.models.list()
        assert httpx.post(url + "/tokenize", json={"prompt": "x"}).status_code == 401
        keyed = openai.OpenAI(base_url=url + "/v1", api_key="sekrit", max_retries=0, timeout=WAIT)
        assert keyed.completions.create(model="tiny", prompt="x", max_tokens=1).choices[0].finish_reason
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/ready").status_code == 200
        assert httpx.get(url + "/metrics").status_code == 200


# -- many clients, cancellation, overload, faults --------------------------------------------


def test_32_concurrent_streaming_clients_each_equal_alone(server, tiny):
    want = [alone(tiny, p, 12).text for p in PROMPTS]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=WAIT)

    async def one(prompt):
        deltas, finish = [], None
        stream = await client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0,
                                                 stream=True)
        async for chunk in stream:
            deltas.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        return deltas, finish

    async def main():
        try:
            return await asyncio.gather(*(one(p) for p in PROMPTS))
        finally:
            await client.close()

    results = asyncio.run(main())
    for prompt, (deltas, finish), text in zip(PROMPTS, results, want):
        assert finish in ("stop", "length"), prompt
        assert "".join(deltas) == text, prompt
        assert sum(d.count("\ufffd") for d in deltas) == text.count("\ufffd")  # the server splits no character
    server.assert_no_request_state()


def test_disconnect_mid_stream_aborts_the_request(server):
    before = server.metric("llmrs:generation_tokens_total")
    body = {"model": "tiny", "prompt": "long", "max_tokens": 500, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=WAIT) as http, \
            http.stream("POST", "/v1/completions", json=body) as response:
        got = []
        for line in response.iter_lines():
            if line.startswith("data: "):
                got.append(line)
            if len(got) == 2:
                break  # leaving the block closes the connection
    server.wait_idle()
    server.assert_no_request_state()
    generated = server.metric("llmrs:generation_tokens_total") - before
    assert 2 <= generated < 500, "the request must stop when its client leaves"
    assert server.metric("llmrs:generation_tokens_total") - before == generated  # and stay stopped


def test_non_streaming_client_that_leaves_aborts_its_request(server):
    before = server.metric("llmrs:generation_tokens_total")
    body = {"model": "tiny", "prompt": "long", "max_tokens": 500, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(WAIT, read=0.05))
    server.assert_no_request_state()
    assert server.metric("llmrs:generation_tokens_total") - before < 500


def test_a_request_aborted_while_queued_is_never_added(tiny):
    """At the engine-loop level: an abort that arrives with (or before) the submission wins."""
    gate = threading.Event()
    seen = []

    def make_engine():
        gate.wait(WAIT)  # the engine is still "loading": the submission waits in the queue
        from llmrs_core.engine import Engine

        engine = Engine(tiny.network, tiny.tokenizer, num_blocks=32)
        real_add = engine.add_request
        engine.add_request = lambda *a, **kw: seen.append(kw["request_id"]) or real_add(*a, **kw)
        return engine

    loop = EngineLoop(make_engine)
    loop.start()

    async def main():
        request = EngineRequest("r0", [1, 2, 3], 4, SamplingParams())
        task = asyncio.ensure_future(loop.submit([request]))
        await asyncio.sleep(0)  # submitted
        loop.abort(["r0"])
        gate.set()
        await asyncio.wait_for(task, WAIT)

    try:
        asyncio.run(main())
        loop.abort([])  # one more iteration of the loop, after the admission
        deadline = time.monotonic() + WAIT
        while loop.engine is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == [] and loop.engine.steps == 0 and not loop.engine.requests
    finally:
        gate.set()
        loop.stop()


def test_a_request_that_can_never_fit_is_400_while_others_stream(tiny):
    app, background = live(tiny, num_blocks=8, max_num_seqs=4)  # 8 blocks of 16: 128 tokens in all
    with background as url:
        s = Live(app, url)
        stream = s.client.completions.create(model="tiny", prompt="streaming", max_tokens=60, temperature=0,
                                             stream=True)
        first = next(iter(stream))
        with pytest.raises(openai.BadRequestError) as e:
            s.client.completions.create(model="tiny", prompt="too big", max_tokens=300)
        assert "the whole pool has 8" in str(e.value)
        rest = [first, *stream]
        assert rest[-1].choices[0].finish_reason == "length"
        s.assert_no_request_state()


def test_a_burst_over_max_queue_gets_429_with_retry_after(tiny):
    app, background = live(tiny, max_num_seqs=1, max_queue=2)
    with background as url:
        s = Live(app, url)
        engine = s.loop.engine
        real_step, gate = engine.step, threading.Event()
        engine.step = lambda: gate.wait(WAIT) and real_step()  # the loop stays busy until the gate opens
        body = {"model": "tiny", "prompt": "hog", "max_tokens": 50, "stream": True}
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)

        async def one(i):
            try:
                await client.completions.create(model="tiny", prompt=f"q{i}", max_tokens=2)
                return "ok"
            except openai.RateLimitError as e:
                assert e.response.headers["retry-after"] == "1"
                assert e.body["type"] == "rate_limit_error"
                return "429"

        async def burst():
            tasks = [asyncio.ensure_future(one(i)) for i in range(6)]
            outcomes = []
            for t in asyncio.as_completed(tasks):
                outcomes.append(await t)
                if outcomes.count("429") == 4:
                    gate.set()  # the 2 that fit the queue run now
            await client.close()
            return outcomes

        try:
            with s.http.stream("POST", "/v1/completions", json=body) as hog:
                outcomes = asyncio.run(burst())
                assert list(hog.iter_lines())[-2] == "data: [DONE]"
        finally:
            gate.set()
        assert sorted(outcomes) == ["429"] * 4 + ["ok"] * 2, outcomes
        s.assert_no_request_state()


def test_an_engine_step_that_raises_ends_its_stream_with_an_error_and_the_loop_restarts(tiny):
    app, background = live(tiny)
    with background as url:
        s = Live(app, url)
        engine = s.loop.engine
        real_step = engine.step
        calls = []

        def step():
            calls.append(1)
            if len(calls) > 3:
                raise MemoryError("simulated")
            return real_step()

        engine.step = step
        body = {"model": "tiny", "prompt": "doomed", "max_tokens": 50, "stream": True, "ignore_eos": True}
        with s.http.stream("POST", "/v1/completions", json=body) as response:
            events = sse_lines(response)
        error = json.loads(events[-2])["error"]  # a stable message; the exception goes to the log only
        assert error["code"] == 500 and "restarted" in error["message"] and "simulated" not in events[-2]
        deadline = time.monotonic() + WAIT
        while s.loop.restarts < 1 or s.loop.state != "ready":  # a fresh engine (its step is the real one)
            assert time.monotonic() < deadline, "the engine loop did not restart"
            time.sleep(0.01)
        assert s.loop.engine is not engine and s.metric("llmrs:engine_restarts_total") == 1
        ready = s.http.get("/ready")
        assert ready.status_code == 200 and "MemoryError" not in ready.text
        r = s.client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0)
        assert r.choices[0].text == alone(tiny, "hello", 4).text
        s.assert_no_request_state()


class Fatal(BaseException):
    """Not an Exception: the loop cannot recover from it."""


def test_an_engine_loop_that_dies_turns_health_and_ready_503_and_ends_streams_with_an_error(tiny):
    app, background = live(tiny)
    with background as url:
        s = Live(app, url)
        engine = s.loop.engine
        real_step = engine.step
        calls = []

        def step():
            calls.append(1)
            if len(calls) > 3:
                raise Fatal("simulated")
            return real_step()

        engine.step = step
        body = {"model": "tiny", "prompt": "doomed", "max_tokens": 50, "stream": True, "ignore_eos": True}
        with s.http.stream("POST", "/v1/completions", json=body) as response:
            events = sse_lines(response)
        assert "error" in json.loads(events[-2]) and "simulated" not in events[-2]
        assert "Fatal" in s.loop.error  # for the operator (the log); the probes are public
        for path in ("/health", "/ready"):
            answer = s.http.get(path)
            assert answer.status_code == 503 and answer.json()["error"] == ENGINE_FAILED, path
            assert "Fatal" not in answer.text and "simulated" not in answer.text
        with pytest.raises(openai.InternalServerError):
            s.client.completions.create(model="tiny", prompt="x", max_tokens=1)
