"""Tensor and pipeline parallelism under a real ``mpiexec`` (MPICH), against the one-process engine.

Every launch runs in its own process group with a timeout and is killed whole if it
overruns, so a hang fails the test instead of the suite. The references are computed here,
by the engine in this process: greedy tokens and logits of the same model on one process.
Tolerances: tensor parallelism adds the o_proj and down products in another order (three
partial sums, then the all-reduce), so the logits may differ by ``float32_tolerance(config)``
(K = 1536, 30 layers for SmolLM2); pipeline parallelism changes no arithmetic (same bound).

On a 2-core machine the 3 ranks of TP = 3 are oversubscribed; :data:`MPI_ENV` gives each rank
one Numba and one BLAS thread, and has MPICH yield the core while it waits (see
``llmrs_core.distributed.mpi.OVERSUBSCRIBED_ENV``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import llmrs_core as llmrs
from llmrs_core.distributed.mpi import OVERSUBSCRIBED_ENV
from llmrs_core.testing import float32_tolerance, normalised_error, write_tiny_llama

MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
LLMRS = [sys.executable, "-m", "llmrs_core"]
WORKER = str(Path(__file__).with_name("mpi_worker.py"))
PROMPT = "The capital of France is"
N_TOKENS = 32
#: what one launch may take here at most: SmolLM2 loads and compiles on each rank, then 32 tokens
LAUNCH_TIMEOUT = 120
#: a bad launch must end every rank within seconds; the bound is generous for a busy machine
BAD_LAUNCH_TIMEOUT = 30

pytestmark = pytest.mark.skipif(
    MPIEXEC is None, reason="mpiexec is not installed: pip install -e '.[dist]' brings MPICH's (skipping MPI tests)"
)

MPI_ENV = {**os.environ, **OVERSUBSCRIBED_ENV, "NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def launch(args: list[str], timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``args`` (an ``mpiexec`` command) in a new process group; kill the group on timeout."""
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or MPI_ENV, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{' '.join(args)} did not end within {timeout} s (hang?)\nstdout: {out}\nstderr: {err}")
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def split_run(model: Path, tp: int, pp: int, prompt_ids: list[int], tmp_path: Path, cli: list[str] = (),
              n_tokens: int = N_TOKENS):
    """One launch: rank 0's ``n_tokens`` greedy tokens after ``prompt_ids`` and the logits of prompt +
    tokens (the front door), and the JSON completion of ``llmrs CLI --json`` when ``cli`` is given."""
    out = tmp_path / f"split_tp{tp}_pp{pp}.npz"
    n = tp * pp
    tail = ["--", *cli, "--model", str(model), "--json", "--threads", "1", "--tp", str(tp), "--pp", str(pp)]
    r = launch([MPIEXEC, "-n", str(n), sys.executable, WORKER, str(model), str(tp), str(pp), json.dumps(prompt_ids),
                str(n_tokens), str(out), *(tail if cli else [])], LAUNCH_TIMEOUT)
    assert r.returncode == 0, f"mpiexec -n {n} failed ({r.returncode}): {r.stderr}"
    saved = np.load(out)
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == (1 if cli else 0), f"only rank 0 prints: got {r.stdout!r}"
    return saved["tokens"].tolist(), saved["logits"], json.loads(lines[0]) if cli else None


def check_logits(got: np.ndarray, want: np.ndarray, config, what: str) -> None:
    err = normalised_error(got, want)
    tol = float32_tolerance(config)
    assert err <= tol, f"{what}: logits differ from one process's by {err:.2e} (> {tol:.2e})"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("mpi") / "tiny.gguf"
    write_tiny_llama(path, seed=4, n_layers=4)
    return path


@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_tiny_model_under_mpiexec_equals_one_process(tiny, tmp_path, tp, pp):
    whole = llmrs.load(tiny, backend="numba", threads=1, exact=True)
    prompt = [3, 17, 5, 60, 0, 9]
    want = whole.generate(prompt, max_tokens=N_TOKENS).token_ids
    tokens, logits, _ = split_run(tiny, tp, pp, prompt, tmp_path)
    assert tokens == want, f"--tp {tp} --pp {pp}: greedy tokens differ from one process's"
    check_logits(logits, whole.logits(prompt + want), whole.config, f"--tp {tp} --pp {pp}")


@pytest.fixture(scope="module")
def smollm2(model_path):
    """The one-process reference: SmolLM2's greedy tokens after PROMPT."""
    # exact, here and in the ranks (mpi_worker): a split sums its partial products in another order,
    # which float32 rounding bounds; the int8 path's 8-bit activations would add their own error
    whole = llmrs.load(model_path, backend="numba", threads=1, exact=True)
    prompt = whole.tokenizer.encode(PROMPT)
    return whole, prompt, whole.generate(prompt, max_tokens=N_TOKENS).token_ids


