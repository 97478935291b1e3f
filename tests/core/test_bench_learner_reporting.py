"""What `--impl learner` / `--backend learner` commands report (issue 32, item 7), on tiny models.

Each command that runs the learner's code says which parts were the learner's: the whole
"who computes what" list, not its header alone. `bench throughput`, minutes long on the
learner's NumPy-based backend, says what it is doing on stderr as it goes, in lines that
read the same through a pipe; and it honours --input-len / --output-len (other bench
commands refuse them, naming what they take instead).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import llmrs_core
from llmrs_core.bench import throughput as tp
from llmrs_core.cli import main
from llmrs_core.testing import write_tiny_llama

ROOT = Path(llmrs_core.__file__).resolve().parents[1]
#: every part the learner backend reports (llmrs_core/workbook/learner.py)
PARTS = ("linear (Exercise 4.6)", "attention (Exercise 3.6)", "KV cache (Exercise 5.6)", "scheduler (Exercise 7.6)",
         "prefix cache (Exercise 7.7)")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny.gguf"
    write_tiny_llama(path, byte_tokenizer=True, seed=5, context_length=1024)  # the prefix workload is ~600 tokens
    return path


def test_bench_speed_lists_who_computes_what(tiny, capsys):
    assert main(["bench", "speed", "--impl", "learner", "--model", str(tiny), "--pp", "8", "--tg", "2",
                 "--repetitions", "1", "--no-compare"]) == 0
    out = capsys.readouterr().out
    assert "learner: backend 'learner' — who computes what:" in out, out
    assert all(part in out for part in PARTS), out


def test_serve_with_the_learner_backend_says_which_parts_are_yours(tiny, capsys, monkeypatch):
    import llmrs_core.server as server

    monkeypatch.setattr(server, "serve", lambda *args, **kwargs: None)  # built, not started
    assert main(["serve", str(tiny), "--backend", "learner", "--no-request-log"]) == 0
    err = capsys.readouterr().err
    assert "backend 'learner' — who computes what:" in err and all(part in err for part in PARTS), err


def test_bench_throughput_shows_its_progress_through_a_pipe(tiny):
    proc = subprocess.run(
        [sys.executable, "-m", "llmrs_core.cli", "bench", "throughput", "--impl", "learner", "--model", str(tiny),
         "--requests", "2", "--max-num-seqs", "2", "--input-len", "20", "--output-len", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("backend 'learner' — who computes what:"), proc.stdout
    parts = [line for line in proc.stderr.splitlines() if line.startswith("bench throughput [")]
    assert [p.split("]")[0] for p in parts[::2]] == [f"bench throughput [{i}/5" for i in range(1, 6)], proc.stderr
    assert all(" done in " in p for p in parts[1::2]) and len(parts) == 10, proc.stderr
    assert "\r" not in proc.stderr, "lines, not a redrawn one: a pipe shows them as they are"
    assert "prompts 16-20 tokens, outputs 4-4" in proc.stdout, proc.stdout


def test_bench_throughput_honours_input_and_output_lengths(tiny, monkeypatch):
    import llmrs_core as llmrs

    workloads, lines = [], []
    real = tp.run_workload

    def recorded(net, tokenizer, prompts, output_lens, **kwargs):
        workloads.append(([len(p) for p in prompts], list(output_lens)))
        return real(net, tokenizer, prompts, output_lens, **kwargs)

    monkeypatch.setattr(tp, "run_workload", recorded)
    monkeypatch.setattr(tp, "PROGRESS_EVERY", 0.0)  # a line after every step's output
    result = tp.throughput(llmrs.load(tiny, backend="numpy"), n_requests=3, max_prompt=24, max_output=6,
                           max_num_seqs=2, progress=lines.append)
    prompt_lens, output_lens = workloads[0]
    assert all(16 <= n <= 24 for n in prompt_lens) and output_lens == [6, 6, 6], workloads[0]
    assert result["workload"]["prompt_tokens"] == [16, 24] and result["workload"]["output_tokens"] == [6, 6]
    end = next(i for i, line in enumerate(lines) if line.startswith("bench throughput [1/5] done in "))
    running = [line.strip() for line in lines[:end] if "requests finished" in line]  # the random workload's
    assert running and running[-1].startswith("3 of 3 requests finished, 18 of 18 tokens generated"), lines
    short = tp.throughput(llmrs.load(tiny, backend="numpy"), n_requests=2, max_prompt=24, max_output=3)
    assert short["workload"]["output_tokens"] == [3, 3], "a longest output under 16 is the only length"


@pytest.mark.parametrize("what", ["speed", "all"])
def test_other_benches_refuse_input_len(tiny, capsys, what):
    assert main(["bench", what, "--model", str(tiny), "--input-len", "32"]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("llmrs bench: error: --input-len is for bench serve and bench throughput"), err
    if what == "speed":
        assert "--pp and --tg" in err


def test_bench_throughput_json_has_the_lengths(tiny, capsys):
    assert main(["bench", "throughput", "--model", str(tiny), "--backend", "numpy", "--requests", "2",
                 "--max-num-seqs", "2", "--output-len", "5", "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["workload"]["output_tokens"] == [5, 5] and result["workload"]["prompt_tokens"] == [16, 128]
    assert "bench throughput [5/5] done in" in err
