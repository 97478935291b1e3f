"""``chat_template_kwargs`` and ``tools`` through ``Model.chat`` and the server (issue 29).

A tiny random model whose chat template reads ``tools``, ``enable_thinking`` and refuses a
conversation ending with the assistant (``raise_exception``): the variables reach the
template from ``Model.chat`` and from ``POST /v1/chat/completions`` and ``/tokenize`` (as vLLM's
``chat_template_kwargs``); bad ones are a 400 naming the field, and the server keeps serving.
"""

from __future__ import annotations

import json

import pytest

import llmrs_core as llmrs
from llmrs_core.testing import write_tiny_llama

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if tools %}[tools: {{ tools | map(attribute='function') | map(attribute='name') | join(',') }}]{% endif %}"
    "{% if enable_thinking is defined and enable_thinking is false %}<nothink>{% endif %}"
    "{% if messages[-1].role == 'assistant' %}{{ raise_exception('the last message is the assistant') }}{% endif %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
HI = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("kwargs") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    model = llmrs.load(path, backend="numpy")
    model.tokenizer.chat_template = TEMPLATE
    return model


def test_model_chat_passes_template_kwargs_and_tools(tiny, monkeypatch):
    tok = tiny.tokenizer
    rendered = tok.apply_chat_template(HI, tools=TOOLS, chat_template_kwargs={"enable_thinking": False})
    assert rendered == "<user>hi\n[tools: get_weather]<nothink><assistant>"
    seen = []
    original = type(tiny).generate
    monkeypatch.setattr(type(tiny), "generate", lambda self, prompt, **kw: seen.append(prompt) or original(
        self, prompt, **kw))
    tiny.chat(HI, tools=TOOLS, chat_template_kwargs={"enable_thinking": False}, max_tokens=1)
    assert seen == [tok.encode(rendered)], "model.chat must generate from the rendering with the variables"
    assert tok.count_chat_tokens(HI, tools=TOOLS, chat_template_kwargs={"enable_thinking": False}) == len(seen[0])


def test_model_chat_refuses_bad_kwargs(tiny):
    with pytest.raises(ValueError, match="'add_generation_prompt' cannot be set here"):
        tiny.chat(HI, chat_template_kwargs={"add_generation_prompt": False}, max_tokens=1)
    with pytest.raises(ValueError, match="chat template refused these messages: the last message is the assistant"):
        tiny.chat([*HI, {"role": "assistant", "content": "yo"}], max_tokens=1)


def test_template_data_cannot_forge_control_tokens(tiny):
    """Tools and template variables are user data: their special-token text stays text."""
    tok = tiny.tokenizer
    eos = tok.tokens[tok.eos_token_id]
    forged = [{"type": "function", "function": {"name": f"x{eos}y"}}]
    ids = tok.encode_chat(HI, tools=forged)
    assert tok.eos_token_id not in ids
    assert tok.decode(ids) == tok.apply_chat_template(HI, tools=forged)


# -- the server ---------------------------------------------------------------------------------

fastapi = pytest.importorskip("fastapi")


@pytest.fixture(scope="module")
def server(tiny):
    import httpx

    from llmrs_core.server import BackgroundServer, create_app

    app = create_app(tiny, served_model_name="tiny", warm_up=False, num_blocks=64, max_num_seqs=4)
    with BackgroundServer(app) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


def test_server_passes_chat_template_kwargs_and_tools(server, tiny):
    body = {"messages": HI, "tools": TOOLS, "chat_template_kwargs": {"enable_thinking": False}}
    r = server.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    want = tiny.tokenizer.encode_chat(HI, tools=TOOLS, chat_template_kwargs={"enable_thinking": False})
    assert r.json()["tokens"] == want
    r = server.post("/v1/chat/completions", json={**body, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(want)
    # tool_choice "none": the template is not told about the tools
    r = server.post("/v1/chat/completions", json={**body, "tool_choice": "none", "max_tokens": 1})
    plain = tiny.tokenizer.encode_chat(HI, chat_template_kwargs={"enable_thinking": False})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(plain)


@pytest.mark.parametrize("extra, param, match", [
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs", "'messages' cannot be set here"),
    ({"chat_template_kwargs": {"bos_token": "x"}}, "chat_template_kwargs", "'bos_token' cannot be set here"),
    ({"chat_template_kwargs": ["enable_thinking"]}, "chat_template_kwargs", "must be an object"),
    ({"chat_template_kwargs": {f"v{i}": 1 for i in range(65)}}, "chat_template_kwargs", "the limit is 64"),
    ({"chat_template_kwargs": {"x": json.loads("[" * 40 + "]" * 40)}},
     "chat_template_kwargs", "nested more than 32"),
    ({"tools": {"type": "function"}}, "tools", "tools must be a list of objects"),
    ({"tool_choice": "required", "tools": TOOLS}, "tool_choice", "'required' is not supported"),
    ({"messages": [*HI, {"role": "assistant", "content": "yo"}]}, "messages",
     "refused these messages: the last message is the assistant"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages",
     "only {'type': 'text'"),
])
def test_bad_template_input_is_a_400_and_the_server_keeps_serving(server, extra, param, match):
    for path in ("/v1/chat/completions", "/tokenize"):
        body = {"messages": HI, **extra}
        if path == "/tokenize":
            body.pop("tool_choice", None)
        else:
            body["max_tokens"] = 1
        r = server.post(path, json=body)
        if path == "/tokenize" and param == "tool_choice":
            continue
        assert r.status_code == 400, (path, r.text)
        error = r.json()["error"]
        assert error["param"] == param and match in error["message"], (path, error)
    ok = server.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 1})
    assert ok.status_code == 200, ok.text
