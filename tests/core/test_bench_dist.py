"""``bench all``'s ``dist`` and ``quant`` benchmarks (chapters 11 and 6) on tiny models.

``dist``: the summaries are checked on a profile made here by ``llmrs_core.ops.profile``
itself (one process, no mpiexec), against sums of its step and event times written in the test;
then one real run of the benchmark under ``mpiexec`` (skipped without it): three launches of the
tiny model on the Numba backend (the profile's; one thread a rank). The all-reduce count of a tensor-parallel step is the reference
arithmetic of chapter 11: one after attention's output projection and one after the MLP's down
projection per layer, plus one for the vocab-parallel embedding. Nothing asserts a duration.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
import pytest

from llmrs_core.bench.dist import (
    LaunchFailed,
    Layout,
    decode_repetitions,
    layouts,
    profile_command,
    run_bounded,
)
from llmrs_core.bench.report import markdown, raw_table
from llmrs_core.bench.suite import DistBench, Plan, QuantBench, run_all
from llmrs_core.formats.gguf import read_gguf
from llmrs_core.formats.gguf_writer import write_gguf
from llmrs_core.ops import profile
from llmrs_core.testing import (
    TINY_TEXT_LLAMA,
    byte_level_tokenizer_metadata,
    tiny_llama_metadata,
    tiny_llama_tensors,
    write_tiny_llama,
)

PER_REPETITION = 4
PLAN = Plan("test", 5, 1, quant_schemes=("f32", "q8_0", "q4_0"), quant_tokens=33, dist_tokens=PER_REPETITION)


def write_splittable(path) -> None:
    """A tiny text model whose vocabulary splits in two (256 bytes, end of text and one pad token:
    258), so that tensor parallelism over 2 ranks can cut it."""
    params = {**TINY_TEXT_LLAMA, "vocab_size": 258, "n_layers": 4}
    metadata = tiny_llama_metadata(**params) | byte_level_tokenizer_metadata()
    metadata["tokenizer.ggml.tokens"] = [*metadata["tokenizer.ggml.tokens"], "<|pad|>"]
    metadata["tokenizer.ggml.token_type"] = [*metadata["tokenizer.ggml.token_type"], 3]
    write_gguf(path, metadata, tiny_llama_tensors(**params, seed=4))


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("dist") / "tiny.gguf"
    write_splittable(path)
    return path


@pytest.fixture(scope="module")
def canned(text_model, tmp_path_factory):
    """A real profile: the prompt, then 1 + 2 groups of decode steps and 2 left over, one process."""
    out = tmp_path_factory.mktemp("profile") / "profile.json"
    n = 3 * PER_REPETITION + 2
    assert profile.main(["--model", str(text_model), "--backend", "numba", "--tokens", str(n), "--out", str(out)]) == 0
    return json.loads(out.read_text())


def seconds(steps) -> float:
    return sum(e - s for s, e in steps)


def test_decode_repetitions_are_consecutive_groups_after_a_warm_up(canned):
    steps = canned["ranks"][0]["steps"]
    r = decode_repetitions(canned, PER_REPETITION)
    assert len(r["tokens_per_s"]) == 2, "two whole groups after the warm-up; the 2 steps left over are dropped"
    for g in range(2):
        group = steps[1 + (1 + g) * PER_REPETITION: 1 + (2 + g) * PER_REPETITION]
        assert r["tokens_per_s"][g] == pytest.approx(PER_REPETITION / seconds(group))
    assert r["comm_share"] == [0.0, 0.0], "one process calls no collective"
    kept = steps[1 + PER_REPETITION: 1 + 3 * PER_REPETITION]
    assert r["ranks"][0]["step_s"] == pytest.approx(seconds(kept) / len(kept))


def test_the_communication_share_is_the_time_in_calls_over_the_steps_time(canned):
    doc = json.loads(json.dumps(canned))
    steps = doc["ranks"][0]["steps"]
    first = steps[1 + PER_REPETITION]  # the first step of repetition 0
    inside = (first[0] + 0.25 * (first[1] - first[0]), first[0] + 0.75 * (first[1] - first[0]))
    prompt = steps[0]
    doc["ranks"][0]["events"] = [["all_reduce", *inside, 1024], ["all_reduce", prompt[0], prompt[1], 1024]]
    second = {**doc["ranks"][0], "rank": 1, "events": []}  # a second rank that never waits
    doc["ranks"].append(second)
    r = decode_repetitions(doc, PER_REPETITION)
    group = steps[1 + PER_REPETITION: 1 + 2 * PER_REPETITION]
    share_rank0 = (inside[1] - inside[0]) / seconds(group)
    assert r["comm_share"][0] == pytest.approx(share_rank0 / 2), "the mean over both ranks"
    assert r["comm_share"][1] == 0.0, "the prompt's event is not in any decode repetition"
    assert r["ranks"][0]["all_reduces"] == pytest.approx(1 / (2 * PER_REPETITION))


def test_too_few_decode_steps_are_named(canned):
    with pytest.raises(ValueError, match="too few for 1 warm-up and one repetition of 100"):
        decode_repetitions(canned, 100)
    with pytest.raises(ValueError, match="at least one decode step"):
        decode_repetitions(canned, 0)


def test_layouts_take_the_smallest_tp_size_that_splits_the_model(text_model, tmp_path):
    with read_gguf(text_model) as g:
        chosen, notes = layouts(g.config, 1)
    assert chosen == [Layout(), Layout(tp=2), Layout(pp=2)] and notes == []
    import dataclasses
    smollm2_like = dataclasses.replace(g.config, n_heads=9, n_kv_heads=3, head_dim=64, hidden_size=576,
                                       intermediate_size=1536, vocab_size=49152)
    assert [x.name for x in layouts(smollm2_like, 32)[0]] == ["one process", "tp 3", "pp 2"]
    odd = tmp_path / "odd.gguf"
    write_tiny_llama(odd, byte_tokenizer=True, n_layers=1)  # vocabulary 257 splits nowhere, 1 layer in 1 stage
    with read_gguf(odd) as g:
        chosen, notes = layouts(g.config, 1)
    assert chosen == [Layout()]
    assert "no size above 1 splits this model" in notes[0] and "--pp 2 cannot split 1 layers" in notes[1]


def test_a_split_layout_runs_under_mpiexec_with_one_thread_a_rank(text_model, tmp_path):
    pytest.importorskip("mpi4py")
    argv, env = profile_command(text_model, Layout(tp=3), 8, "numba", tmp_path / "p.json", cores=2)
    assert argv[1:3] == ["-n", "3"] and argv[-2:] == ["--tp", "3"] and "--threads" in argv
    assert env["NUMBA_NUM_THREADS"] == "1" and env["MPIR_CVAR_POLLS_BEFORE_YIELD"] == "1", "3 ranks on 2 cores yield"
    argv, env = profile_command(text_model, Layout(), 8, "numba", tmp_path / "p.json")
    assert argv[0] == sys.executable and "--tp" not in argv


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (absent, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_failing_or_hanging_launch_is_killed_and_named(tmp_path):
    with pytest.raises(LaunchFailed, match=r"failed \(exit status 3\): on stderr"):
        run_bounded([sys.executable, "-c", "import sys; print('on stderr', file=sys.stderr); sys.exit(3)"], None, 60)
    pid_file = tmp_path / "grandchild.pid"
    # the grandchild (a rank under mpiexec) holds no pipe of ours: only killing the group ends it
    hang = (f"import pathlib, subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(120)'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            f"pathlib.Path({str(pid_file)!r}).write_text(str(p.pid)); time.sleep(120)")
    with pytest.raises(LaunchFailed, match="did not end within 2 s and was killed"):
        run_bounded([sys.executable, "-c", hang], None, 2)
    if not pid_file.exists():
        pytest.skip("the machine was too slow to start the grandchild within 2 s")
    pid = int(pid_file.read_text())
    for _ in range(50):  # SIGKILL is delivered at once; allow the kernel a moment to tear it down
        if gone(pid):
            break
        time.sleep(0.1)
    if not gone(pid):
        os.kill(pid, signal.SIGKILL)
        pytest.fail("a rank (the grandchild) outlived the timeout: the whole process group must be killed")


def test_the_dist_benchmark_under_mpiexec(text_model):
    bench = DistBench(backend="numba", timeout=120)
    if bench.missing():
        pytest.skip(bench.missing())
    ticks = []
    outcome = bench.run(text_model, PLAN, ticks.append)
    assert len(ticks) == bench.steps(PLAN)
    keys = [f.key for f in outcome.figures]
    assert keys == ["dist.single.decode_tok_s", "dist.tp2.decode_tok_s", "dist.tp2.comm_share", "dist.tp2/single",
                    "dist.pp2.decode_tok_s", "dist.pp2.comm_share", "dist.pp2/single"], outcome.notes
    for f in outcome.figures:
        assert len(f.samples) == PLAN.repetitions, f.key
    n_layers = 4
    tp = outcome.raw["layouts"]["tp 2"]["decode_per_rank"]
    assert [r["all_reduces"] for r in tp] == [2 * n_layers + 1] * 2
    pp = outcome.raw["layouts"]["pp 2"]["decode_per_rank"]
    assert [r["all_reduces"] for r in pp] == [0, 0] and all(r["sent_bytes"] > 0 for r in pp)
    assert not any("differ" in n for n in outcome.notes), outcome.notes
    assert len(outcome.raw["table"]["rows"]) == 1 + 2 + 2
    command = outcome.raw["layouts"]["tp 2"]["command"]
    assert "NUMBA_NUM_THREADS=1 " in command and " mpiexec -n 2 python -m llmrs_core.ops.profile " in command


def test_the_quant_benchmark_gives_a_table_and_the_report_prints_it(text_model, tmp_path):
    result = run_all(text_model, PLAN, benchmarks={"quant": QuantBench()}, progress=False, measure_machine=False,
                     say=lambda _: None)
    b = result["benchmarks"]["quant"]
    assert b["figures"] == [] and result["figures"] == []
    rows = b["raw"]["schemes"]
    assert list(rows) == ["f32", "q8_0", "q4_0"] and rows["f32"]["kl"] == 0.0
    assert b["raw"]["tokens"] == PLAN.quant_tokens
    text = markdown(result)
    assert "| scheme | size MB | bits/weight | perplexity | KL (nats) | top-1 same | matrices stored as |" in text
    assert "| figure | median" not in text, "no empty figure table"
    assert "| f32 | " in text and "32.00 |" in text  # float32: 32 bits a weight


def test_a_raw_table_with_a_short_row_is_refused():
    with pytest.raises(ValueError, match="row 0 has 1 cells for 2 columns"):
        raw_table({"columns": ["a", "b"], "rows": [["x"]]})
    assert raw_table({"columns": ["a"], "rows": [["x|y"]]})[-1] == "| x\\|y |"


def test_without_mpi_the_dist_benchmark_is_skipped_with_a_sentence(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    why = DistBench().missing()
    assert why is not None and "mpi4py" in why and "pip install" in why
    monkeypatch.delitem(sys.modules, "mpi4py")
    monkeypatch.setenv("PATH", "")
    monkeypatch.setattr(sys, "executable", os.devnull)
    pytest.importorskip("mpi4py")
    assert "mpiexec" in DistBench().missing()


def test_the_plan_refuses_impossible_sizes():
    with pytest.raises(ValueError, match="quant_tokens must be at least 2"):
        Plan("x", 5, quant_tokens=1)
    with pytest.raises(ValueError, match="dist_tokens must be at least 1"):
        Plan("x", 5, dist_tokens=0)
    assert np.all([Plan.quick().quant_tokens < Plan.full().quant_tokens])
