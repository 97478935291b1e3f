"""``llmrs bench speed --contention`` (bench/contention.py): the busy core is really busy, on the
core named, only while the benchmark runs, and the losses are quiet over contended figures."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from llmrs_core.bench import contention
from llmrs_core.bench.speed import format_speed, speed
from llmrs_core.testing import write_tiny_llama

pytestmark = [pytest.mark.core, pytest.mark.skipif(contention.can_pin() is not None,
                                                   reason=f"cannot pin a process here: {contention.can_pin()}")]


def core_busy_share(core: int, seconds: float = 0.6) -> float:
    """The share of ``core``'s time spent busy over the next ``seconds`` (its /proc/stat line)."""

    def sample() -> tuple[int, int]:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith(f"cpu{core} "):
                fields = [int(x) for x in line.split()[1:]]
                return sum(fields), fields[3] + fields[4]
        raise AssertionError(f"no cpu{core} line in /proc/stat")

    first = sample()
    time.sleep(seconds)
    second = sample()
    return 1 - (second[1] - first[1]) / max(second[0] - first[0], 1)


def children() -> set[int]:
    """This process's child processes (from /proc)."""
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        text = (task / "children").read_text().split()
        out.update(int(pid) for pid in text)
    return out


def test_the_busy_process_computes_on_its_core_and_is_gone_afterwards():
    before = children()
    with contention.busy_core() as core:
        assert core == min(os.sched_getaffinity(0))
        spinning = children() - before
        assert len(spinning) == 1, f"one busy process expected, found {spinning}"
        assert os.sched_getaffinity(spinning.pop()) == {core}, "the busy process is not pinned to its core"
        share = core_busy_share(core)
    assert share > 0.8, f"core {core} was busy {share:.0%} of the time with the busy process on it"
    assert children() == before, "the busy process outlived the block"


def test_the_busy_process_is_stopped_when_the_benchmark_fails():
    before = children()
    with pytest.raises(KeyError), contention.busy_core():
        raise KeyError("a failing measurement")
    assert children() == before


def test_one_usable_core_is_refused_with_the_reason(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3})
    assert "only one core" in contention.can_pin()
    with pytest.raises(ValueError, match="--contention needs a core to keep busy: .*only one core"):
        with contention.busy_core():
            pass


def test_losses_are_quiet_over_contended():
    quiet = {"a": {"pp": {"tokens_per_s": 300.0}, "tg": {"tokens_per_s": 90.0}}, "b": {"pp": {"tokens_per_s": 1.0},
                                                                                    "tg": {"tokens_per_s": 1.0}}}
    busy = {"a": {"pp": {"tokens_per_s": 100.0}, "tg": {"tokens_per_s": 60.0}}}
    assert contention.losses(quiet, busy) == {"a": {"pp": 3.0, "tg": 1.5}}


def test_speed_with_contention_reports_both_runs_and_the_flags(tmp_path, monkeypatch):
    monkeypatch.setattr("llmrs_core.bench.speed.SETTLE_S", 0.0)  # the pause between turns: test_bench_speed
    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, weight_type="q4_1", seed=2, hidden_size=64, intermediate_size=128)
    r = speed(path, backends=("numba",), pp=8, tg=4, repetitions=1, threads=2, compare=False, exact=True,
              contention=True)
    assert set(r["backends"]) == {"numba", "numba-exact"}
    c = r["contended"]
    assert set(c["backends"]) == {"numba", "numba-exact"} and set(c["loss"]) == {"numba", "numba-exact"}
    for name, loss in c["loss"].items():
        for k in ("pp", "tg"):
            want = r["backends"][name][k]["tokens_per_s"] / c["backends"][name][k]["tokens_per_s"]
            assert loss[k] == pytest.approx(want)
    assert "exact=True" in r["backends"]["numba-exact"]["describe"]
    text = format_speed(r)
    assert "kept busy by another process" in text and "loss against quiet" in text and "CPU flags:" in text
    json.dumps(r)  # what --output writes
