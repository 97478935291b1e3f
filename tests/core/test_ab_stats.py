"""The A/B statistics (chapter 12, section 12.4) against SciPy and against known distributions:
Mann-Whitney U equal to ``scipy.stats.mannwhitneyu``'s asymptotic test, a bootstrap interval
that covers the true difference as often as it says, sample sizes that give the power they
promise (by simulation), and verdicts that say "not enough data" when that is the truth.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmrs_core.bench.stats import (
    MIN_N,
    bootstrap_diff_ci,
    compare,
    mann_whitney_u,
    midranks,
    sample_size_mann_whitney,
    sample_size_means,
)

stats = pytest.importorskip("scipy.stats")


def binomial_band(trials: int, p: float, z: float = 5.0) -> tuple[float, float]:
    sd = math.sqrt(p * (1 - p) / trials)
    return p - z * sd, p + z * sd


@pytest.mark.parametrize("seed", range(6))
def test_mann_whitney_equals_scipy_with_and_without_ties(seed):
    rng = np.random.default_rng(seed)
    n1, n2 = rng.integers(5, 60, 2)
    if seed % 2:
        x, y = rng.integers(0, 6, n1).astype(float), rng.integers(0, 8, n2).astype(float)
    else:
        x, y = rng.lognormal(0, 1, n1), rng.lognormal(0.3, 1, n2)
    ref = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic", use_continuity=True)
    ours = mann_whitney_u(x, y)
    assert ours.u == pytest.approx(ref.statistic, abs=1e-9 * n1 * n2)
    assert ours.p_value == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)
    assert ours.effect == pytest.approx(ref.statistic / (n1 * n2))


def test_midranks_equal_scipy_rankdata():
    values = np.array([3.0, 1.0, 3.0, 2.0, 3.0, 1.0, 7.0])
    ranks, ties = midranks(values)
    assert ranks.tolist() == stats.rankdata(values).tolist()
    assert sorted(ties.tolist()) == [1, 1, 2, 3]


def test_mann_whitney_of_all_tied_values_is_no_evidence():
    r = mann_whitney_u([2.0] * 10, [2.0] * 12)
    assert (r.u, r.p_value, r.effect) == (60.0, 1.0, 0.5)


def test_bootstrap_interval_covers_the_true_difference_as_often_as_it_says():
    rng = np.random.default_rng(0)
    trials, covered = 200, 0
    for t in range(trials):
        a, b = rng.normal(0, 1, 100), rng.normal(0.5, 1, 100)
        ci = bootstrap_diff_ci(a, b, n_resamples=500, seed=t)
        covered += ci.low <= 0.5 <= ci.high
    low, high = binomial_band(trials, 0.95)
    assert low <= covered / trials <= min(high, 1.0), f"95% intervals covered the truth {covered}/{trials} times"


def test_paired_bootstrap_sees_a_small_shift_that_the_unpaired_one_cannot():
    rng = np.random.default_rng(1)
    a = rng.normal(0, 1, 300)
    b = a + 0.05 + rng.normal(0, 0.01, 300)  # B is A plus a little: the pairs tell
    assert bootstrap_diff_ci(a, b, paired=True).excludes_zero
    assert not bootstrap_diff_ci(a, b).excludes_zero


def test_bootstrap_refuses_bad_samples():
    with pytest.raises(ValueError, match="empty"):
        bootstrap_diff_ci([], [1.0])
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_diff_ci([1.0, float("nan")], [1.0])
    with pytest.raises(ValueError, match="same length"):
        bootstrap_diff_ci([1.0, 2.0], [1.0], paired=True)


def test_sample_size_gives_the_power_it_promises():
    """Cohen's d = 0.5 at alpha 0.05, power 0.8; simulated two-sided t-tests reach that power."""
    n = sample_size_means(sd=1.0, effect=0.5)
    assert n == math.ceil(2 * (stats.norm.ppf(0.975) + stats.norm.ppf(0.8)) ** 2 / 0.25)
    rng = np.random.default_rng(2)
    trials = 1000
    a, b = rng.normal(0, 1, (trials, n)), rng.normal(0.5, 1, (trials, n))
    power = float((stats.ttest_ind(a, b, axis=1).pvalue < 0.05).mean())
    low, high = binomial_band(trials, 0.8)
    assert low - 0.01 <= power <= high, f"simulated power {power} with n = {n} per group"  # t vs z: under 0.01


def test_mann_whitney_sample_size_reaches_its_power_on_normal_data():
    n = sample_size_mann_whitney(sd=1.0, effect=0.5)
    assert n > sample_size_means(sd=1.0, effect=0.5)
    rng = np.random.default_rng(3)
    trials = 1000
    a, b = rng.normal(0, 1, (trials, n)), rng.normal(0.5, 1, (trials, n))
    power = float((stats.mannwhitneyu(a, b, axis=1, method="asymptotic").pvalue < 0.05).mean())
    low, _ = binomial_band(trials, 0.8)
    assert power >= low, f"simulated power {power} with n = {n} per group"


@pytest.mark.parametrize("bad", [dict(sd=1.0, effect=0.0), dict(sd=-1.0, effect=1.0), dict(sd=1.0, effect=1.0, alpha=0),
                                 dict(sd=1.0, effect=1.0, power=1.0)])
def test_sample_size_refuses_bad_input(bad):
    with pytest.raises(ValueError):
        sample_size_means(**bad)


def test_compare_says_not_enough_data_below_the_minimum():
    c = compare("ttft", [1.0] * (MIN_N - 1), [2.0] * 20, effect_of_interest=0.1)
    assert c.verdict == "not enough data" and str(MIN_N) in c.reason and c.difference is None


def test_compare_finds_a_clear_difference():
    rng = np.random.default_rng(4)
    c = compare("ttft", rng.lognormal(0, 0.3, 60), rng.lognormal(0.5, 0.3, 60), effect_of_interest=0.1)
    assert c.verdict == "B higher" and c.p_value < 0.05 and c.difference.low > 0


def test_compare_without_a_difference_says_whether_the_sample_was_big_enough():
    rng = np.random.default_rng(5)
    small = compare("tpot", rng.normal(1, 0.2, 20), rng.normal(1, 0.2, 20), effect_of_interest=0.02)
    assert small.verdict == "not enough data" and small.n_needed > 20
    big = compare("tpot", rng.normal(1, 0.2, 400), rng.normal(1, 0.2, 400), effect_of_interest=0.1)
    assert big.n_needed <= 400
    assert big.verdict == "no difference", big.reason
