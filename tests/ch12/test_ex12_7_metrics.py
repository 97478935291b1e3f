"""Exercise 12.7 — Setting Up Prometheus Metrics: one finished request into vLLM's series, and a histogram's
cumulative ``le`` buckets.

``record_finished_request`` is checked on timings worked by hand (multiples of 1/4 s, exact in binary),
through real ``prometheus_client`` metrics and their text exposition parsed by ``prometheus_client``'s own
parser; then inside the real server (``ServerMetrics.record_at_finish``) after a known load through the
``openai`` client on a tiny model: the scrape agrees exactly with the responses' usage. ``le_buckets`` is
checked against the buckets ``prometheus_client.Histogram`` itself exposes for the same values.
"""

from __future__ import annotations

import time

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client import CollectorRegistry, Histogram, generate_latest  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from llmrs_core.engine.engine import RequestMetrics  # noqa: E402
from llmrs_core.server.metrics import ITL_BUCKETS, TTFT_BUCKETS, ServerMetrics  # noqa: E402

WAIT = 30.0


def parse(text: str) -> dict[str, float]:
    """An exposition parsed by prometheus_client's parser: sample name (+ ``{le=...}``) -> value."""
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.name + (f"{{le={s.labels['le']}}}" if "le" in s.labels else "")
            samples[key] = samples.get(key, 0.0) + s.value  # summed over model_name / finished_reason
    return samples


def record(ex, *requests) -> dict[str, float]:
    """Each ``(timing, prompt_tokens, output_ids)`` through the learner's function into a fresh server's metrics."""
    metrics = ServerMetrics("tiny", 2048)
    for timing, prompt_tokens, output_ids in requests:
        ex.record_finished_request(metrics.request_metric_set(), timing, prompt_tokens, output_ids)
    return parse(metrics.render().decode())


def stopped_by_end_of_turn() -> tuple[RequestMetrics, int, tuple[int, ...]]:
    """Queued 0.5 s, prefill 0.5 s, then 5 sampled tokens: 4 returned, the 5th an end-of-turn token."""
    timing = RequestMetrics(arrival_time=100.0, scheduled_time=100.5, first_token_time=101.0,
                            token_times=[101.0, 101.25, 101.75, 102.0, 102.5], finished_time=102.5)
    return timing, 7, (11, 12, 13, 14)


def stopped_at_max_tokens() -> tuple[RequestMetrics, int, tuple[int, ...]]:
    """3 sampled tokens, all returned (finish_reason "length")."""
    timing = RequestMetrics(arrival_time=200.0, scheduled_time=200.0, first_token_time=200.25,
                            token_times=[200.25, 200.5, 201.0], finished_time=201.0)
    return timing, 3, (5, 6, 7)


# -- record_finished_request on timings worked by hand -------------------------------------------


def test_ex12_7_times_are_seconds(ex):
    m = record(ex, stopped_by_end_of_turn())
    got = m["llmrs:time_to_first_token_seconds_sum"]
    assert got != pytest.approx(1000.0), (
        "TTFT was recorded in milliseconds (1000 for 1 s): Prometheus's *_seconds metrics take seconds, "
        "and the buckets (0.001 ... 2560) are seconds")
    assert got == 1.0, f"TTFT = first token - arrival = 101.0 - 100.0 = 1.0 s; the histogram's sum is {got}"
    assert m["llmrs:time_to_first_token_seconds_count"] == 1, "observe TTFT once per request"
    for name, want, how in (("e2e_request_latency", 2.5, "finished - arrival = 102.5 - 100.0"),
                            ("request_queue_time", 0.5, "scheduled - arrival = 100.5 - 100.0"),
                            ("request_prefill_time", 0.5, "first token - scheduled = 101.0 - 100.5"),
                            ("request_decode_time", 1.5, "last token - first token = 102.5 - 101.0")):
        got = m[f"llmrs:{name}_seconds_sum"]
        assert got != pytest.approx(1000 * want), f"{name} was recorded in milliseconds ({got}); use seconds"
        assert (got, m[f"llmrs:{name}_seconds_count"]) == (want, 1), (
            f"{name} should be {how} = {want} s, observed once; got sum {got}, "
            f"count {m[f'llmrs:{name}_seconds_count']}")


def test_ex12_7_an_end_of_turn_token_is_not_counted(ex):
    m = record(ex, stopped_by_end_of_turn())
    got = m["llmrs:generation_tokens_total"]
    assert got != 5, (
        "generation_tokens_total counted the end-of-turn token: timing.token_times has one entry per sampled "
        "token, the end-of-turn token included, but the client got 4 tokens (len(output_token_ids)); the "
        "counter must agree with the usage's completion_tokens")
    assert got == 4, f"generation_tokens_total should grow by len(output_token_ids) = 4, not {got}"
    assert m["llmrs:request_generation_tokens_sum"] == 4, (
        f"request_generation_tokens observes the 4 returned tokens; its sum is "
        f"{m['llmrs:request_generation_tokens_sum']}")
    assert (m["llmrs:prompt_tokens_total"], m["llmrs:request_prompt_tokens_sum"],
            m["llmrs:request_prompt_tokens_count"]) == (7, 7, 1), "the 7 prompt tokens: the counter and one observation"


