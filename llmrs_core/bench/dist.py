"""Tensor- and pipeline-parallel decode under real ranks, and its share of communication (chapter 11).

``bench all``'s ``dist`` benchmark (:class:`~.suite.DistBench`) launches
``python -m llmrs_core.ops.profile`` once per layout (:func:`layouts`):

* one process (the baseline: no communicator calls);
* tensor parallel over the smallest size that splits the model
  (:func:`~llmrs_core.distributed.sharding.valid_tp_sizes`): 2 for most models,
  3 for SmolLM2, whose 3 KV heads do not split over 2 ranks;
* pipeline parallel over 2 stages;

each split one under ``mpiexec -n N`` (:func:`~llmrs_core.distributed.mpi.find_mpiexec`),
every process with one Numba and one BLAS thread, and MPICH told to yield its core
while it waits when there are more ranks than cores
(:data:`~llmrs_core.distributed.mpi.OVERSUBSCRIBED_ENV`). A launch loads the model
and compiles on every rank, which is costly, so one launch gives all the repetitions:
it runs the prompt and ``(repetitions + 1) * tokens`` greedy decode steps, and
:func:`decode_repetitions` cuts the decode steps into consecutive groups of
``tokens``: the first is a warm-up, each other one a repetition. Per repetition:

* decode tokens/s: ``tokens`` over the seconds rank 0's steps of the group took;
* the share of decode time spent communicating: per rank,
  :func:`~llmrs_core.ops.timeline.summarise` of the group's steps (time inside a
  collective is transfer *plus waiting* for the slowest rank), averaged over the ranks.

Later groups attend over a few dozen more cached positions than earlier ones: next to
the weights every step reads, a negligible trend. Every launch runs under a timeout in
its own process group, killed whole when it overruns or fails (:func:`run_bounded`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

#: seconds one launch may take: SmolLM2 loads and compiles on every rank (about 20 s for TP 3 on the
#: busy 2-core machine, 192 decode steps included)
LAUNCH_TIMEOUT = 300
#: what every rank (and the baseline) runs with: one thread each, so that a split's ranks and the
#: baseline ask for cores the same way
ONE_THREAD = {"NUMBA_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
PROFILE = ["-m", "llmrs_core.ops.profile"]


class LaunchFailed(RuntimeError):
    """A profile launch exited with an error or overran its timeout (and was killed)."""


@dataclass(frozen=True)
class Layout:
    """One way to run the model: ``tp`` tensor-parallel ranks or ``pp`` pipeline stages."""

    tp: int = 1
    pp: int = 1

    @property
    def ranks(self) -> int:
        return self.tp * self.pp

    @property
    def name(self) -> str:
        """``"one process"``, ``"tp 3"``, ``"pp 2"``."""
        if self.ranks == 1:
            return "one process"
        return f"tp {self.tp}" if self.tp > 1 else f"pp {self.pp}"

    @property
    def key(self) -> str:
        """The figures' key part: ``"single"``, ``"tp3"``, ``"pp2"``."""
        return "single" if self.ranks == 1 else self.name.replace(" ", "")


def layouts(config, block_size: int) -> tuple[list[Layout], list[str]]:
    """The layouts to measure for a model of ``config`` whose row-parallel weights are stored in
    ``block_size``-weight blocks, and a sentence for each one it cannot run."""
    from ..distributed.sharding import stage_layers, valid_tp_sizes

    chosen, notes = [Layout()], []
    tp = [t for t in valid_tp_sizes(config, block_size) if t > 1]
    if tp:
        chosen.append(Layout(tp=tp[0]))
    else:
        notes.append(f"tensor parallelism: no size above 1 splits this model ({config.n_kv_heads} KV heads, "
                     f"vocabulary {config.vocab_size}): not measured")
    try:
        stage_layers(config.n_layers, 2, 0)
        chosen.append(Layout(pp=2))
    except ValueError as e:
        notes.append(f"pipeline parallelism over 2 stages: {e}: not measured")
    return chosen, notes


