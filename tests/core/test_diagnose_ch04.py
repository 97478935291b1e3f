"""Chapter 4's sampling tests name each known mistake: proven by planting it.

As for chapter 3 (test_diagnose_ch03.py): each mistake is planted in a copy of
the solution — the engine's sampler recompiled with one edit — and the test
that should catch it must fail with the message that names it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from llmrs_core import sampling
from llmrs_core.testing import plant, solution_with

spec = importlib.util.spec_from_file_location(
    "diagnosed_test_ex4_7_sampling", Path(__file__).resolve().parents[1] / "ch04" / "test_ex4_7_sampling.py"
)
T47 = importlib.util.module_from_spec(spec)
spec.loader.exec_module(T47)


def failure(test, ex, *args) -> str:
    with pytest.raises(AssertionError) as e:
        test(ex, *args)
    return str(e.value)


@pytest.mark.parametrize("p, want", [(0.3, [0]), (0.6, [0, 1]), (0.81, [0, 1, 2])])
def test_top_p_one_token_too_few_gets_its_own_message(p, want):
    too_few = plant(sampling.top_p_filter, ("keep_sorted = before < p", "keep_sorted = np.cumsum(probs) < p"))
    message = failure(T47.test_ex4_7_top_p_keeps_the_token_that_crosses, solution_with(4, top_p_filter=too_few), p, want)
    assert "drops the token that crosses p" in message


def test_temperature_after_top_p_gets_its_own_message():
    late = plant(
        sampling.sample_token,
        ("    x = np.clip(apply_temperature(x, params.temperature), -LOGIT_LIMIT, LOGIT_LIMIT)\n", ""),
        ("    x = top_p_filter(x, params.top_p)\n",
         "    x = top_p_filter(x, params.top_p)\n    x = np.clip(apply_temperature(x, params.temperature), -LOGIT_LIMIT, LOGIT_LIMIT)\n"),
    )
    message = failure(T47.test_ex4_7_temperature_comes_before_top_p, solution_with(4, sample_token=late))
    assert "applies top-p before the temperature" in message


def test_the_solution_passes():
    ex = solution_with(4)
    T47.test_ex4_7_temperature_comes_before_top_p(ex)
    for p, want in [(0.3, [0]), (0.6, [0, 1]), (0.81, [0, 1, 2])]:
        T47.test_ex4_7_top_p_keeps_the_token_that_crosses(ex, p, want)