def test_ex12_7_one_gap_per_pair_of_consecutive_tokens(ex):
    m = record(ex, stopped_by_end_of_turn())
    count, total = m["llmrs:inter_token_latency_seconds_count"], m["llmrs:inter_token_latency_seconds_sum"]
    assert count != 1, "observe every gap between consecutive tokens (timing.itl), not their mean or their total"
    assert count == 4, (
        f"5 sampled tokens have 4 gaps between them (0.25, 0.5, 0.25, 0.5 s); you observed {count:g} (TTFT is "
        "not a gap, and the gap to the end-of-turn token is one: the model spent that time)")
    assert total == 1.5, f"the 4 gaps sum to 102.5 - 101.0 = 1.5 s; yours sum to {total}"
    assert (m["llmrs:inter_token_latency_seconds_bucket{le=0.3}"],
            m["llmrs:inter_token_latency_seconds_bucket{le=0.5}"]) == (2, 4), (
        "vLLM's ITL buckets: the two 0.25 s gaps are <= 0.3, all four are <= 0.5 (le: 'less than or equal')")


def test_ex12_7_each_call_records_only_its_own_request(ex):
    m = record(ex, stopped_by_end_of_turn(), stopped_at_max_tokens())
    assert m["llmrs:time_to_first_token_seconds_count"] == 2, (
        f"two requests, two TTFT observations; you made {m['llmrs:time_to_first_token_seconds_count']} (observing "
        "TTFT once per token, or again for requests recorded before, counts them twice)")
    assert m["llmrs:time_to_first_token_seconds_sum"] == 1.0 + 0.25
    assert m["llmrs:inter_token_latency_seconds_count"] == 4 + 2, (
        "the second request adds its own 2 gaps and nothing else: keep no state between calls")
    assert m["llmrs:generation_tokens_total"] == 4 + 3 and m["llmrs:prompt_tokens_total"] == 7 + 3
    assert m["llmrs:e2e_request_latency_seconds_sum"] == 2.5 + 1.0


# -- inside the server, through the openai client -------------------------------------------------


