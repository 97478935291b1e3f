"""The A/B router (chapter 12, section 12.4) in front of two real ``llmrs`` servers on a tiny model,
read by the official ``openai`` client: sticky variants named in a header, streams passed on
intact, usage counted per variant in ``/metrics`` and the request log, and an upstream that is
down (or breaks off a stream) answered with an error naming the variant. 127.0.0.1 only, every
server stopped at the end, every wait bounded.
"""

from __future__ import annotations

import io
import json
import socket
import threading

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from llmrs_core import load  # noqa: E402
from llmrs_core.ab.assign import assign  # noqa: E402
from llmrs_core.ab.record import RequestRecord  # noqa: E402
from llmrs_core.ab.router import VARIANT_HEADER, create_router  # noqa: E402
from llmrs_core.ab.variants import Upstream  # noqa: E402
from llmrs_core.server import BackgroundServer, create_app  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402

WAIT = 60.0
WEIGHTS = {"a": 1.0, "b": 1.0}


class Log(io.StringIO):
    def records(self) -> list[dict]:
        return [json.loads(line) for line in self.getvalue().splitlines()]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Two variants (tiny models from different seeds) behind a router; yields (router URL, log, upstream URLs)."""
    d = tmp_path_factory.mktemp("ab")
    apps = []
    for seed, name in ((1, "tiny-a"), (2, "tiny-b")):
        write_tiny_llama(d / f"{name}.gguf", byte_tokenizer=True, seed=seed)
        apps.append(create_app(load(d / f"{name}.gguf", backend="numpy"), served_model_name=name, warm_up=False))
    with BackgroundServer(apps[0]) as url_a, BackgroundServer(apps[1]) as url_b:
        log = Log()
        router = create_router([Upstream("a", url_a), Upstream("b", url_b)], salt="t", served_model_name="smol",
                               request_log=log, timeout=WAIT)
        with BackgroundServer(router) as url:
            yield url, log, {"a": url_a, "b": url_b}


def users_of(variant: str, n: int) -> list[str]:
    return [u for u in (f"user-{i}" for i in range(200)) if assign(u, WEIGHTS, "t") == variant][:n]


def client(url: str):
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)


def test_each_user_gets_their_variant_in_the_header_and_the_upstreams_answer(servers):
    url, log, _ = servers
    c = client(url)
    for variant in ("a", "b"):
        for user in users_of(variant, 2):
            for _ in range(2):  # sticky: the same user, the same variant
                raw = c.chat.completions.with_raw_response.create(
                    model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
                    user=user, extra_body={"ignore_eos": True})
                assert raw.headers[VARIANT_HEADER] == variant
                answer = raw.parse()
                assert answer.model == f"tiny-{variant}", "the upstream that answered is the variant's"
                assert answer.usage.completion_tokens == 4


def test_a_stream_is_passed_on_and_timed(servers):
    url, log, _ = servers
    user = users_of("b", 1)[0]
    c = client(url)
    with c.completions.with_streaming_response.create(model="smol", prompt="stream me", max_tokens=6,
                                                      temperature=0, stream=True, user=user,
                                                      extra_body={"ignore_eos": True}) as raw:
        assert raw.headers[VARIANT_HEADER] == "b"
        chunks = list(raw.parse())
    assert chunks and all(ch.usage is None for ch in chunks), "no usage chunk unless the client asked for one"
    assert chunks[-1].choices[0].finish_reason == "length"
    # the same request without the router: the same text (greedy), so nothing was lost or reordered
    direct = client(servers[2]["b"]).completions.create(model="tiny-b", prompt="stream me", max_tokens=6,
                                                        temperature=0, extra_body={"ignore_eos": True})
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == direct.choices[0].text
    rec = log.records()[-1]
    assert (rec["variant"], rec["stream"], rec["completion_tokens"], rec["status"]) == ("b", True, 6, 200)
    assert rec["ttft_s"] is not None and rec["tpot_s"] is not None and rec["ttft_s"] <= rec["e2e_s"]
    assert set(rec) - {"event"} == set(RequestRecord.__dataclass_fields__)


def test_a_stream_with_usage_asked_for_keeps_its_usage_chunk(servers):
    url, _, _ = servers
    chunks = list(client(url).chat.completions.create(
        model="smol", messages=[{"role": "user", "content": "x"}], max_tokens=3, stream=True, temperature=0,
        user="u", stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3


def test_metrics_carry_the_variant_label_and_agree_with_usage(servers):
    url, log, _ = servers
    c = client(url)
    for user in users_of("a", 1) + users_of("b", 1):
        c.completions.create(model="smol", prompt="count", max_tokens=5, user=user, extra_body={"ignore_eos": True})
    text = httpx.get(url + "/metrics", timeout=WAIT).text
    for variant in ("a", "b"):
        logged = sum(r["completion_tokens"] or 0 for r in log.records() if r["variant"] == variant)
        line = f'llmrs:ab_generation_tokens_total{{variant="{variant}"}} {float(logged)}'
        assert line in text, f"{line!r} not in /metrics"
    assert 'llmrs:ab_time_to_first_token_seconds_count{variant="b"}' in text


def test_health_ready_and_models(servers):
    url, _, _ = servers
    assert httpx.get(url + "/health", timeout=WAIT).status_code == 200
    r = httpx.get(url + "/ready", timeout=WAIT)
    assert r.status_code == 200 and r.json()["variants"] == {"a": "ok", "b": "ok"}
    assert [m.id for m in client(url).models.list().data] == ["smol"]


def test_bad_requests_are_refused_by_name(servers):
    url, _, _ = servers
    c = client(url)
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        c.completions.create(model="other", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError, match="user must be a string"):
        c.completions.create(model="smol", prompt="x", max_tokens=1, extra_body={"user": 5})
    with pytest.raises(openai.BadRequestError, match="max_tokens"):  # the upstream's own refusal, passed on
        c.completions.create(model="smol", prompt="x", max_tokens=-1, user="u")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_upstream_that_is_down_gives_502_naming_the_variant(servers):
    _, _, urls = servers
    dead = f"http://127.0.0.1:{free_port()}"
    router = create_router([Upstream("up", urls["a"], 0), Upstream("down", dead, 1)], timeout=WAIT)
    with BackgroundServer(router, wait_ready=False) as url:  # not ready: one variant is down
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 1, "user": "u"}, timeout=WAIT)
        assert r.status_code == 502 and r.headers[VARIANT_HEADER] == "down"
        assert "'down'" in r.json()["error"]["message"] and dead in r.json()["error"]["message"]
        ready = httpx.get(url + "/ready", timeout=WAIT)
        assert ready.status_code == 503 and ready.json()["variants"]["down"].startswith("unavailable")


def read_request(conn: socket.socket) -> bytes:
    """A whole HTTP request, headers and ``content-length`` body: closing a connection with a part of
    the request still unread makes the kernel reset it, and the client sees a ReadError instead of
    the response (it happened on a busy machine, where the body arrived after the headers)."""
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return data
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        part = conn.recv(65536)
        if not part:
            break
        body += part
    return head + b"\r\n\r\n" + body


def broken_upstream() -> tuple[str, threading.Thread, socket.socket]:
    """A server that answers /v1/models, then starts a stream, sends one chunk and closes the connection."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)
    sock.settimeout(WAIT)
    chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
             "choices": [{"index": 0, "text": "half", "finish_reason": None}]}

    def serve() -> None:
        for _ in range(2):
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(WAIT)
                request = read_request(conn)
                if request.startswith(b"GET /v1/models"):
                    body = json.dumps({"data": [{"id": "m"}]}).encode()
                    # connection: close, so that the router's client never reuses this connection for the
                    # stream (a pooled connection the fake has closed fails with ReadError, now and then)
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                                 b"content-length: "
                                 + str(len(body)).encode() + b"\r\n\r\n" + body)
                else:
                    event = f"data: {json.dumps(chunk)}\n\n".encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n"
                                 b"transfer-encoding: chunked\r\n\r\n" + f"{len(event):x}\r\n".encode() + event
                                 + b"\r\n")  # ... and the connection closes without the last chunk

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", thread, sock


def test_an_upstream_that_breaks_off_a_stream_gives_an_error_event_naming_the_variant():
    base, thread, sock = broken_upstream()
    log = Log()
    try:
        router = create_router([Upstream("flaky", base)], request_log=log, timeout=WAIT)
        with BackgroundServer(router, wait_ready=False) as url:  # the fake answers two connections only
            with httpx.stream("POST", url + "/v1/completions", json={"prompt": "x", "stream": True},
                              timeout=WAIT) as r:
                events = [line for line in r.iter_lines() if line]
    finally:
        sock.close()
        thread.join(WAIT)
    assert json.loads(events[0][len("data: "):])["choices"][0]["text"] == "half"
    error = json.loads(events[1][len("data: "):])["error"]
    assert "'flaky'" in error["message"] and error["code"] == "upstream_broke"
    assert events[-1] == "data: [DONE]"
    assert log.records()[-1]["error"].startswith("variant 'flaky'")
