"""Chapter 12's tests name each known mistake: proven by planting it.

As for chapter 10 (test_diagnose_ch10.py): each mistake is planted in a copy of the
solution — the engine function behind it recompiled from its source with one edit
(:func:`llmrs_core.testing.plant`), or a few lines written the wrong way here — and the
chapter 12 test named after the mistake must fail with its own message.
"""

from __future__ import annotations

import textwrap

import pytest

from llmrs_core.ab import assign as ab_assign
from llmrs_core.bench import stats as ab_stats
from llmrs_core.ops import entrypoint
from llmrs_core.server import metrics as server_metrics
from llmrs_core.testing import chapter_tests, plant, solution_with, write_tiny_llama
from llmrs_core.testing import failure_message as failure

pytest.importorskip("prometheus_client")
pytest.importorskip("scipy")

T126 = chapter_tests(12, "test_ex12_6_entrypoint.py")
T127 = chapter_tests(12, "test_ex12_7_metrics.py")
T128 = chapter_tests(12, "test_ex12_8_ab_testing.py")
SOLUTION = solution_with(12)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("diagnose12") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True)
    return path


# -- 12.6: the entrypoint's environment check ---------------------------------------------


def checker(*edits, **globals_):
    return {"check_serve_environment": plant(entrypoint.check_serve_environment, *edits, **globals_)}


NOT_READ = plant(entrypoint._model_problem, ("if head != GGUF_MAGIC:", "if False:"))

ENTRYPOINT_MISTAKES = {
    "stops at the first problem": (
        checker(("problems.append(p)", "raise ServeEnvironmentError([p])")),
        T126.test_ex12_6_every_problem_is_reported_at_once, ("tmp",), "check every variable before raising",
    ),
    "port 65535 refused": (
        checker(("1 <= value <= 65535", "1 <= value < 65535")),
        T126.test_ex12_6_the_ends_of_the_port_range_are_allowed, ("gguf", "65535"), "ports go from 1 to 65535 inclusive",
    ),
    "threads compared with this machine's cores": (
        checker(("cores = usable_cores() if cpu_count is None else cpu_count", "cores = usable_cores()")),
        T126.test_ex12_6_threads_may_not_exceed_the_cores, ("gguf",), "with the cpu_count argument (when given)",
    ),
    "an empty LLMRS_THREADS refused": (
        checker(('if env.get("LLMRS_THREADS", "").strip():', 'if "LLMRS_THREADS" in env:')),
        T126.test_ex12_6_unset_variables_take_the_defaults, ("gguf",), "an empty LLMRS_THREADS",
    ),
    "a port read with float()": (
        checker(_integer=lambda text: int(float(text))),
        T126.test_ex12_6_a_port_outside_1_to_65535_is_refused, ("gguf", "8000.0"),
        "a port is a plain decimal integer from 1 to 65535"),
    "an empty host accepted": (
        checker(("    if not host:", "    if False:")),
        T126.test_ex12_6_an_empty_host_is_refused, ("gguf", ""), "is no address to listen on"),
    "the magic bytes not read": (
        checker(_model_problem=NOT_READ),
        T126.test_ex12_6_a_file_that_is_not_gguf_is_refused, ("tmp",), "must start with GGUF_MAGIC",
    ),
}


@pytest.mark.parametrize("mistake", ENTRYPOINT_MISTAKES)
def test_each_entrypoint_mistake_gets_its_own_message(mistake, gguf, tmp_path):
    planted, test, args, message = ENTRYPOINT_MISTAKES[mistake]
    args = [{"tmp": tmp_path, "gguf": gguf}.get(a, a) for a in args]
    text = failure(test, solution_with(12, **planted), *args)
    assert message in text, text


# -- 12.7: the metrics of a finished request, and le buckets ----------------------------------


def recorder(*edits):
    return {"record_finished_request": plant(server_metrics.record_finished_request, *edits)}


def reobserving():
    """A recorder that keeps every timing it saw and observes them all again at each call."""
    seen = []

    def record_finished_request(metrics, timing, prompt_tokens, output_token_ids):
        seen.append(timing)
        metrics.prompt_tokens.inc(prompt_tokens)
        metrics.generation_tokens.inc(len(output_token_ids))
        for t in seen:
            metrics.time_to_first_token.observe(t.ttft)
            for gap in t.itl:
                metrics.inter_token_latency.observe(gap)
        for name in ("e2e", "queue_time", "prefill_time", "decode_time"):
            getattr(metrics, "e2e_request_latency" if name == "e2e" else f"request_{name}").observe(getattr(timing, name))
        metrics.request_prompt_tokens.observe(prompt_tokens)
        metrics.request_generation_tokens.observe(len(output_token_ids))

    return {"record_finished_request": record_finished_request}


