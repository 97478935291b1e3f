"""`llmrs serve` on SmolLM2 (chapter 11, ``@pytest.mark.model``): greedy output through the server
equals ``model.generate`` / ``model.chat``; streams are whole characters; a client that leaves is
aborted within two engine steps. One server for the module, on 127.0.0.1 and a free port.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.server import BackgroundServer, create_app  # noqa: E402
from llmrs_core.server.protocol import token_text  # noqa: E402

pytestmark = pytest.mark.model
WAIT = 120.0
GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.fixture(scope="module")
def smol(model_path):
    # exact: the logprobs test holds the server to transformers' logprobs at float32's level
    return llmrs.load(model_path, threads=2, exact=True)


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


def test_logprobs_through_the_server_match_transformers(smol, served):
    """The first generated token's log-probability, through HTTP and the openai client, against
    transformers' float32 run of the same weights (tests/golden, scripts/capture_golden.py)."""
    _, _, client = served
    golden = np.load(GOLDEN / "smollm2_hf_golden.npz")
    tokenizer = smol.tokenizer
    for i in range(len(golden["prompts"])):
        ids = golden[f"ids_{i}"].tolist()
        r = client.completions.create(model="smol", prompt=ids, max_tokens=1, temperature=0, logprobs=5)
        lp = r.choices[0].logprobs
        best = int(golden[f"argmax_{i}"][-1])
        assert lp.tokens == [token_text(tokenizer.token_bytes(best))], f"prompt {i}: not transformers' argmax"
        # 1e-3 nats: the bound test_model_golden.py justifies for our logits against transformers'
        assert abs(lp.token_logprobs[0] - float(golden[f"max_logprob_{i}"][-1])) < 1e-3, f"prompt {i}"
        sample = {token_text(tokenizer.token_bytes(int(t))): float(v)
                  for t, v in zip(golden[f"last_ids_{i}"], golden[f"last_logprobs_{i}"])}
        shared = set(sample) & set(lp.top_logprobs[0])
        assert all(abs(lp.top_logprobs[0][t] - sample[t]) < 1e-3 for t in shared), f"prompt {i}"
