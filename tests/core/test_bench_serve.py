"""`llmrs bench serve` (chapter 11): the figures on synthetic timings, the arrival schedule, how a
stream is judged (a stream without a finish_reason is truncated, never a fast success), and runs
against our server on a tiny model and against a fake server that cuts its streams. Servers
listen on 127.0.0.1 on a free port and are always stopped; nothing here asserts a duration.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi import FastAPI  # noqa: E402
from fastapi.responses import JSONResponse, StreamingResponse  # noqa: E402

import llmrs_core as llmrs  # noqa: E402
from llmrs_core.bench import serve as bs  # noqa: E402
from llmrs_core.bench.serve_compare import LLAMA_CPP_INSTALL, OURS, compare, format_table  # noqa: E402
from llmrs_core.cli import main  # noqa: E402
from llmrs_core.server import BackgroundServer, create_app  # noqa: E402
from llmrs_core.testing import write_tiny_llama  # noqa: E402

TIMEOUT = 60.0  # seconds a request may wait for its next byte: a hang fails, it does not block CI


# -- the figures --------------------------------------------------------------------------


def ok(ttft: float, itl: list[float], tokens: int | None = None) -> bs.RequestResult:
    e2e = ttft + sum(itl)
    return bs.RequestResult("ok", ttft=ttft, itl=itl, e2e=e2e, output_tokens=tokens or len(itl) + 1)


def test_tpot_is_time_after_the_first_token_per_later_token():
    r = ok(0.5, [0.1, 0.2, 0.3])  # 4 tokens, 0.6 s after the first
    assert r.tpot == pytest.approx(0.6 / 3)
    assert ok(0.5, []).tpot is None  # one token: no TPOT


def test_summary_counts_outcomes_apart_and_measures_only_successes():
    results = [ok(0.1, [0.01, 0.03]), ok(0.3, [0.02]),
               bs.RequestResult("truncated", output_tokens=5, error="truncated: [DONE] came without a finish_reason"),
               bs.RequestResult("failed", error="HTTP 500: boom")]
    s = bs.summarise(results, duration=2.0)
    assert (s["requests"], s["completed"], s["truncated"], s["failed"]) == (4, 2, 1, 1)
    assert s["output_tokens"] == 5  # 3 + 2: the truncated answer's 5 tokens do not count
    assert s["output_tokens_per_s"] == pytest.approx(2.5) and s["requests_per_s"] == pytest.approx(1.0)
    assert s["ttft_s"]["mean"] == pytest.approx(0.2) and s["ttft_s"]["p50"] == pytest.approx(0.2)
    assert s["ttft_s"]["p99"] == pytest.approx(np.percentile([0.1, 0.3], 99))
    assert s["itl_s"]["p50"] == pytest.approx(0.02)  # gaps of every success pooled: 0.01, 0.03, 0.02
    assert s["tpot_s"]["mean"] == pytest.approx((0.02 + 0.02) / 2)
    assert s["e2e_s"]["mean"] == pytest.approx((0.14 + 0.32) / 2)
    assert s["errors"] == ["truncated: [DONE] came without a finish_reason", "HTTP 500: boom"]


def test_goodput_counts_the_successes_that_meet_every_slo():
    slos = bs.parse_goodput("ttft:200,tpot:25")
    assert slos == {"ttft": pytest.approx(0.2), "tpot": pytest.approx(0.025)}
    fast, slow_first, slow_tokens = ok(0.1, [0.02, 0.02]), ok(0.3, [0.01]), ok(0.1, [0.05, 0.05])
    truncated = bs.RequestResult("truncated", ttft=0.01, e2e=0.02, output_tokens=3)
    assert [bs.meets(r, slos) for r in (fast, slow_first, slow_tokens, truncated)] == [True, False, False, False]
    s = bs.summarise([fast, slow_first, slow_tokens, truncated], duration=4.0, slos=slos)
    assert s["goodput"]["good_requests"] == 1 and s["goodput"]["requests_per_s"] == pytest.approx(0.25)
    assert "goodput" not in bs.summarise([fast], duration=1.0)


@pytest.mark.parametrize("spec", ["ttft", "ttft:abc", "ttft:-5", "latency:100", "ttft:0"])
def test_bad_goodput_specs_are_named(spec):
    with pytest.raises(ValueError, match="--goodput takes NAME:MILLISECONDS"):
        bs.parse_goodput(spec)


def test_no_successes_give_zeros_not_errors():
    s = bs.summarise([bs.RequestResult("failed", error="x")], duration=1.0)
    assert s["completed"] == 0 and s["ttft_s"] == {"mean": 0.0, "p50": 0.0, "p99": 0.0}


# -- judging a stream ------------------------------------------------------------------------


def feed(lines: list[tuple[str, float]], end: float) -> bs.RequestResult:
    parser = bs.StreamParser(start=10.0)
    for line, at in lines:
        parser.feed(line, at)
    return parser.result(end)


def chunk(text: str, finish: str | None = None) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "text": text, "finish_reason": finish}]})


def test_a_whole_stream_gives_ttft_itl_e2e_and_usage_tokens():
    usage = "data: " + json.dumps({"choices": [], "usage": {"completion_tokens": 4}})
    r = feed([(chunk(""), 10.05), (chunk("a"), 10.2), ("", 10.2), (chunk("b"), 10.25), (chunk("cd"), 10.4),
              (chunk("", "length"), 10.4), (usage, 10.41), ("data: [DONE]", 10.41)], end=10.5)
    assert r.outcome == "ok"
    assert r.ttft == pytest.approx(0.2)  # the first chunk *with text*, not the empty one
    assert r.itl == pytest.approx([0.05, 0.15])
    assert r.e2e == pytest.approx(0.5) and r.output_tokens == 4  # usage wins over the 3 chunks
    assert r.tpot == pytest.approx(0.3 / 3)


def test_chat_deltas_count_too_and_chunks_count_tokens_without_usage():
    lines = [("data: " + json.dumps({"choices": [{"delta": {"content": t}, "finish_reason": f}]}), 1.0 + i)
             for i, (t, f) in enumerate([("x", None), ("y", None), ("", "stop")])]
    r = bs.StreamParser(0.0)
    for line, at in lines:
        r.feed(line, at)
    result = r.result(5.0)
    assert result.outcome == "ok" and result.output_tokens == 2 and result.ttft == 1.0


def test_a_stream_without_finish_reason_is_truncated_even_with_done():
    r = feed([(chunk("fast"), 10.01), ("data: [DONE]", 10.02)], end=10.02)
    assert r.outcome == "truncated" and "[DONE] came without a finish_reason" in r.error
    r = feed([(chunk("fast"), 10.01)], end=10.02)  # the connection simply closed
    assert r.outcome == "truncated" and "the stream ended without a finish_reason" in r.error


def test_error_events_and_empty_answers_fail():
    error = "data: " + json.dumps({"error": {"message": "engine died", "type": "server_error"}})
    assert feed([(chunk("a"), 10.1), (error, 10.2), ("data: [DONE]", 10.2)], 10.3).error == "engine died"
    assert feed([("data: {not json", 10.1)], 10.2).outcome == "failed"
    empty = feed([(chunk("", "stop"), 10.1), ("data: [DONE]", 10.1)], 10.2)
    assert empty.outcome == "failed" and "no text" in empty.error


# -- the arrival schedule ---------------------------------------------------------------------


@pytest.mark.parametrize("burstiness", [1.0, 0.3, 4.0])
def test_arrivals_end_at_n_over_rate_and_repeat_with_the_seed(burstiness):
    n, rate = 50, 8.0
    times = bs.arrival_times(n, rate, burstiness, np.random.default_rng(3))
    assert times[-1] == pytest.approx(n / rate)
    assert np.all(np.diff(times) >= 0) and times[0] > 0
    again = bs.arrival_times(n, rate, burstiness, np.random.default_rng(3))
    other = bs.arrival_times(n, rate, burstiness, np.random.default_rng(4))
    assert np.array_equal(times, again) and not np.array_equal(times, other)


def test_burstier_arrivals_have_more_spread_gaps():
    rng = np.random.default_rng(0)
    cv = {b: np.std(g := np.diff(bs.arrival_times(4000, 10.0, b, rng))) / np.mean(g) for b in (0.25, 1.0, 4.0)}
    assert cv[0.25] > cv[1.0] > cv[4.0]  # a gamma's coefficient of variation is 1/sqrt(shape): 2, 1, 0.5
    assert cv[1.0] == pytest.approx(1.0, rel=0.1)


def test_an_infinite_rate_sends_everything_at_once_and_bad_loads_are_named():
    assert np.array_equal(bs.arrival_times(5, math.inf), np.zeros(5))
    with pytest.raises(ValueError, match="request rate"):
        bs.Load(request_rate=0)
    with pytest.raises(ValueError, match="burstiness"):
        bs.Load(request_rate=1, burstiness=0)
    with pytest.raises(ValueError, match="concurrency"):
        bs.Load(max_concurrency=0)


def test_workloads_differ_per_level_and_repeat_with_the_seed(tiny):
    tok = tiny[1].tokenizer
    a, b = bs.random_workload(tok, 3, 12, 4, seed=[0, 1]), bs.random_workload(tok, 3, 12, 4, seed=[0, 1])
    assert a == b and a != bs.random_workload(tok, 3, 12, 4, seed=[0, 2])
    assert all(len(tok.encode(p, allow_special=False)) <= 14 for p in a.prompts)
    shipped = bs.prompt_set_workload(50, 8, tag="0.1")
    assert len(set(shipped.prompts)) == 50 and shipped.prompts[0].startswith("[0.1.0] ")
    assert bs.request_body("m", "p", 8, "min_tokens")["min_tokens"] == 8
    assert "ignore_eos" not in bs.request_body("m", "p", 8, "none")


# -- against servers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench_serve") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5)
    return path, llmrs.load(path, backend="numpy")


@pytest.fixture(scope="module")
def ours(tiny):
    app = create_app(tiny[1], served_model_name="tiny", warm_up=False, max_num_seqs=4, num_blocks=64)
    with BackgroundServer(app) as url:
        yield url


def test_a_run_against_our_server(tiny, ours):
    tok = tiny[1].tokenizer
    loads = [bs.Load(max_concurrency=1), bs.Load(max_concurrency=3), bs.Load(request_rate=50.0, burstiness=0.5)]
    heard = []
    result = bs.benchmark(ours + "/v1/", loads, lambda i: bs.random_workload(tok, 4, 8, 5, seed=[0, i + 1]),
                          slos={"ttft": 60.0}, timeout=TIMEOUT, on_level=heard.append)
    assert result["model"] == "tiny" and result["base_url"] == ours and len(heard) == 3
    for run in result["runs"]:
        assert (run["completed"], run["failed"], run["truncated"]) == (4, 0, 0), run["errors"]
        assert run["output_tokens"] == 4 * 5  # ignore_eos: every token asked for, counted from usage
        assert run["ttft_s"]["p50"] > 0 and run["itl_s"]["p50"] > 0 and run["tpot_s"]["mean"] > 0
        assert run["e2e_s"]["p99"] >= run["ttft_s"]["p99"] > 0
        assert run["goodput"]["good_requests"] == 4
    assert [r["label"] for r in result["runs"]] == ["1 client", "3 clients", "50 req/s, burstiness 0.5"]
    assert "tok/s" in format_table({"ours": result})


def truncating_app() -> FastAPI:
    """A fake OpenAI server whose streams end like llama-cpp-python's interrupted ones: text,
    then ``[DONE]`` with no finish_reason, HTTP 200; a prompt with "500" gets an error answer."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

    @app.post("/v1/completions")
    async def completions(body: dict):
        if "500" in body["prompt"]:
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)

        async def events():
            finish = "length" if body["prompt"].startswith("[warm") else None  # the warm-up must pass
            yield "data: " + json.dumps({"choices": [{"index": 0, "text": "hi", "finish_reason": None}]}) + "\n\n"
            if finish:
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": "", "finish_reason": finish}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_truncated_streams_are_reported_and_never_counted_as_fast():
    def workloads(i: int) -> bs.Workload:
        if i < 0:
            return bs.Workload(("[warm] go",), 4)
        return bs.Workload(("a", "b", "c", "code 500"), 4)

    with BackgroundServer(truncating_app()) as url:
        result = bs.benchmark(url, [bs.Load(max_concurrency=2)], workloads, slos={"ttft": 1e3}, timeout=TIMEOUT)
    run = result["runs"][0]
    assert (run["completed"], run["truncated"], run["failed"]) == (0, 3, 1)
    assert run["output_tokens_per_s"] == 0 and run["requests_per_s"] == 0 and run["goodput"]["good_requests"] == 0
    assert run["ttft_s"]["p50"] == 0.0  # no latency from answers that were cut
    assert any("without a finish_reason" in e for e in run["errors"]) and "HTTP 500: boom" in run["errors"]


