"""``llmrs ab serve`` as a process (chapter 12, section 12.4): it starts one ``llmrs serve`` per variant
and the router, answers through the ``openai`` client with the variant in a header, writes its
request log, and on SIGTERM stops with every child. Tiny models, 127.0.0.1, every wait bounded,
every process killed at the end whatever happens.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from llmrs_core.testing import write_tiny_llama  # noqa: E402

WAIT = 120.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def children_of(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_ab_serve_routes_logs_and_stops_with_its_children(tmp_path):
    for seed in (1, 2):
        write_tiny_llama(tmp_path / f"v{seed}.gguf", byte_tokenizer=True, seed=seed)
    port, log = free_port(), tmp_path / "requests.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmrs_core", "ab", "serve", "--variant", f"a={tmp_path / 'v1.gguf'}:numpy@1",
         "--variant", f"b={tmp_path / 'v2.gguf'}:numpy@0", "--port", str(port), "--log", str(log),
         "--served-model-name", "smol"],
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    children: list[int] = []
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "llmrs ab serve did not get ready"
            time.sleep(0.1)
        children = children_of(proc.pid)
        assert len(children) == 2, "one server process per variant"
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
        raw = client.completions.with_raw_response.create(model="smol", prompt="hi", max_tokens=3, user="anyone")
        assert raw.headers["x-llmrs-variant"] == "a", "variant b has weight 0"
        assert raw.parse().usage.completion_tokens <= 3
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, out
        deadline = time.monotonic() + 30
        while any(alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(c) for c in children), "the variants' servers outlived the router"
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert [(r["variant"], r["status"]) for r in lines] == [("a", 200)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        for c in children:
            if alive(c):
                os.kill(c, signal.SIGKILL)