@pytest.mark.model
@pytest.mark.parametrize(("tp", "pp"), [(3, 1), (1, 2)], ids=["tp3", "pp2"])
def test_smollm2_split_gives_the_one_process_tokens(smollm2, model_path, tmp_path, tp, pp):
    whole, prompt, want = smollm2
    # one launch: the front door's logits of prompt + the reference tokens, then the CLI's 32 tokens
    # (the tiny-model tests above cover generate() through the front door)
    _, logits, cli = split_run(model_path, tp, pp, prompt + want, tmp_path,
                               ["generate", PROMPT, "--max-tokens", str(N_TOKENS), "--exact"], n_tokens=0)
    assert cli["token_ids"] == want, f"mpiexec ... llmrs generate --tp {tp} --pp {pp}: {cli['text']!r} differs"
    check_logits(logits, whole.logits(prompt + want), whole.config, f"--tp {tp} --pp {pp}")


# -- bad launches end every rank within seconds, with one message --------------------------------


def _bad(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    r = launch(args, BAD_LAUNCH_TIMEOUT, env)
    assert r.returncode != 0
    assert r.stderr.count("error") == 1, f"one message (from rank 0), got: {r.stderr!r}"
    return r


def test_world_size_other_than_tp_times_pp(tiny):
    r = _bad([MPIEXEC, "-n", "2", *LLMRS, "generate", "hi", "--model", str(tiny), "--tp", "3"])
    assert "mpiexec started 2 processes, but --tp 3 --pp 1 needs 3: run `mpiexec -n 3" in r.stderr


def test_tp_without_mpiexec(tiny):
    r = _bad([*LLMRS, "generate", "hi", "--model", str(tiny), "--tp", "2"])
    assert "started by mpiexec: run `mpiexec -n 2 llmrs generate PROMPT --tp 2`" in r.stderr


def test_invalid_tp_size_lists_the_sizes_that_work(tiny):
    r = _bad([MPIEXEC, "-n", "4", *LLMRS, "generate", "hi", "--model", str(tiny), "--tp", "4"])
    assert "every rank failed to load the model" in r.stderr and "sizes that work: 1, 2" in r.stderr


def test_a_rank_that_fails_to_load_ends_every_rank(tiny, tmp_path):
    cmd = [*LLMRS, "generate", "hi", "--pp", "2", "--model"]
    r = _bad([MPIEXEC, "-n", "1", *cmd, str(tiny), ":", "-n", "1", *cmd, str(tmp_path / "missing.gguf")])
    assert "rank 1 failed to load the model: FileNotFoundError" in r.stderr


def test_mpi4py_missing_says_what_to_install(tiny, tmp_path):
    blocker = tmp_path / "mpi4py"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('No module named mpi4py')\n")
    env = {**MPI_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    r = _bad([MPIEXEC, "-n", "2", *LLMRS, "generate", "hi", "--model", str(tiny), "--pp", "2"], env)
    assert "needs mpi4py" in r.stderr and "pip install -e '.[dist]'" in r.stderr


def test_only_rank_0_prints(tmp_path):
    path = tmp_path / "text.gguf"
    write_tiny_llama(path, seed=4, byte_tokenizer=True)  # 257 tokens: PP splits no vocabulary
    r = launch([MPIEXEC, "-n", "2", *LLMRS, "generate", "hello", "--model", str(path), "--pp", "2",
                "--max-tokens", "4", "--threads", "1"], LAUNCH_TIMEOUT)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("finish:") == 1, f"one statistics line, from rank 0: {r.stderr!r}"


def test_a_rank_failing_mid_run_ends_every_rank(tmp_path):
    """Rank 1 fails after loading while rank 0 waits in the first collective: rank 1 reports and
    MPI_Abort ends both (without it rank 0 would wait forever)."""
    path = tmp_path / "text.gguf"
    write_tiny_llama(path, seed=4, byte_tokenizer=True)
    r = launch([MPIEXEC, "-n", "2", sys.executable, WORKER, "--fail-on-rank", "1", "generate", "hi", "--model",
                str(path), "--pp", "2", "--threads", "1"], BAD_LAUNCH_TIMEOUT)
    assert r.returncode != 0
    assert "llmrs generate: error on rank 1: RuntimeError: rank 1 was told to fail" in r.stderr


def test_llmrs_launch_starts_mpiexec_for_you(tmp_path):
    path = tmp_path / "text.gguf"
    write_tiny_llama(path, seed=4, byte_tokenizer=True)
    r = launch([*LLMRS, "launch", "-n", "2", "--", "generate", "hello", "--model", str(path), "--pp", "2",
                "--max-tokens", "3", "--json"], LAUNCH_TIMEOUT)
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1 and len(json.loads(lines[0])["token_ids"]) == 3