def test_a_warm_up_that_fails_is_an_error_naming_it():
    with BackgroundServer(truncating_app()) as url, pytest.raises(ValueError, match="warm-up.*finish_reason"):
        bs.benchmark(url, [bs.Load(max_concurrency=1)], lambda i: bs.Workload(("cut",), 2), timeout=TIMEOUT)


def test_compare_starts_our_server_and_says_how_to_get_llama_cpp(tiny):
    result = compare(tiny[0], [bs.Load(max_concurrency=2)], lambda i: bs.prompt_set_workload(2, 3, f"t{i}"),
                     threads=None, backend="numpy", with_llama_cpp=False, start_timeout=120, timeout=TIMEOUT)
    run = result["servers"][OURS]["runs"][0]
    assert (run["completed"], run["failed"], run["truncated"]) == (2, 0, 0), run["errors"]
    assert "--host" in result["servers"][OURS]["command"] and "127.0.0.1" in result["servers"][OURS]["command"]
    assert result["notes"] == ["llama-cpp-python: not asked for"]
    assert "pip install 'llama-cpp-python[server]'" in LLAMA_CPP_INSTALL


# -- the command line ---------------------------------------------------------------------------


def test_cli_writes_json_and_plot(tiny, ours, tmp_path, capsys):
    out, plot = tmp_path / "serve.json", tmp_path / "serve.png"
    code = main(["bench", "serve", "--base-url", ours, "--model", str(tiny[0]), "--num-prompts", "3",
                 "--input-len", "8", "--output-len", "3", "--max-concurrency", "1,2", "--goodput", "ttft:60000",
                 "--output", str(out), "--plot", str(plot)])
    assert code == 0
    text = capsys.readouterr().out
    assert "1 client" in text and "2 clients" in text and "TTFT p50" in text
    result = json.loads(out.read_text())
    runs = result["servers"][ours]["runs"]
    assert [r["completed"] for r in runs] == [3, 3] and result["workload"]["num_prompts"] == 3
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["--compare", "--base-url", "http://127.0.0.1:1"], "leave out --base-url"),
    (["--max-concurrency", "1", "--request-rate", "2"], "not both"),
    (["--burstiness", "0.5"], "give --request-rate too"),
    (["--max-concurrency", "0,4"], "--max-concurrency takes positive whole numbers"),
    (["--request-rate", "fast"], "--request-rate takes positive numbers"),
    (["--num-prompts", "0"], "--num-prompts"),
    (["--goodput", "ttft"], "--goodput takes"),
    (["--base-url", "127.0.0.1:8000"], "must start with http://"),
])
def test_cli_errors_are_one_line(argv, message, capsys, tiny):
    assert main(["bench", "serve", "--model", str(tiny[0]), "--dataset", "prompts", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and err.startswith("llmrs bench: error:")


def test_cli_says_when_nothing_listens(capsys, tiny):
    from llmrs_core.bench.serve_compare import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", "serve", "--base-url", url, "--dataset", "prompts", "--num-prompts", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert f"no OpenAI-compatible server at {url}" in err and len(err.splitlines()) == 1
