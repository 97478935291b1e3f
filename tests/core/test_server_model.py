"""`llmrs serve` on SmolLM2 (chapter 11, ``@pytest.mark.model``): greedy output through the server
equals ``model.generate`` / ``model.chat``; streams are whole characters; a client that leaves is
aborted within two engine steps. One server for the module, on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.server import BackgroundServer, create_app  # noqa: E402

pytestmark = pytest.mark.model
WAIT = 120.0


@pytest.fixture(scope="module")
def smol(model_path):
    return llmrs.load(model_path, threads=2)


@pytest.fixture(scope="module")
def served(smol):
    app = create_app(smol, served_model_name="smol", num_blocks=128)
    with BackgroundServer(app, start_timeout=WAIT) as url:
        assert app.state.engine_loop.ready.wait(WAIT)
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
        yield app, url, client


def test_greedy_completion_equals_generate_streamed_or_not(smol, served):
    _, _, client = served
    prompt = "The capital of France is"
    want = smol.generate(prompt, max_tokens=24)
    r = client.completions.create(model="smol", prompt=prompt, max_tokens=24, temperature=0)
    assert r.choices[0].text == want.text and r.choices[0].finish_reason == want.finish_reason
    assert r.usage.completion_tokens == len(want.token_ids)
    chunks = list(client.completions.create(model="smol", prompt=prompt, max_tokens=24, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want.text


def test_greedy_chat_equals_model_chat_streamed_or_not(smol, served):
    _, _, client = served
    messages = [{"role": "user", "content": "Name three colours."}]
    want = smol.chat(messages, max_tokens=24)
    r = client.chat.completions.create(model="smol", messages=messages, max_tokens=24, temperature=0)
    assert r.choices[0].message.content == want.text
    assert r.usage.prompt_tokens == want.prompt_tokens
    chunks = list(client.chat.completions.create(model="smol", messages=messages, max_tokens=24, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text


def test_streamed_deltas_are_whole_characters(smol, served):
    _, _, client = served
    messages = [{"role": "user", "content": "Reply with five emoji and the Japanese word for cat."}]
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="smol", messages=messages, max_tokens=40, temperature=0, stream=True)]
    assert "".join(deltas) == smol.chat(messages, max_tokens=40).text
    assert not any("\ufffd" in d for d in deltas)


def test_a_client_that_leaves_is_aborted_within_two_steps(served):
    app, url, _ = served
    loop = app.state.engine_loop

    def running() -> float:
        text = httpx.get(url + "/metrics", timeout=WAIT).text
        return float(re.search(r"^llmrs:num_requests_running\{[^}]*\} (\S+)$", text, re.M).group(1))

    body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True,
            "ignore_eos": True}
    with httpx.Client(base_url=url, timeout=WAIT) as http, http.stream("POST", "/v1/completions",
                                                                       json=body) as response:
        chunks = []
        for line in response.iter_lines():
            if line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
            if len(chunks) == 2:
                break
    steps_at_close = loop.steps
    deadline = time.monotonic() + WAIT
    while running():
        assert time.monotonic() < deadline
        time.sleep(0.005)
    assert loop.steps - steps_at_close <= 2
    assert not loop.engine.requests
