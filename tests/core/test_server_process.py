"""`llmrs serve` as a process (chapter 11): it starts from the CLI, drains the streams in flight on
SIGTERM, refuses new connections meanwhile, and exits 0. A tiny model, 127.0.0.1, a free port,
every wait bounded, the process always killed at the end.
"""

from __future__ import annotations

import json
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


def wait_ready(proc: subprocess.Popen, url: str, output) -> None:
    """Until ``url``'s /ready is 200; fails with the server's ``output()`` if it exits first."""
    deadline = time.monotonic() + WAIT
    while True:
        assert proc.poll() is None, output()
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not get ready"
        time.sleep(0.05)


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
        wait_ready(proc, url, proc.stdout.read)
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


# -- issue 27: start-up failures, hostile connections --------------------------------------------


def serve_command(path, port, *extra):
    return [sys.executable, "-m", "llmrs_core", "serve", str(path), "--port", str(port), "--backend", "numpy",
            "--served-model-name", "tiny", "--no-request-log", *extra]


def test_an_engine_that_cannot_start_ends_the_process_with_the_reason(tmp_path):
    """--num-blocks 1000000000 bound the port, said "Application startup complete" and stayed up in
    state failed forever, the reason only in /ready's body. Now: exit 1, the reason on stderr."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    r = subprocess.run(serve_command(path, free_port(), "--num-blocks", "1000000000"), capture_output=True,
                       text=True, timeout=WAIT, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("llmrs serve: error: the engine could not start:"), r.stderr
    assert "1,000,000,000 blocks" in last and "Traceback" not in r.stderr


def test_serve_stops_when_the_warm_up_fails(tmp_path, monkeypatch):
    """Any start-up failure of the engine, not only the pool's: serve() raises EngineStartError."""
    import llmrs_core as llmrs
    from llmrs_core.server import app as app_module
    from llmrs_core.server import create_app
    from llmrs_core.server.serve import EngineStartError, serve

    def failing_warm_up(model, block_size):
        raise RuntimeError("the kernels would not compile")

    monkeypatch.setattr(app_module, "_warm_up_engine", failing_warm_up)
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    app = create_app(llmrs.load(path, backend="numpy"), warm_up=True)
    started = time.monotonic()
    with pytest.raises(EngineStartError, match=r"could not start: .*RuntimeError: the kernels would not compile"):
        serve(app, port=free_port(), log_level="warning", drain=app.state.engine_loop,
              startup=app.state.engine_loop)
    assert time.monotonic() - started < WAIT


TIMEOUT = 1.0  # --header-timeout and --body-timeout of the server below


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server with 1 s read timeouts; its output goes to a file the tests can read at any time."""
    d = tmp_path_factory.mktemp("guarded")
    path = d / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    port = free_port()
    log = (d / "server.log").open("w")
    proc = subprocess.Popen(serve_command(path, port, "--header-timeout", str(TIMEOUT), "--body-timeout",
                                          str(TIMEOUT)),
                            env={**os.environ, "OPENBLAS_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, (d / "server.log").read_text)
        yield port, d / "server.log"
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(WAIT)
        log.close()


def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=WAIT)
    s.settimeout(WAIT)
    return s


def read_response(s: socket.socket) -> tuple[int, dict, bytes]:
    """One HTTP/1.1 response with a Content-Length: (status, headers, body); (0, {}, b"") at EOF."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    size = int(headers.get("content-length", 0))
    while len(rest) < size:
        chunk = s.recv(65536)
        if not chunk:
            break
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


def closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``s`` within ``seconds`` (whatever it writes first)."""
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_a_lone_surrogate_in_a_key_is_a_400_and_the_connection_lives(guarded):
    """A lone surrogate in a JSON key gave a 500 (the error's param could not be encoded), a
    traceback in the log, and a reset of the keep-alive connection."""
    port, log = guarded
    body = b'{"\\ud800": 1, "prompt": "x"}'
    with connect(port) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        status, _, answer = read_response(s)
        assert status == 400, answer
        error = json.loads(answer)["error"]
        assert error["param"] == "\\ud800" and "is not supported" in error["message"]
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")  # the same connection
        status, _, answer = read_response(s)
        assert status == 200 and json.loads(answer)["data"][0]["id"] == "tiny"
    assert "Traceback" not in log.read_text()


def test_a_trickled_header_is_cut_off_after_the_timeout(guarded):
    """A client that sends its headers a byte at a time was never timed out (300 such stayed open)."""
    port, _ = guarded
    with connect(port) as s:
        started = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        s.settimeout(0.2)
        answer = None
        while answer is None and time.monotonic() - started < TIMEOUT + 5:
            try:
                s.sendall(b"a")
                answer = s.recv(65536)  # the 408, or b"" at the close
            except TimeoutError:
                pass  # nothing yet: one more byte
            except OSError:  # reset, broken pipe: cut off
                answer = b""
        took = time.monotonic() - started
    assert answer is not None and (answer == b"" or answer.startswith(b"HTTP/1.1 408")), answer
    assert TIMEOUT * 0.9 <= took < TIMEOUT + 5, f"cut off after {took:.1f} s"


def test_an_unfinished_header_gets_a_408_and_is_closed(guarded):
    port, _ = guarded
    with connect(port) as s:
        started = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        status, _, body = read_response(s)
        took = time.monotonic() - started
        assert status == 408 and json.loads(body)["error"]["code"] == 408
        assert TIMEOUT * 0.9 <= took < TIMEOUT + 5
        assert closed_within(s, 5)


def test_a_body_shorter_than_its_length_gets_a_408_and_is_closed(guarded):
    port, log = guarded
    with connect(port) as s:
        started = time.monotonic()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\"")
        status, _, body = read_response(s)
        took = time.monotonic() - started
        assert status == 408 and "body did not arrive within" in json.loads(body)["error"]["message"]
        assert TIMEOUT * 0.9 <= took < TIMEOUT + 5
        assert closed_within(s, 5)
    time.sleep(0.2)
    assert "Traceback" not in log.read_text()


@pytest.mark.parametrize("headers", [
    b"X-Big: " + b"a" * 100_000 + b"\r\n",  # one 100 KB header
    b"".join(b"X-H%d: v\r\n" % i for i in range(500)),  # 500 headers
], ids=["a 100 KB header", "500 headers"])
def test_oversized_headers_are_refused(guarded, headers):
    port, _ = guarded
    with connect(port) as s:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n" + headers + b"\r\n")
        status, _, _ = read_response(s)
        assert status in (400, 431)
        assert closed_within(s, 5)


def test_a_normal_request_is_served_while_slow_clients_hang_and_they_are_all_closed(guarded):
    port, _ = guarded
    slow = [connect(port) for _ in range(50)]
    try:
        for s in slow:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        r = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=WAIT)
        assert r.status_code == 200 and time.monotonic() - started < 1.0
        time.sleep(TIMEOUT + 0.5)
        assert all(closed_within(s, 5) for s in slow), "every slow client is cut off after the header timeout"
    finally:
        for s in slow:
            s.close()


def test_a_keep_alive_connection_idle_past_the_header_timeout_still_serves(guarded):
    """The header timeout runs from a request's first byte: between requests uvicorn's keep-alive
    timeout (5 s) applies, and an answer is never cut, however long it takes."""
    port, _ = guarded
    with connect(port) as s:
        for _ in range(2):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            status, _, _ = read_response(s)
            assert status == 200
            time.sleep(TIMEOUT * 1.5)