def profile_command(model_path: Path, layout: Layout, tokens: int, backend: str, out: Path,
                    cores: int | None = None) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one launch of the profile, writing its JSON to ``out``."""
    argv = [sys.executable, *PROFILE, "--model", str(model_path), "--backend", backend, "--threads", "1",
            "--tokens", str(tokens), "--out", str(out)]
    env = {**os.environ, **ONE_THREAD}
    if layout.ranks == 1:
        return argv, env
    from ..distributed.mpi import OVERSUBSCRIBED_ENV, find_mpiexec

    if layout.ranks > (cores or os.cpu_count() or 1):
        env |= OVERSUBSCRIBED_ENV
    flag = ["--tp", str(layout.tp)] if layout.tp > 1 else ["--pp", str(layout.pp)]
    return [find_mpiexec(), "-n", str(layout.ranks), *argv, *flag], env


def run_bounded(argv: list[str], env: dict[str, str] | None, timeout: float) -> str:
    """Run ``argv`` in a new process group and return its standard output; on a non-zero exit or
    after ``timeout`` seconds, kill the whole group (every rank) and raise :class:`LaunchFailed`
    with the end of its standard error."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise LaunchFailed(f"`{' '.join(argv)}` did not end within {timeout:g} s and was killed; "
                           f"its last words: {_tail(err)}") from None
    except BaseException:  # Ctrl-C while waiting: the ranks must not outlive us
        _kill_group(proc)
        proc.communicate()
        raise
    if proc.returncode != 0:
        _kill_group(proc)  # a rank that outlives mpiexec's exit
        raise LaunchFailed(f"`{' '.join(argv)}` failed (exit status {proc.returncode}): {_tail(err)}")
    return out


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(text: str, lines: int = 6) -> str:
    kept = [line for line in (text or "").strip().splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(nothing on standard error)"


def launch(model_path: Path, layout: Layout, tokens: int, backend: str, timeout: float = LAUNCH_TIMEOUT) -> dict:
    """One bounded launch of the profile for ``layout``: its JSON document (rank 0's), with the
    command line (and the environment variables it set) under ``"command"``."""
    with tempfile.TemporaryDirectory(prefix="llmrs-dist-") as tmp:
        out = Path(tmp) / "profile.json"
        argv, env = profile_command(model_path, layout, tokens, backend, out)
        run_bounded(argv, env, timeout)
        try:
            profile = json.loads(out.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise LaunchFailed(f"`{' '.join(argv)}` ended but left no readable profile ({e})") from None
    from ..distributed.mpi import OVERSUBSCRIBED_ENV

    settings = [f"{k}={v}" for k, v in env.items() if k in ONE_THREAD or k in OVERSUBSCRIBED_ENV]
    shown = ["python" if a == sys.executable else a for a in argv]
    profile["command"] = " ".join([*settings, *(["mpiexec", *shown[1:]] if layout.ranks > 1 else shown)])
    return profile


def decode_repetitions(profile: dict, per_repetition: int, warm_up: int = 1) -> dict:
    """Cut a profile's decode steps (every step after the prompt's) into consecutive groups of
    ``per_repetition``; drop the first ``warm_up`` groups and any incomplete one at the end.

    Returns ``{"tokens_per_s": [R], "comm_share": [R], "ranks": [per rank: summarise() over
    every kept step]}``: per group, ``per_repetition`` over the seconds rank 0's steps took, and
    the share of the steps' time each rank spent in communicator calls, averaged over the ranks.
    """
    from ..ops.timeline import Event, summarise

    if per_repetition < 1:
        raise ValueError(f"a repetition needs at least one decode step, got {per_repetition}")
    ranks = sorted(profile["ranks"], key=lambda r: r["rank"])
    decode = [[tuple(s) for s in r["steps"][1:]] for r in ranks]  # step 0 is the prompt
    groups = len(decode[0]) // per_repetition - warm_up
    if groups < 1:
        raise ValueError(f"the profile has {len(decode[0])} decode steps: too few for {warm_up} warm-up and one "
                         f"repetition of {per_repetition}")
    events = [[Event(*e) for e in r["events"]] for r in ranks]

    def group(steps: list, g: int) -> list:
        start = (warm_up + g) * per_repetition
        return steps[start:start + per_repetition]
    tokens_per_s, comm_share = [], []
    for g in range(groups):
        rank0 = group(decode[0], g)
        tokens_per_s.append(per_repetition / sum(e - s for s, e in rank0))
        shares = [summarise(ev, group(steps, g))["comm_share"] for ev, steps in zip(events, decode)]
        comm_share.append(sum(shares) / len(shares))
    kept = slice(warm_up * per_repetition, (warm_up + groups) * per_repetition)
    return {"tokens_per_s": tokens_per_s, "comm_share": comm_share,
            "ranks": [summarise(ev, steps[kept]) for ev, steps in zip(events, decode)]}


__all__ = ["LAUNCH_TIMEOUT", "LaunchFailed", "Layout", "decode_repetitions", "launch", "layouts",
           "profile_command", "run_bounded"]
