"""``llmrs bench speed``'s turns (bench/speed.py): the engines alternate, one repetition each per
round, with a pause before each turn, so that one engine's after-effects (llama.cpp's threads)
do not fall on the next one's timing; a lone engine runs without pauses."""

from __future__ import annotations

import pytest

from llmrs_core.bench import speed as speed_module

pytestmark = pytest.mark.core


def _engines(log: list, names: tuple[str, ...]) -> dict:
    return {name: (lambda n=name: log.append(f"{n} pp"), lambda n=name: log.append(f"{n} tg"), None)
            for name in names}


def test_alternating_engines_pause_before_each_turn(monkeypatch):
    log: list = []
    monkeypatch.setattr(speed_module.time, "sleep", lambda s: log.append(f"pause {s}"))
    times = speed_module._interleaved(_engines(log, ("ours", "llama.cpp")), repetitions=2)
    pause = f"pause {speed_module.SETTLE_S}"
    warm = ["ours pp", "ours tg", "llama.cpp pp", "llama.cpp tg"]
    round_ = [pause, "ours pp", "ours tg", pause, "llama.cpp pp", "llama.cpp tg"]
    assert log == warm + round_ + round_, "each engine's turn must follow a pause, every round"
    assert {name: [len(t["pp"]), len(t["tg"])] for name, t in times.items()} == {"ours": [2, 2], "llama.cpp": [2, 2]}
    assert speed_module.SETTLE_S > 0


def test_a_lone_engine_runs_without_pauses(monkeypatch):
    log: list = []
    monkeypatch.setattr(speed_module.time, "sleep", lambda s: log.append(f"pause {s}"))
    speed_module._interleaved(_engines(log, ("ours",)), repetitions=3)
    assert not any(entry.startswith("pause") for entry in log)
