"""``llmrs bench all`` and ``llmrs bench compare`` (appendix A): the statistics of a figure, the
environment record, the report, the comparison of two runs, and bad input.

Statistics are checked against what the arithmetic says (the asymptotic width of a median's
interval, ``n = (z cv / precision)^2``) and against scipy; the suite runs on a tiny synthetic model
with the numpy backend. Nothing asserts a duration: the figures' values are whatever this
machine gives; what is checked is their bookkeeping.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from llmrs_core.bench.environment import cpu_model_and_flags, environment, git_state
from llmrs_core.bench.report import compare_results, format_comparison, markdown, read_result, write_outputs
from llmrs_core.bench.stats import (
    NOISY_CV,
    Figure,
    bootstrap_median_ci,
    coefficient_of_variation,
    compare_samples,
    repetitions_for,
)
from llmrs_core.bench.suite import (
    Benchmark,
    Outcome,
    Plan,
    SpeedBench,
    ThroughputBench,
    cpu_busy_share,
    ratio_samples,
    run_all,
)
from llmrs_core.testing import write_tiny_llama

stats = pytest.importorskip("scipy.stats")


# -- the statistics of one figure ----------------------------------------------------------------


def test_the_median_interval_has_the_asymptotic_width_of_a_median():
    # the sample median of n normal draws has standard error sqrt(pi/2) sigma / sqrt(n)
    x = np.random.default_rng(1).normal(10.0, 2.0, 400)
    low, high = bootstrap_median_ci(x)
    expected = 2 * 1.959964 * math.sqrt(math.pi / 2) * 2.0 / math.sqrt(400)
    assert low < np.median(x) < high
    assert 0.7 * expected < high - low < 1.3 * expected, (high - low, expected)


def test_the_interval_is_seeded_and_narrows_with_more_repetitions():
    rng = np.random.default_rng(2)
    few, many = rng.normal(0, 1, 8), rng.normal(0, 1, 200)
    assert bootstrap_median_ci(few) == bootstrap_median_ci(few)
    assert np.subtract(*bootstrap_median_ci(many)[::-1]) < np.subtract(*bootstrap_median_ci(few)[::-1])


def test_coefficient_of_variation_equals_scipy_and_marks_noise():
    x = [10.0, 11.0, 9.5, 10.2, 14.0]
    assert coefficient_of_variation(x) == pytest.approx(stats.variation(x, ddof=1))
    assert Figure.of("k", "t", "tokens/s", x).noisy == (stats.variation(x, ddof=1) > NOISY_CV)
    assert not Figure.of("k", "t", "tokens/s", [5.0, 5.0, 5.0, 5.0, 5.0]).noisy


def test_repetitions_for_a_precision_follow_from_the_variance():
    x = np.random.default_rng(3).normal(100, 10, 50)
    cv = np.std(x, ddof=1) / np.mean(x)
    assert repetitions_for(x, 0.02) == math.ceil((1.959964 * cv / 0.02) ** 2)
    with pytest.raises(ValueError, match="precision must be > 0"):
        repetitions_for(x, 0)


def test_a_figure_round_trips_through_json_and_refuses_bad_samples():
    f = Figure.of("speed.tg128.numba", "numba tg128", "tokens/s", [50.0, 52.0, 49.0, 51.0, 50.5])
    assert Figure.from_json(json.loads(json.dumps(f.to_json()))) == f
    with pytest.raises(ValueError, match="no repetitions"):
        Figure.of("k", "t", "s", [])
    with pytest.raises(ValueError, match="NaN or infinite"):
        Figure.of("k", "t", "s", [1.0, float("nan")])


def test_ratio_samples_pair_rounds_and_refuse_unequal_series():
    assert ratio_samples([2.0, 6.0], [1.0, 3.0]) == [2.0, 2.0]
    with pytest.raises(ValueError, match="differ in length"):
        ratio_samples([1.0], [1.0, 2.0])


# -- comparing two runs ---------------------------------------------------------------------------


def test_a_real_speed_up_is_significant_and_noise_is_not():
    rng = np.random.default_rng(4)
    old = Figure.of("k", "t", "tokens/s", rng.normal(100, 3, 7))
    faster = Figure.of("k", "t", "tokens/s", rng.normal(130, 3, 7))
    same = Figure.of("k", "t", "tokens/s", rng.normal(100, 3, 7))
    up = compare_samples(old, faster)
    assert up.significant and up.better and up.ci_low > 1
    assert up.p_value == pytest.approx(stats.mannwhitneyu(old.samples, faster.samples, method="asymptotic").pvalue)
    assert not compare_samples(old, same).significant
    # a latency that grew is worse, not better
    slow = compare_samples(Figure.of("l", "t", "s", old.samples, False), Figure.of("l", "t", "s", faster.samples, False))
    assert slow.significant and slow.better is False


def _result(samples: dict[str, list[float]]) -> dict:
    return {"figures": [Figure.of(k, k, "tokens/s", v).to_json() for k, v in samples.items()]}


def test_compare_results_matches_figures_by_key_and_names_the_rest():
    old = _result({"a": [1, 1.1, 0.9, 1, 1.05], "gone": [1, 1, 1, 1, 1]})
    new = _result({"a": [2, 2.1, 1.9, 2, 2.05], "added": [1, 1, 1, 1, 1]})
    rows, only = compare_results(old, new)
    assert [r[0].key for r in rows] == ["a"] and rows[0][2].ratio == pytest.approx(2, rel=0.05)
    assert only == ["only in the old run: gone", "only in the new run: added"]
    assert "better" in format_comparison(rows, only)


def test_a_bad_result_file_is_named(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        read_result(bad)
    bad.write_text(json.dumps({"figures": [{"key": "a"}]}))
    with pytest.raises(ValueError, match="figure 0 lacks key, samples or unit"):
        read_result(bad)
    bad.write_text("[]")
    with pytest.raises(ValueError, match="not a bench all result"):
        read_result(bad)
    with pytest.raises(ValueError, match="cannot read"):
        read_result(tmp_path / "missing.json")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmrs_core.cli", "bench", *args], capture_output=True, text=True,
                          timeout=120)


def test_bench_compare_on_the_command_line(tmp_path):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(_result({"speed.tg128.numba": [50, 51, 49, 50, 50.5]})))
    new.write_text(json.dumps(_result({"speed.tg128.numba": [60, 61, 59, 60, 60.5]})))
    done = _cli("compare", str(old), str(new))
    assert done.returncode == 0, done.stderr
    assert "speed.tg128.numba" in done.stdout and "better" in done.stdout
    one = _cli("compare", str(old))
    assert one.returncode != 0 and "two results.json files" in one.stderr
    few = _cli("all", "--repetitions", "3")
    assert few.returncode != 0 and "--repetitions" in few.stderr and "5" in few.stderr


# -- the environment --------------------------------------------------------------------------------


def test_cpu_flags_are_read_from_cpuinfo():
    text = "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_vnni\n"
    model, flags = cpu_model_and_flags(text)
    assert model == "Test CPU 9000"
    assert flags["avx2"] and flags["avx512_vnni"] and not flags["amx_int8"] and not flags["avx_vnni"]


def test_the_environment_records_what_appendix_a_asks(tmp_path):
    env = environment(2, measure=False)
    for key in ("machine", "os", "python", "packages", "numba_threading_layer", "blas", "threads", "git", "time_utc"):
        assert key in env, key
    assert env["packages"]["numpy"] == np.__version__
    assert git_state(tmp_path) == {"commit": None, "dirty": None}


# -- the suite on a tiny model ------------------------------------------------------------------------


class Unavailable(Benchmark):
    name, title = "nothing", "a benchmark whose reference is missing"

    def missing(self) -> str | None:
        return "its reference is not installed here"

    def run(self, model_path, plan, tick) -> Outcome:  # pragma: no cover - never runs
        raise AssertionError("a benchmark that cannot run was run")


TINY_PLAN = Plan("test", 5, 1, pp=16, tg=4, throughput_requests=3, throughput_max_prompt=20, throughput_max_output=17,
                 max_num_seqs=2)


@pytest.fixture(scope="module")
def suite_result(tmp_path_factory):
    path = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5, context_length=1024)  # the prefix workload is ~600 tokens
    benchmarks = {"speed": SpeedBench(("numpy",), compare=False), "throughput": ThroughputBench("numpy"),
                  "nothing": Unavailable()}
    return run_all(path, TINY_PLAN, benchmarks=benchmarks, progress=False, measure_machine=False, say=lambda _: None)


def test_every_figure_has_its_repetitions_and_an_interval_around_its_median(suite_result):
    keys = [f["key"] for f in suite_result["figures"]]
    assert "speed.pp16.numpy" in keys and "speed.tg4.numpy" in keys and "throughput.decode.2/1" in keys
    for f in suite_result["figures"]:
        assert len(f["samples"]) == TINY_PLAN.repetitions, f["key"]
        assert f["ci_low"] <= f["median"] <= f["ci_high"], f["key"]
        assert f["median"] == pytest.approx(float(np.median(f["samples"]))), f["key"]
    assert suite_result["benchmarks"]["nothing"] == {"title": Unavailable.title,
                                                     "skipped": "its reference is not installed here"}
    assert suite_result["plan"]["repetitions"] == 5 and "busy" in suite_result["busy"]


def test_the_report_and_plots_are_written(suite_result, tmp_path):
    report = write_outputs(suite_result, tmp_path / "out")
    text = report.read_text()
    assert "| numpy tg4 |" in text and "Skipped: its reference is not installed here" in text
    assert (tmp_path / "out" / "distributions.png").stat().st_size > 0
    assert read_result(tmp_path / "out" / "results.json")["figures"] == suite_result["figures"]
    assert markdown(suite_result) in text


def test_an_unknown_benchmark_or_a_missing_model_is_named(tmp_path):
    with pytest.raises(ValueError, match="unknown benchmark"):
        run_all(tmp_path / "x.gguf", TINY_PLAN, only=["sped"], progress=False, say=lambda _: None)
    with pytest.raises(ValueError, match="no model at"):
        run_all(tmp_path / "x.gguf", TINY_PLAN, progress=False, say=lambda _: None)
    with pytest.raises(ValueError, match="at least 5 repetitions"):
        Plan.quick(repetitions=3)


def test_the_busy_check_sees_another_process_computing():
    spin = subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 20\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.3)  # it is running
        share = cpu_busy_share(1.0)
    finally:
        spin.kill()
        spin.wait(10)
    cores = os.cpu_count() or 1
    assert share is not None and 0.7 / cores < share <= 1.0, (share, cores)  # one core of `cores`, at least


def test_figures_of_different_workloads_are_not_compared():
    old = {**_result({"throughput.decode.1": [50, 51, 49, 50, 50.5], "speed.tg32.numba": [50, 51, 49, 50, 50]}),
           "plan": {"threads": 2, "throughput_requests": 8, "max_num_seqs": 8}}
    new = {**_result({"throughput.decode.1": [60, 61, 59, 60, 60.5], "speed.tg32.numba": [50, 51, 49, 50, 50]}),
           "plan": {"threads": 2, "throughput_requests": 32, "max_num_seqs": 16}}
    rows, only = compare_results(old, new)
    assert [r[0].key for r in rows] == ["speed.tg32.numba"]  # its workload is in its key
    assert only == ["not compared, the workload differs (throughput_requests 8 -> 32, max_num_seqs 8 -> 16): "
                    "throughput.decode.1"]
    other_threads = {**new, "plan": {**old["plan"], "threads": 1}}
    assert compare_results(old, other_threads)[0] == []


def test_scale_names_how_to_make_its_files_and_measures_each_one(tmp_path, monkeypatch):
    """``scale`` (issue 30) runs speed on each full-size file `make full-size-check` left, and
    without them says how to make them instead of failing."""
    from llmrs_core.bench.suite import ScaleBench, full_size_files

    monkeypatch.setenv("LLMRS_FULL_SIZE_DIR", str(tmp_path))
    bench = ScaleBench()
    assert "make full-size-check" in bench.missing()
    shape = "qwen2.5-0.5b"
    (tmp_path / shape).mkdir()
    write_tiny_llama(tmp_path / shape / f"{shape}.Q4_K_M.gguf", byte_tokenizer=True, seed=5, context_length=64)
    assert bench.missing() is None and list(full_size_files()) == [shape]
    ticks = []
    outcome = bench.run(tmp_path / "unused.gguf", TINY_PLAN, ticks.append)
    keys = {f.key for f in outcome.figures}
    assert {f"scale.{shape}.pp16.numba", f"scale.{shape}.tg4.numba"} <= keys, keys
    # beside the speed: the numba backend's RSS and load time (a fresh process) and its roofline
    assert {f"scale.{shape}.rss.numba", f"scale.{shape}.load_s.numba", f"scale.{shape}.roofline.numba"} <= keys, keys
    assert outcome.raw[shape]["memory"]["roofline"]["bytes_per_token"] > 0
    assert len(ticks) == bench.steps(TINY_PLAN) == TINY_PLAN.repetitions
    assert outcome.raw[shape]["bytes"] > 0


def test_a_file_llamacpp_cannot_load_is_a_note_not_an_abort(tmp_path, monkeypatch):
    """llama-cpp-python raises ValueError("Failed to load model from file") on a file it refuses (a
    tiny test model, an architecture it lacks): the benchmark reports ours and says why it has no
    reference, instead of ending the whole `bench all` run."""
    from llmrs_core.bench import speed as speed_module
    from llmrs_core.bench.suite import speed_outcome

    def refuses(path, *args):
        raise ValueError(f"Failed to load model from file: {path}")

    monkeypatch.setattr(speed_module, "_llama_cpp_runs", refuses)
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5, context_length=64)
    outcome = speed_outcome(path, TINY_PLAN, lambda key: None, ("numba",), True, "speed")
    assert any("llama.cpp could not load tiny.gguf" in note for note in outcome.notes), outcome.notes
    assert outcome.raw["engines"] == ["numba"] and any(f.key == "speed.tg4.numba" for f in outcome.figures)