ITL_LOOP = """for gap in timing.itl:  # one per pair of consecutive sampled tokens
        metrics.inter_token_latency.observe(gap)"""

RECORDER_MISTAKES = {
    "TTFT in milliseconds": (
        recorder(("observe(timing.ttft)", "observe(timing.ttft * 1000)")),
        T127.test_ex12_7_times_are_seconds, "TTFT was recorded in milliseconds",
    ),
    "the end-of-turn token counted": (
        recorder(("generation_tokens.inc(len(output_token_ids))", "generation_tokens.inc(len(timing.token_times))")),
        T127.test_ex12_7_an_end_of_turn_token_is_not_counted, "counted the end-of-turn token",
    ),
    "the mean gap observed": (
        recorder((ITL_LOOP, "metrics.inter_token_latency.observe(sum(timing.itl) / len(timing.itl))")),
        T127.test_ex12_7_one_gap_per_pair_of_consecutive_tokens, "not their mean or their total",
    ),
    "TTFT observed as a gap": (
        recorder(("for gap in timing.itl:", "for gap in [timing.ttft, *timing.itl]:")),
        T127.test_ex12_7_one_gap_per_pair_of_consecutive_tokens, "you observed 5 (TTFT is not a gap",
    ),
    "earlier requests observed again": (
        reobserving(), T127.test_ex12_7_each_call_records_only_its_own_request, "again for requests recorded before",
    ),
}


@pytest.mark.parametrize("mistake", RECORDER_MISTAKES)
def test_each_recorder_mistake_gets_its_own_message(mistake):
    planted, test, message = RECORDER_MISTAKES[mistake]
    text = failure(test, solution_with(12, **planted))
    assert message in text, text


def per_bucket(bounds, values):
    return [(le, sum(lo < v <= le for v in values)) for lo, le in zip([float("-inf"), *bounds], [*bounds, float("inf")])]


BUCKET_MISTAKES = {
    "counts per bucket, not cumulative": (per_bucket, "your counts are per bucket"),
    "< instead of <=": (lambda bounds, values: [(le, sum(v < le for v in values)) for le in [*bounds, float("inf")]],
                        "le means 'less than or equal'"),
    "no +Inf bucket": (lambda bounds, values: [(le, sum(v <= le for v in values)) for le in bounds],
                       "the last bucket is le=+Inf"),
}


@pytest.mark.parametrize("mistake", BUCKET_MISTAKES)
def test_each_le_buckets_mistake_gets_its_own_message(mistake):
    wrong, message = BUCKET_MISTAKES[mistake]
    text = failure(T127.test_ex12_7_le_buckets_match_prometheus_client, solution_with(12, le_buckets=wrong))
    assert message in text, text


def test_the_learner_style_functions_pass():
    """The recorder and buckets the mistakes are written in are right without them."""
    right = solution_with(12, le_buckets=lambda bounds, values: [(le, sum(v <= le for v in values))
                                                                 for le in [*bounds, float("inf")]])
    T127.test_ex12_7_le_buckets_match_prometheus_client(right)
    T127.test_ex12_7_times_are_seconds(solution_with(12, **reobserving()))


# -- 12.8: assignment and statistics --------------------------------------------------------


def assigner(**globals_):
    return {"assign_variant": plant(SOLUTION.assign_variant, _assign=plant(ab_assign.assign, **globals_))}


