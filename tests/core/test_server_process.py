"""`llmrs serve` as a process (chapter 11): it starts from the CLI, drains the streams in flight on
SIGTERM, refuses new connections meanwhile, and exits 0. A tiny model, 127.0.0.1, a free port,
every wait bounded, the process always killed at the end.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from llmrs_core.testing import write_tiny_llama  # noqa: E402

WAIT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def process(tmp_path):
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    port = free_port()
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmrs_core", "serve", str(path), "--port", str(port), "--backend", "numpy",
         "--served-model-name", "tiny", "--drain-timeout", "20"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.05)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT)


def test_sigterm_drains_streams_in_flight_and_exits_0(process):
    proc, url = process
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
    results, started = {}, threading.Barrier(4)

    def stream(i):
        chunks = client.completions.create(model="tiny", prompt=f"drain {i}", max_tokens=300, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        text, finish, first = "", None, True
        for chunk in chunks:
            if first:
                started.wait(WAIT)
                first = False
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        results[i] = finish

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    started.wait(WAIT)  # every stream has its first chunk
    proc.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(WAIT)
    assert proc.wait(WAIT) == 0, proc.stdout.read()
    assert results == {0: "length", 1: "length", 2: "length"}, "every stream in flight must finish"
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)


def test_serve_without_a_model_file_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "llmrs_core", "serve", str(tmp_path / "missing.gguf")],
                       capture_output=True, text=True, timeout=WAIT)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith("llmrs serve: error:")


def test_serve_without_the_serve_extra_says_how_to_install_it(monkeypatch, capsys):
    from llmrs_core import cli

    for name in [m for m in sys.modules if m == "llmrs_core.server" or m.startswith("llmrs_core.server.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fastapi", None)  # as if it were not installed
    assert cli.main(["serve"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'llmrs-core[serve]'" in err
