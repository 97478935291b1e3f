"""Code plugged into the server — a learner's, or anyone's — that goes wrong is named in the server's
log, not hidden (clients get a stable message):
the finished-request recorder (``ServerMetrics.record_at_finish``, Exercise 12.7), the stream
writer (``create_app(stream_events=)``, Exercise 11.6) and the container entrypoint's checker
(``--checker``, Exercise 12.6). Servers listen on 127.0.0.1 on a free port and are always stopped.
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.ops.entrypoint import EX_CONFIG  # noqa: E402
from llmrs_core.server import BackgroundServer, create_app  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402

WAIT = 30.0


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugins") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    return llmrs.load(path, backend="numpy")


def test_a_recorder_that_raises_is_named_in_the_servers_log(model, capfd):
    def record_finished_request(metrics, timing, prompt_tokens, output_ids):
        raise ZeroDivisionError("division by zero")

    app = create_app(model, served_model_name="tiny", warm_up=False)
    app.state.metrics.record_at_finish(record_finished_request)
    with BackgroundServer(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
        with pytest.raises(openai.InternalServerError) as caught:
            client.completions.create(model="tiny", prompt="hello", max_tokens=3)
    # the client gets a stable message (no exception of the server's reaches a client); the
    # engine_failure line (stderr, without a request log) names the plugged-in code and its error
    message = caught.value.body["message"]
    assert "ZeroDivisionError" not in message and "failed" in message, message
    log = capfd.readouterr().err
    assert "Exercise 12.7's record_finished_request" in log and "ZeroDivisionError" in log, log[-2000:]


def test_a_writer_that_yields_text_is_named_in_the_servers_log(model, capfd):
    async def sse_events(stream, info, include_usage, abort):
        async for _ in stream:
            yield "data: not bytes\n\n"  # the mistake: str, not bytes

    app = create_app(model, served_model_name="tiny", warm_up=False, stream_events=sse_events)
    with BackgroundServer(app) as url:
        body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "stream": True}
        with pytest.raises(httpx.HTTPError):  # the stream breaks off: it does not hang
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=WAIT) as r:
                r.read()
    log = capfd.readouterr().err  # uvicorn's error log, with the traceback
    assert "Exercise 11.6's sse_events when plugged in) yielded str" in log, log[-2000:]


@pytest.mark.parametrize("body, says", [
    ("def check_serve_environment(env, cpu_count=None):\n    return 1 / 0\n", "raised ZeroDivisionError"),
    ("def check_serve_environment(env, cpu_count=None):\n    return {'port': 8000}\n", "returned dict"),
])
def test_a_broken_checker_is_one_line_naming_it(tmp_path, body, says):
    checker = tmp_path / "exercises.py"
    checker.write_text(body)
    done = subprocess.run([sys.executable, "-m", "llmrs_core.ops.entrypoint", "--checker", str(checker),
                           "--check-only"], capture_output=True, text=True, timeout=60)
    assert done.returncode == EX_CONFIG, done.stderr
    line = done.stderr.strip()
    assert "\n" not in line and "Traceback" not in line, line
    assert f"check_serve_environment of {checker} (Exercise 12.6)" in line and says in line, line
