"""`llmrs serve` under injected faults (chapter 12.3): a backend that raises, a step that stalls, a
client that never reads its stream, a deadline, SIGTERM during a burst.

Faults come from :mod:`llmrs_core.testing.faults` (a backend wrapper that raises or blocks at a
given forward pass) and the public configuration (``request_timeout``, ``step_timeout``,
``stream_buffer``). In every case: no client hangs (every wait is bounded by WAIT), each gets its
answer or a clear error, and afterwards the KV pool holds no block of theirs. Servers listen on
127.0.0.1 on a free port and are always stopped; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.bench.serve_compare import free_port  # noqa: E402
from llmrs_core.server import BackgroundServer, EngineLoop, create_app  # noqa: E402
from llmrs_core.server.loop import ENGINE_FAILED  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402
from llmrs_core.testing.faults import inject_faults  # noqa: E402

WAIT = 30.0  # seconds: the bound on every wait below (a hang fails, it does not block CI)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    return path


@pytest.fixture
def model(tiny_path):
    """A fresh model per test: the faults are injected into its backend."""
    return llmrs.load(tiny_path, backend="numpy")


class Live:
    """A running server: its engine loop, clients, and the JSON lines it logged."""

    def __init__(self, app, url, log: io.StringIO):
        self.app, self.url, self.log = app, url, log
        self.loop: EngineLoop = app.state.engine_loop
        self.client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
        self.http = httpx.Client(base_url=url, timeout=WAIT)

    def metric(self, name: str, labels: str = "") -> float:
        text = self.http.get("/metrics").text
        pattern = rf"^{re.escape(name)}{{[^}}]*{re.escape(labels)}[^}}]*}} (\S+)$"
        return sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M))

    def events(self, kind: str) -> list[dict]:
        lines = [json.loads(x) for x in self.log.getvalue().splitlines() if x]
        return [x for x in lines if x["event"] == kind]

    def wait_for(self, what: str, condition) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.01)

    def assert_no_leak(self) -> None:
        """The engine holds no request and every KV block is free or in the prefix cache."""
        self.wait_for("the engine to let go of its requests",
                      lambda: not self.loop._streams and not self.loop.engine.requests
                      and not self.loop.engine.has_unfinished())
        engine = self.loop.engine
        pool = engine.cache.allocator
        cached = engine.prefix_cache.num_blocks if engine.prefix_cache else 0
        assert pool.num_free + cached == pool.num_blocks, (
            f"{pool.num_blocks - pool.num_free - cached} KV blocks are neither free nor in the prefix cache")
        assert not engine.cache.tables


def serve(model, **kwargs):
    kwargs.setdefault("served_model_name", "tiny")
    kwargs.setdefault("warm_up", False)
    log = io.StringIO()
    app = create_app(model, request_log=log, **kwargs)
    return app, BackgroundServer(app), log


def stream_body(prompt: str, max_tokens: int, **extra) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "ignore_eos": True,
            "temperature": 0, **extra}


def sse_payloads(response: httpx.Response) -> list:
    """The events of a streamed response (dicts, then "[DONE]"), checking that it ends with [DONE]."""
    body = response.read().decode()
    assert body.endswith("data: [DONE]\n\n"), f"the stream did not end with [DONE]: ...{body[-300:]!r}"
    return [e[6:] if e == "data: [DONE]" else json.loads(e[6:]) for e in body.split("\n\n") if e]


def error_of(payloads: list) -> dict | None:
    errors = [p["error"] for p in payloads if isinstance(p, dict) and "error" in p]
    assert len(errors) <= 1, errors
    return errors[0] if errors else None


# -- an engine step that raises ---------------------------------------------------------------


def test_a_failing_step_fails_its_request_with_500_logs_its_batch_and_restarts_the_engine(model):
    # pass 3: the second decode token of the first request; pass 4: the probe that tells a broken
    # model from a request that fails alone (it fails too: the engine is restarted)
    faults = inject_faults(model, fail_at=3, fail_for=2)
    app, background, log = serve(model)
    with background as url:
        s = Live(app, url, log)
        with pytest.raises(openai.InternalServerError) as caught:
            s.client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
        # the client gets a stable message naming its own request; the fault itself is in the log
        assert caught.value.status_code == 500 and "restarted" in caught.value.message
        assert "injected fault" not in caught.value.message and "InjectedFault" not in caught.value.message
        assert "injected fault in forward pass 3" in s.events("request")[0]["error"]
        assert faults.faults == 2
        s.wait_for("the fresh engine", lambda: s.loop.state == "ready" and s.loop.restarts == 1)
        assert s.metric("llmrs:engine_restarts_total") == 1
        assert s.http.get("/ready").status_code == 200 and s.http.get("/health").status_code == 200
        (failure,) = s.events("engine_failure")
        assert failure["action"] == "restart" and "injected fault in forward pass 4" in failure["error"], failure
        (entry,) = failure["batch"]
        # pass 1 (the prefill) and pass 2 each sampled a token; pass 3 failed
        assert entry["prompt_tokens"] == 5 and entry["completion_tokens"] == 2 and entry["computed_tokens"] == 6
        assert s.events("request")[0]["finish_reason"] == "error"

        # the fresh engine serves: the same greedy text as the model alone
        r = s.client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
        assert r.choices[0].text == model.generate("hello", max_tokens=8).text
        s.assert_no_leak()


class SlowLog(io.StringIO):
    """A request log whose every write takes a while: a client answered before its line is
    written would find it missing."""

    def write(self, text: str) -> int:
        time.sleep(0.2)
        return super().write(text)


def test_a_client_holding_its_answer_finds_it_logged_and_counted(model):
    inject_faults(model, fail_at=3, fail_for=2)  # the step and the probe: an engine failure
    log = SlowLog()
    app = create_app(model, served_model_name="tiny", warm_up=False, request_log=log)
    with BackgroundServer(app) as url:
        s = Live(app, url, log)
        with pytest.raises(openai.InternalServerError):
            s.client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
        # no waiting here: the failure's line and count were written before its client's 500 left
        assert [f["action"] for f in s.events("engine_failure")] == ["restart"], (
            "the client had its error before the engine failure was logged")
        assert [r["finish_reason"] for r in s.events("request")] == ["error"]
        s.wait_for("the fresh engine", lambda: s.loop.state == "ready")
        s.client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0)
        assert [r["finish_reason"] for r in s.events("request")] == ["error", "length"], (
            "the client had its completion before its request line was logged")


def test_a_failing_step_in_a_stream_sends_an_error_event_then_done(model):
    inject_faults(model, fail_at=4, fail_for=2)  # the step and the probe
    app, background, log = serve(model)
    with background as url:
        s = Live(app, url, log)
        with s.http.stream("POST", "/v1/completions", json=stream_body("stream me", 20)) as response:
            payloads = sse_payloads(response)
        error = error_of(payloads)
        assert error is not None and error["code"] == 500 and "restarted" in error["message"]
        assert "injected fault" not in error["message"]
        texts = [p["choices"][0]["text"] for p in payloads[:-2] if isinstance(p, dict) and "choices" in p]
        assert len(texts) <= 3  # passes 1-3 sampled three bytes (an incomplete character is held back)
        assert payloads[-2] == {"error": error} and payloads[-1] == "[DONE]"
        s.wait_for("the restart", lambda: s.loop.restarts == 1 and s.loop.state == "ready")
        s.assert_no_leak()


def test_a_lasting_fault_under_load_fails_every_client_then_the_crash_loop_guard_goes_unready(model):
    inject_faults(model, fail_at=3, fail_for=None)  # a device that is gone: no restart can help
    app, background, log = serve(model, max_restarts=2, max_num_seqs=4)
    with background as url:
        s = Live(app, url, log)

        async def burst() -> list[str]:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
            http = httpx.AsyncClient(base_url=url, timeout=WAIT)

            async def plain(i: int) -> str:
                try:
                    await client.completions.create(model="tiny", prompt=f"load {i}", max_tokens=12, temperature=0)
                    return "ok"
                except openai.APIStatusError as e:
                    return str(e.status_code)

            async def streamed(i: int) -> str:
                async with http.stream("POST", "/v1/completions", json=stream_body(f"load {i}", 12)) as r:
                    if r.status_code != 200:
                        return str(r.status_code)
                    body = (await r.aread()).decode()
                    assert body.endswith("data: [DONE]\n\n"), body[-300:]
                    m = re.search(r'"error":\{[^}]*"code":(\d+)', body)
                    return m.group(1) if m else "ok"

            try:
                return await asyncio.gather(*(plain(i) if i % 2 else streamed(i) for i in range(8)))
            finally:
                await client.close()
                await http.aclose()

        outcomes = asyncio.run(asyncio.wait_for(burst(), WAIT))
        assert "ok" not in outcomes and set(outcomes) <= {"500", "503"}, outcomes
        # each failing step counts; how many the burst made depends on how its requests were batched,
        # so requests go on (each failing) until the guard gives up: after 2 restarts, the third failure
        for _ in range(4):
            if s.loop.state == "failed":
                break
            with pytest.raises(openai.InternalServerError):
                s.client.completions.create(model="tiny", prompt="again", max_tokens=4)
        s.wait_for("the loop to give up", lambda: s.loop.state == "failed")
        assert s.metric("llmrs:engine_restarts_total") == 2
        ready, health = s.http.get("/ready"), s.http.get("/health")
        assert ready.status_code == 503 and ready.json()["status"] == "failed"
        assert health.status_code == 503 and health.json()["error"] == ENGINE_FAILED  # a stable, public text
        assert "injected fault" not in health.text and "injected fault" in s.loop.error  # the reason: the log
        failures = s.events("engine_failure")
        assert [f["action"] for f in failures] == ["restart", "restart", "unready"]
        assert all(f["batch"] for f in failures)
        with pytest.raises(openai.InternalServerError) as caught:  # 503: no engine any more
            s.client.completions.create(model="tiny", prompt="x", max_tokens=1)
        assert caught.value.status_code == 503
        engine = s.loop.engine  # the last engine, left as it failed: its requests were all aborted
        assert engine.cache.allocator.num_free + (engine.prefix_cache.num_blocks if engine.prefix_cache else 0) \
            == engine.cache.allocator.num_blocks


def test_waiting_requests_are_retried_in_the_fresh_engine(model):
    # one request runs at a time. The first stalls in pass 2 while two more arrive and queue behind
    # it; then its pass 3 fails, and so does the probe (pass 4): it gets the error, the two that
    # never started run in the fresh engine
    faults = inject_faults(model, stall_at=2, stall_s=WAIT, fail_at=3, fail_for=2)
    app, background, log = serve(model, max_num_seqs=1)
    with background as url:
        s = Live(app, url, log)

        async def three() -> list:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)

            async def one(prompt: str):
                try:
                    return await client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0)
                except openai.APIStatusError as e:
                    return e

            async def until(condition) -> None:
                deadline = time.monotonic() + WAIT
                while not condition():
                    assert time.monotonic() < deadline, "timed out"
                    await asyncio.sleep(0.01)

            try:
                first = asyncio.ensure_future(one("one"))
                await until(faults.stalling.is_set)
                others = [asyncio.ensure_future(one(p)) for p in ("two", "six")]
                await until(lambda: s.loop.num_waiting == 2)
                faults.release()
                return [await first] + [await o for o in others]
            finally:
                faults.release()
                await client.close()

        first, *others = asyncio.run(asyncio.wait_for(three(), WAIT))
        assert isinstance(first, openai.InternalServerError) and "restarted" in first.message
        for prompt, r in zip(("two", "six"), others):
            assert not isinstance(r, Exception), r
            assert r.choices[0].text == model.generate(prompt, max_tokens=6).text
        (failure,) = s.events("engine_failure")
        assert len(failure["failed"]) == 1 and len(failure["retried"]) == 2, failure
        s.assert_no_leak()


@pytest.mark.parametrize("fail_for, first_fails", [(1, False), (2, True)])
def test_a_fault_that_fails_one_request_of_a_batch_is_not_an_engine_failure(model, fail_for, first_fails):
    # the first request stalls in pass 2 while a second arrives; pass 3 runs both as one batch and
    # fails. The engine then runs each alone (passes 4 and 5): with fail_for=1 both succeed (no client
    # sees the fault), with fail_for=2 the first fails alone (pass 4) and the second goes on. Neither
    # is the engine's failure: no restart.
    faults = inject_faults(model, stall_at=2, stall_s=WAIT, fail_at=3, fail_for=fail_for)
    app, background, log = serve(model)
    with background as url:
        s = Live(app, url, log)

        async def two() -> list:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)

            async def one(prompt: str):
                try:
                    return await client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0)
                except openai.APIStatusError as e:
                    return e

            async def until(condition) -> None:
                deadline = time.monotonic() + WAIT
                while not condition():
                    assert time.monotonic() < deadline, "timed out"
                    await asyncio.sleep(0.01)

            try:
                first = asyncio.ensure_future(one("one"))
                await until(faults.stalling.is_set)
                second = asyncio.ensure_future(one("two"))
                await until(lambda: s.loop.num_waiting == 1)
                faults.release()
                return [await first, await second]
            finally:
                faults.release()
                await client.close()

        first, second = asyncio.run(asyncio.wait_for(two(), WAIT))
        assert faults.faults == fail_for
        if first_fails:
            assert isinstance(first, openai.InternalServerError) and "forward pass" not in first.message
            assert "forward pass 4" in s.events("request")[0]["error"]  # the log has it
        else:
            assert first.choices[0].text == model.generate("one", max_tokens=6).text
        assert second.choices[0].text == model.generate("two", max_tokens=6).text
        assert s.loop.restarts == 0 and not s.events("engine_failure") and s.loop.state == "ready"
        s.assert_no_leak()


# -- deadlines, stalls, slow readers -------------------------------------------------------------


def test_a_deadline_fires_while_the_engine_thread_is_stuck_and_frees_the_blocks(model):
    faults = inject_faults(model, stall_at=2, stall_s=WAIT)  # no watchdog: only the deadline can answer
    app, background, log = serve(model, request_timeout=1.0)
    with background as url:
        s = Live(app, url, log)
        try:
            with s.http.stream("POST", "/v1/completions", json=stream_body("late", 50)) as response:
                payloads = sse_payloads(response)
            error = error_of(payloads)
            assert error is not None and error["code"] == 504 and "deadline of 1 s" in error["message"]
            assert faults.stalling.is_set()  # the answer came while the step was still stuck
            with pytest.raises(openai.APIStatusError) as caught:
                s.client.completions.create(model="tiny", prompt="late too", max_tokens=5)
            assert caught.value.status_code == 504 and "deadline" in caught.value.message
            assert s.http.get("/ready").status_code == 200  # a deadline is the request's, not the server's
        finally:
            faults.release()
        # the stream was in the engine: aborted there; the second never got in (its abort came first)
        s.wait_for("the abort", lambda: s.metric("llmrs:request_success_total", 'finished_reason="abort"') == 1)
        s.assert_no_leak()
        assert [x["finish_reason"] for x in s.events("request")] == ["abort"]


def test_a_stalled_step_makes_the_server_unready_fails_what_is_in_flight_then_restarts(model):
    faults = inject_faults(model, stall_at=3, stall_s=WAIT)
    app, background, log = serve(model, step_timeout=1.0)
    with background as url:
        s = Live(app, url, log)
        try:
            with s.http.stream("POST", "/v1/completions", json=stream_body("stuck", 50)) as response:
                payloads = sse_payloads(response)
            error = error_of(payloads)
            assert error is not None and error["code"] == 503 and "--step-timeout" in error["message"]
            assert faults.stalling.is_set()
            ready, health = s.http.get("/ready"), s.http.get("/health")
            assert ready.status_code == 503 and ready.json()["status"] == "stalled"
            assert health.status_code == 503  # wedged: a liveness probe restarts a process stuck for good
            with pytest.raises(openai.InternalServerError) as caught:
                s.client.completions.create(model="tiny", prompt="x", max_tokens=1)
            assert caught.value.status_code == 503
        finally:
            faults.release()  # the step returns: its outputs are dropped and the engine rebuilt
        s.wait_for("the restart after the stall", lambda: s.loop.state == "ready" and s.loop.restarts == 1)
        assert s.http.get("/ready").status_code == 200 and s.metric("llmrs:engine_restarts_total") == 1
        assert [f["where"] for f in s.events("engine_failure")] == ["stall", "stall"]
        r = s.client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
        assert r.choices[0].text == model.generate("hello", max_tokens=8).text
        assert s.events("request")[0]["finish_reason"] == "error"  # the stalled request, counted and logged
        s.assert_no_leak()


def test_a_client_that_never_reads_its_stream_is_aborted_and_the_others_go_on(model):
    app, background, log = serve(model, stream_buffer=4)
    with background as url:
        s = Live(app, url, log)
        # connections accepted from now on inherit a small send buffer (Linux), so that the server's
        # socket fills in a few kilobytes instead of megabytes; the client's receive window is small too
        background.server.servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        port = int(url.rsplit(":", 1)[1])
        idle = socket.socket()
        idle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        idle.settimeout(WAIT)
        try:
            idle.connect(("127.0.0.1", port))
            body = json.dumps(stream_body("never read", 400, n=16)).encode()
            idle.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body) + body)
            # meanwhile another client is served in full
            r = s.client.completions.create(model="tiny", prompt="hello", max_tokens=8, temperature=0)
            assert r.choices[0].text == model.generate("hello", max_tokens=8).text
            s.wait_for("the slow reader's abort",
                       lambda: s.metric("llmrs:request_success_total", 'finished_reason="abort"') == 16)
            s.assert_no_leak()
            aborted = [x for x in s.events("request") if x["finish_reason"] == "abort"]
            assert len(aborted) == 16 and all(x["completion_tokens"] < 400 for x in aborted)
        finally:
            idle.close()


# -- drain ----------------------------------------------------------------------------------------


def test_drain_turns_ready_503_refuses_new_requests_and_cuts_what_runs_past_the_timeout(model):
    inject_faults(model, pass_delay_s=0.02)  # a slow device: 200 tokens cannot finish within the drain
    log = io.StringIO()
    app = create_app(model, served_model_name="tiny", warm_up=False, request_log=log)
    background = BackgroundServer(app, drain=app.state.engine_loop, drain_timeout=0.5)
    with background as url:
        s = Live(app, url, log)
        with s.http.stream("POST", "/v1/completions", json=stream_body("long", 200)) as response:
            lines = response.iter_lines()
            first = next(lines)
            assert first.startswith("data: {"), first
            background.terminate()  # what SIGTERM does to llmrs serve
            with httpx.Client(base_url=url, timeout=WAIT) as other:  # a new connection: still answered
                ready = other.get("/ready")
                assert ready.status_code == 503 and ready.json()["status"] == "draining"
                assert other.get("/health").status_code == 200
                refused = other.post("/v1/completions", json={"model": "tiny", "prompt": "new", "max_tokens": 2})
                assert refused.status_code == 503 and "draining" in refused.json()["error"]["message"]
            rest = "\n".join(lines)
        assert rest.rstrip().endswith("data: [DONE]")
        assert '"code":503' in rest and "drain timeout (0.5 s)" in rest
        background.thread.join(WAIT)  # drained: the server stops by itself
        assert not background.thread.is_alive(), "the server did not stop after the drain"
        engine = s.loop.engine
        pool = engine.cache.allocator
        assert pool.num_free + engine.prefix_cache.num_blocks == pool.num_blocks and not engine.requests
        assert [x["finish_reason"] for x in s.events("request")] == ["abort"]


def test_sigterm_during_a_burst_drains_and_exits_0(tiny_path):
    port = free_port()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    argv = [sys.executable, "-m", "llmrs_core.cli", "serve", str(tiny_path), "--backend", "numpy", "--port",
            str(port), "--drain-timeout", "1", "--no-request-log"]
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + WAIT
        while True:
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            try:
                if httpx.get(url + "/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.05)

        async def burst() -> list[str]:
            async with httpx.AsyncClient(base_url=url, timeout=WAIT) as http:
                started = asyncio.Event()
                count = 0

                async def one(i: int) -> str:
                    nonlocal count
                    async with http.stream("POST", "/v1/completions",
                                           json=stream_body(f"burst {i}", 480 if i % 2 else 8)) as r:
                        assert r.status_code == 200
                        lines, streaming = [], False
                        async for line in r.aiter_lines():
                            lines.append(line)
                            if line.startswith("data: {") and not streaming:
                                streaming = True
                                count += 1  # this request is streaming: SIGTERM once all six are
                                if count == 6:
                                    started.set()
                    assert lines[-2] == "data: [DONE]" or lines[-1] == "data: [DONE]", lines[-3:]
                    text = "\n".join(lines)
                    return "error" if '"error"' in text else "done"

                async def terminate() -> str:
                    await asyncio.wait_for(started.wait(), WAIT)
                    proc.send_signal(signal.SIGTERM)
                    await asyncio.sleep(0.1)  # the signal is handled
                    try:  # the server still listens while it drains: a new request is refused with 503
                        async with httpx.AsyncClient(base_url=url, timeout=WAIT) as late:
                            r = await late.post("/v1/completions", json={"model": "tiny", "prompt": "late",
                                                                          "max_tokens": 2})
                        return str(r.status_code)
                    except httpx.ConnectError:  # ... unless it had drained already
                        return "drained"

                results = await asyncio.gather(*(one(i) for i in range(6)), terminate())
                return results

        *outcomes, late = asyncio.run(asyncio.wait_for(burst(), WAIT))
        assert set(outcomes) <= {"done", "error"} and len(outcomes) == 6
        assert late in ("503", "drained"), late
        assert proc.wait(WAIT) == 0, proc.stderr.read().decode()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT)
        proc.stderr.close()


# -- loading, and bad settings ---------------------------------------------------------------------


def test_while_loading_the_server_is_alive_but_not_ready(model):
    faults = inject_faults(model, stall_at=1, stall_s=WAIT)
    faults.warm_up_sizes = (1,)  # warming up runs one forward pass: pass 1, which blocks
    app = create_app(model, served_model_name="tiny", warm_up=True)
    with BackgroundServer(app, wait_ready=False) as url:
        try:
            deadline = time.monotonic() + WAIT
            while not faults.stalling.is_set():
                assert time.monotonic() < deadline, "the warm-up did not start"
                time.sleep(0.01)
            health, ready = httpx.get(url + "/health", timeout=WAIT), httpx.get(url + "/ready", timeout=WAIT)
            assert health.status_code == 200 and health.json() == {"status": "loading"}
            assert ready.status_code == 503 and ready.json() == {"status": "loading"}
        finally:
            faults.release()
        assert app.state.engine_loop.ready.wait(WAIT)
        assert httpx.get(url + "/ready", timeout=WAIT).json() == {"status": "ready"}


@pytest.mark.parametrize("flag, value, says", [
    ("--request-timeout", "0", "--request-timeout must be > 0 seconds"),
    ("--step-timeout", "-1", "--step-timeout must be > 0 seconds"),
    ("--stream-buffer", "0", "--stream-buffer must be at least 1"),
    ("--max-engine-restarts", "-1", "--max-engine-restarts must be at least 0"),
])
def test_bad_fault_settings_are_one_clear_line(tiny_path, capsys, flag, value, says):
    from llmrs_core import cli

    assert cli.main(["serve", str(tiny_path), "--backend", "numpy", flag, value]) == 1
    err = capsys.readouterr().err
    assert err.startswith("llmrs serve: error:") and says in err and err.count("\n") == 1, err