def with_python_hash(tmp_path):
    """A learner's module whose assign_variant hashes with Python's hash(), salted per process."""
    path = tmp_path / "hash_exercises.py"
    path.write_text(textwrap.dedent('''
        def assign_variant(user, weights, salt=""):
            u = (hash(salt + user) % 2**32) / 2**32
            edge, total = 0.0, sum(weights.values())
            for name, w in weights.items():
                edge += w / total
                if u < edge:
                    return name
            return name
    '''))
    import importlib.util

    spec = importlib.util.spec_from_file_location("hash_exercises", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def uniform_pick(u, weights):
    names = list(weights)
    return names[int(u * len(names))]


def u_of(*edits, **globals_):
    planted = plant(ab_stats.mann_whitney_u, *edits, **globals_)
    return {"mann_whitney_u": plant(SOLUTION.mann_whitney_u, _mann_whitney_u=planted)}


def ordinal_ranks(values):
    """Ranks 1..n by order, ties broken by position (no midranks)."""
    import numpy as np

    ranks = np.empty(values.size)
    ranks[np.argsort(values, kind="mergesort")] = np.arange(1, values.size + 1)
    return ranks, np.ones(values.size, dtype=np.int64)


def ci_of(*edits):
    return {"bootstrap_diff_ci": plant(SOLUTION.bootstrap_diff_ci,
                                       _bootstrap_diff_ci=plant(ab_stats.bootstrap_diff_ci, *edits))}


AB_MISTAKES = {
    "Python's hash()": (None, T128.test_ex12_8_the_assignment_is_the_same_in_another_process, (),
                        "Python's hash() of a str is salted per process"),
    "the salt ignored": (assigner(user_bucket=lambda user, salt="": ab_assign.user_bucket(user)),
                         T128.test_ex12_8_another_salt_splits_the_users_anew, (), "Put the salt into what you hash"),
    "the weights ignored": (assigner(pick=uniform_pick), T128.test_ex12_8_each_variant_gets_its_share_of_the_users,
                            ({"a": 1.0, "b": 3.0},), "its share 0.25 makes about 1000"),
    "a weight of 0 chosen": (assigner(pick=uniform_pick), T128.test_ex12_8_a_weight_of_zero_is_never_chosen, (),
                             "variants with weight 0 must never be chosen"),
    "bad weights not checked": (assigner(check_weights=dict), T128.test_ex12_8_bad_weights_raise_value_error,
                                ({"a": 0.0, "b": 0.0},), "raise ValueError saying what is wrong with the weights"),
    "U of the other sample": (u_of(("u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2)",
                                    "u1 = float(ranks[n1:].sum() - n2 * (n2 + 1) / 2)")),
                              T128.test_ex12_8_mann_whitney_u_matches_scipy, ("two normals, shifted",),
                              "is the other sample's U"),
    "ties not given their mean rank": (u_of(midranks=ordinal_ranks), T128.test_ex12_8_mann_whitney_u_matches_scipy,
                                       ("many ties (integers)",), "tied values share the mean of their ranks"),
    "no tie correction": (u_of(("((n + 1) - tie_term / (n * (n - 1)))", "(n + 1)")),
                          T128.test_ex12_8_mann_whitney_u_matches_scipy, ("many ties (integers)",),
                          "no tie correction"),
    "no continuity correction": (u_of(("- mu - 0.5)", "- mu)")), T128.test_ex12_8_mann_whitney_u_matches_scipy,
                                 ("skewed latencies",), "no continuity correction"),
    "a one-sided p": (u_of(("2 * (1 - _N.cdf(z))", "(1 - _N.cdf(z))")), T128.test_ex12_8_mann_whitney_u_matches_scipy,
                      ("skewed latencies",), "a one-sided p"),
    "A minus B": (ci_of(("diffs = sb - sa", "diffs = sa - sb")),
                  T128.test_ex12_8_bootstrap_ci_matches_scipy, ("two normals",), "is of mean(a) - mean(b)"),
    "the seed not used": (ci_of(("rng = np.random.default_rng(seed)", "rng = np.random.default_rng()")),
                          T128.test_ex12_8_bootstrap_ci_is_reproducible_and_narrows_with_confidence, (),
                          "the same seed must give the same interval"),
    "the quantiles of a one-sided tail": (ci_of(("tail = (1 - confidence) / 2", "tail = 1 - confidence")),
                                          T128.test_ex12_8_bootstrap_ci_matches_scipy, ("two normals",),
                                          "yours is scipy's 90% interval"),
}


@pytest.mark.parametrize("mistake", AB_MISTAKES)
def test_each_ab_mistake_gets_its_own_message(mistake, tmp_path):
    planted, test, args, message = AB_MISTAKES[mistake]
    ex = with_python_hash(tmp_path) if planted is None else solution_with(12, **planted)
    text = failure(test, ex, *args)
    assert message in text, text


def test_a_recorder_that_raises_inside_the_server_is_named(tmp_path):
    """A recorder right on the worked timings but raising on a real request's (here: any that did not arrive
    at 100.0 or 200.0 s, as the worked ones did) is blamed by name, not seen as the engine loop failing."""

    def record_finished_request(metrics, timing, prompt_tokens, output_token_ids):
        if timing.arrival_time not in (100.0, 200.0):
            raise ValueError("a clock reading I did not expect")
        server_metrics.record_finished_request(metrics, timing, prompt_tokens, output_token_ids)

    text = failure(T127.test_ex12_7_the_servers_scrape_agrees_with_the_usage,
                   solution_with(12, record_finished_request=record_finished_request), tmp_path)
    assert "inside the server your record_finished_request (Exercise 12.7) raised ValueError" in text, text