def test_ex12_7_the_servers_scrape_agrees_with_the_usage(ex, tmp_path):
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    import httpx

    import llmrs_core as llmrs
    from llmrs_core.server import BackgroundServer, create_app
    from llmrs_core.testing import write_tiny_llama

    record(ex, stopped_by_end_of_turn())  # a stub or a crash shows here, not inside the server
    write_tiny_llama(tmp_path / "tiny.gguf", byte_tokenizer=True, seed=7)
    app = create_app(llmrs.load(tmp_path / "tiny.gguf", backend="numpy"), served_model_name="tiny",
                     warm_up=False)
    errors: list = []

    def recorder(metrics, timing, prompt_tokens, output_token_ids):
        """The learner's function, noting what it raised (the server's engine loop would stop)."""
        try:
            ex.record_finished_request(metrics, timing, prompt_tokens, output_token_ids)
        except Exception as e:
            errors.append((e, timing, prompt_tokens, len(output_token_ids)))
            raise

    def blame_recorder() -> None:
        for e, timing, prompt_tokens, n in errors[:1]:
            pytest.fail(f"inside the server your record_finished_request (Exercise 12.7) raised {type(e).__name__}: "
                        f"{e}, for a request of {prompt_tokens} prompt tokens and {n} output tokens ({timing}); "
                        "the server runs it in its engine loop, which stopped")

    app.state.metrics.record_at_finish(recorder)

    def load(client, n: int, first: int) -> list[tuple[int, int, str, float]]:
        """n requests one after another: (prompt_tokens, completion_tokens, finish_reason, client seconds)."""
        out = []
        for i in range(first, first + n):
            start = time.perf_counter()
            if i % 2:
                r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": f"q{i}"}],
                                                   max_tokens=4 + i, temperature=0)
            else:
                r = client.completions.create(model="tiny", prompt=f"story {i}", max_tokens=6, temperature=0,
                                              extra_body={"ignore_eos": True})
            out.append((r.usage.prompt_tokens, r.usage.completion_tokens, r.choices[0].finish_reason,
                        time.perf_counter() - start))
        return out

    def scrape(url: str, n: int) -> dict[str, float]:
        deadline = time.monotonic() + WAIT
        while True:  # the loop observes a request just after its last output: wait for the n-th finish
            m = parse(httpx.get(url + "/metrics", timeout=WAIT).text)
            if m.get("llmrs:request_success_total", 0) >= n or time.monotonic() > deadline:
                return m
            time.sleep(0.01)

    with BackgroundServer(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
        try:
            first = load(client, 4, 0)
            m1 = scrape(url, 4)
            second = load(client, 3, 4)
            m2 = scrape(url, 7)
        except openai.OpenAIError:
            blame_recorder()
            raise
    blame_recorder()

    for m, runs, what in ((m1, first, "after the first load"), (m2, first + second, "after the second load")):
        n = len(runs)
        completion = sum(c for _, c, _, _ in runs)
        assert m["llmrs:generation_tokens_total"] == completion, (
            f"{what}: generation_tokens_total is {m['llmrs:generation_tokens_total']}, the responses' "
            f"completion_tokens sum to {completion}")
        assert m["llmrs:prompt_tokens_total"] == sum(p for p, _, _, _ in runs), f"{what}: prompt tokens differ"
        assert m["llmrs:request_generation_tokens_sum"] == completion, f"{what}: request_generation_tokens' sum"
        for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_prompt_tokens"):
            assert m[f"llmrs:{name}_count"] == n, (
                f"{what}: {name} has {m[f'llmrs:{name}_count']} observations for {n} requests (re-observing "
                "requests recorded before?)")
        sampled = sum(c + (r == "stop") for _, c, r, _ in runs)  # a stop by end-of-turn sampled one more token
        assert m["llmrs:inter_token_latency_seconds_count"] == sampled - n, f"{what}: one gap per consecutive pair"
        # the server's interval of each request lies inside the client's: its e2e times cannot add up to more
        assert m["llmrs:e2e_request_latency_seconds_sum"] <= sum(s for _, _, _, s in runs), (
            f"{what}: the e2e times sum to more than the client waited in all: milliseconds instead of seconds?")
        assert m["llmrs:time_to_first_token_seconds_sum"] <= m["llmrs:e2e_request_latency_seconds_sum"]


# -- le_buckets against prometheus_client's own buckets -----------------------------------------


def reference_buckets(bounds, values) -> list[tuple[float, int]]:
    """The ``_bucket`` samples prometheus_client's Histogram exposes for ``values``."""
    registry = CollectorRegistry()
    h = Histogram("ref_seconds", "reference", buckets=bounds, registry=registry)
    for v in values:
        h.observe(v)
    family = next(text_string_to_metric_families(generate_latest(registry).decode()))
    return [(float(s.labels["le"]), int(s.value)) for s in family.samples if s.name == "ref_seconds_bucket"]


VALUES = [0.3, 0.001, 7.0, 0.0049, 0.3, 3000.0, 0.005, 0.02]  # unsorted; on bounds and between; above all


def test_ex12_7_le_buckets_match_prometheus_client(ex):
    want = reference_buckets(TTFT_BUCKETS, VALUES)
    got = ex.le_buckets(TTFT_BUCKETS, VALUES)
    got = [(float(le), int(c)) for le, c in got]
    assert got[-1:] and got[-1][0] == float("inf"), (
        "the last bucket is le=+Inf and counts every value (Prometheus requires it: it is the histogram's _count)")
    assert len(got) == len(want), f"one bucket per bound plus +Inf: {len(want)}; you gave {len(got)}"
    assert [le for le, _ in got] == [le for le, _ in want], "the buckets' le values are the bounds, in order"
    counts, ref = [c for _, c in got], [c for _, c in want]
    per_bucket = [b - a for a, b in zip([0, *ref], ref)]
    assert counts != per_bucket, (
        "your counts are per bucket; Prometheus's are cumulative: each le bucket counts every value <= le, "
        f"so the counts never decrease and the +Inf one is {len(VALUES)}")
    strict = [sum(v < le for v in VALUES) for le, _ in want]
    assert counts != strict or counts == ref, (
        "a value equal to a bound belongs to that bucket: le means 'less than or equal' (0.001 is in le=0.001, 0.005 "
        "in le=0.005)")
    assert counts == ref, f"prometheus_client's buckets for these values are {want}; yours {got}"


def test_ex12_7_le_buckets_of_nothing_and_of_itl(ex):
    assert [c for _, c in ex.le_buckets(ITL_BUCKETS, [])] == [0] * (len(ITL_BUCKETS) + 1), (
        "no values: every bucket, +Inf included, counts 0")
    gaps = [0.01, 0.25, 0.5, 0.25, 79.0, 80.0, 81.0]
    assert [(float(le), int(c)) for le, c in ex.le_buckets(ITL_BUCKETS, gaps)] == reference_buckets(ITL_BUCKETS, gaps)
