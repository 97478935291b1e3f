"""Exercise 12.8 — an A/B testing pipeline: sticky weighted assignment, Mann-Whitney U, a bootstrap CI.

The assignment is checked by what it must do for any hash: the same user always gets the
same variant (in another process too), each variant's share of many users lies within
binomial bounds of its weight, a weight of 0 is never chosen. The statistics are checked
against SciPy (``scipy.stats.mannwhitneyu``, ``scipy.stats.bootstrap``), on samples drawn
from known distributions, with and without ties.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

stats = pytest.importorskip("scipy.stats")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
USERS = [f"user-{i}" for i in range(4000)]


# -- assign_variant ------------------------------------------------------------------


def test_ex12_8_the_same_user_always_gets_the_same_variant(ex):
    weights = {"a": 1.0, "b": 1.0}
    first = [ex.assign_variant(u, weights) for u in USERS[:200]]
    again = [ex.assign_variant(u, dict(weights)) for u in USERS[:200]]
    assert first == again, "a user must see the same variant on every request: depend on the user (and salt) only"
    assert set(first) <= set(weights), f"assign_variant returned names that are not variants: {set(first) - set(weights)}"


def test_ex12_8_the_assignment_is_the_same_in_another_process(ex):
    """Python's hash() of a string changes between processes (PYTHONHASHSEED): the router may restart."""
    here = [ex.assign_variant(f"user-{i}", {"a": 1.0, "b": 1.0}) for i in range(50)]
    # the other process loads the same file (the learner's exercises.py, or the solutions) by its path
    code = ("import importlib.util, json, sys; "
            "spec = importlib.util.spec_from_file_location('ab_under_test', sys.argv[1]); "
            "ex = importlib.util.module_from_spec(spec); spec.loader.exec_module(ex); "
            "print(json.dumps([ex.assign_variant(f'user-{i}', {'a': 1.0, 'b': 1.0}) for i in range(50)]))")
    runs = []
    for seed in ("1", "2"):
        proc = subprocess.run([sys.executable, "-c", code, ex.__file__], cwd=ROOT, capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONHASHSEED": seed})
        assert proc.returncode == 0, proc.stderr[-2000:]
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1] == here, (
        "the same users got other variants in another process: Python's hash() of a str is salted per "
        "process (PYTHONHASHSEED); hash the user with hashlib (sha256, say) instead")


def binomial_bounds(n: int, p: float, z: float = 5.0) -> tuple[float, float]:
    """n p -+ z sqrt(n p (1 - p)): a count outside fails by chance with probability < 1e-6."""
    sd = math.sqrt(n * p * (1 - p))
    return n * p - z * sd, n * p + z * sd


@pytest.mark.parametrize("weights", [{"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 3.0}, {"x": 0.1, "y": 0.6, "z": 0.3}])
def test_ex12_8_each_variant_gets_its_share_of_the_users(ex, weights):
    counts = {k: 0 for k in weights}
    for u in USERS:
        counts[ex.assign_variant(u, weights)] += 1
    total = sum(weights.values())
    for k, w in weights.items():
        low, high = binomial_bounds(len(USERS), w / total)
        assert low <= counts[k] <= high, (
            f"with weights {weights}, variant {k!r} got {counts[k]} of {len(USERS)} users; its share "
            f"{w / total:.2f} makes about {len(USERS) * w / total:.0f} (between {low:.0f} and {high:.0f}). "
            "Map the hash to a number uniform in [0, 1) and pick the variant whose slice of [0, 1) "
            "(as wide as its weight over the sum) holds it")


def test_ex12_8_a_weight_of_zero_is_never_chosen(ex):
    weights = {"off": 0.0, "on": 1.0, "also_off": 0.0}
    chosen = {ex.assign_variant(u, weights) for u in USERS[:2000]}
    assert chosen == {"on"}, f"variants with weight 0 must never be chosen; got {sorted(chosen)}"


def test_ex12_8_another_salt_splits_the_users_anew(ex):
    weights = {"a": 1.0, "b": 1.0}
    same = sum(ex.assign_variant(u, weights, "exp-1") == ex.assign_variant(u, weights, "exp-2") for u in USERS)
    low, high = binomial_bounds(len(USERS), 0.5)
    assert low <= same <= high, (
        f"{same} of {len(USERS)} users got the same variant in two experiments with different salts; "
        f"independent splits agree for about half ({low:.0f}..{high:.0f}). Put the salt into what you hash")


@pytest.mark.parametrize("weights", [{"a": 0.0, "b": 0.0}, {"a": -1.0, "b": 2.0}, {}])
def test_ex12_8_bad_weights_raise_value_error(ex, weights):
    rule = "check the weights first: none negative, and a sum above 0 (an empty dict sums to 0)"
    try:
        got = ex.assign_variant("user-1", weights)
    except ValueError:
        return
    except Exception as e:  # noqa: BLE001 - the learner's mistake, named
        pytest.fail(f"assign_variant('user-1', {weights}) raised {type(e).__name__}: {e}; raise ValueError "
                    f"saying what is wrong with the weights: {rule}")
    pytest.fail(f"assign_variant('user-1', {weights}) returned {got!r}; bad weights raise ValueError: {rule}")


# -- mann_whitney_u ------------------------------------------------------------------


def samples():
    rng = np.random.default_rng(12)
    return {
        "two normals, shifted": (rng.normal(0, 1, 40), rng.normal(0.6, 1, 35)),
        "skewed latencies": (rng.lognormal(-2.0, 0.5, 60), rng.lognormal(-1.8, 0.5, 50)),
        "many ties (integers)": (rng.integers(0, 5, 30).astype(float), rng.integers(1, 6, 25).astype(float)),
        "the same distribution": (rng.exponential(1.0, 45), rng.exponential(1.0, 45)),
    }


def no_tie_p(u: float, n1: int, n2: int) -> float:
    """The p-value a forgotten tie correction gives (only to say what went wrong)."""
    z = (max(u, n1 * n2 - u) - n1 * n2 / 2 - 0.5) / math.sqrt(n1 * n2 * (n1 + n2 + 1) / 12)
    return min(1.0, math.erfc(z / math.sqrt(2)))


@pytest.mark.parametrize("case", list(samples()))
def test_ex12_8_mann_whitney_u_matches_scipy(ex, case):
    x, y = samples()[case]
    ref = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic", use_continuity=True)
    u, p = ex.mann_whitney_u(x.tolist(), y.tolist())
    n1, n2 = len(x), len(y)
    tol = 1e-9 * n1 * n2
    if abs(u - (n1 * n2 - ref.statistic)) <= tol and abs(u - ref.statistic) > tol:
        pytest.fail(f"{case}: your U ({u}) is the other sample's U: U of x counts pairs with x > y "
                    f"(R_x - n_x (n_x + 1) / 2), scipy's is {ref.statistic}")
    assert abs(u - ref.statistic) <= tol, (
        f"{case}: U = {u}, scipy.stats.mannwhitneyu says {ref.statistic}; tied values share the mean of their ranks")
    if not math.isclose(p, ref.pvalue, rel_tol=1e-6, abs_tol=1e-12):
        no_cc = stats.mannwhitneyu(x, y, method="asymptotic", use_continuity=False).pvalue
        hints = []
        if math.isclose(p, no_tie_p(ref.statistic, n1, n2), rel_tol=1e-6):
            hints.append("no tie correction: subtract sum(t^3 - t) / (n (n - 1)) inside the variance")
        if math.isclose(p, no_cc, rel_tol=1e-6):
            hints.append("no continuity correction: move |U - mean| half a step towards 0")
        if math.isclose(p, ref.pvalue / 2, rel_tol=1e-6):
            hints.append("a one-sided p: the two-sided p is twice the tail beyond |z|")
        pytest.fail(f"{case}: p = {p:.6g}, scipy.stats.mannwhitneyu(method='asymptotic') says {ref.pvalue:.6g}"
                    + (f" ({'; '.join(hints)})" if hints else ""))


def test_ex12_8_mann_whitney_tells_shifted_distributions_apart(ex):
    rng = np.random.default_rng(3)
    x, y = rng.normal(0, 1, 50), rng.normal(1.5, 1, 50)  # a shift of 1.5 sd: p far below 0.001
    _, p = ex.mann_whitney_u(x.tolist(), y.tolist())
    assert p < 1e-6, f"samples 1.5 standard deviations apart (50 each) gave p = {p:.3g}; expected p < 1e-6"


# -- bootstrap_diff_ci ---------------------------------------------------------------


def scipy_interval(a, b, confidence, n_resamples):
    res = stats.bootstrap((a, b), lambda a, b, axis=-1: np.mean(b, axis=axis) - np.mean(a, axis=axis),
                          confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                          vectorized=True, paired=False, random_state=np.random.default_rng(99))
    return res.confidence_interval.low, res.confidence_interval.high


@pytest.mark.parametrize("case", ["two normals", "skewed, unequal sizes"])
def test_ex12_8_bootstrap_ci_matches_scipy(ex, case):
    rng = np.random.default_rng(8)
    a, b = ((rng.normal(10, 2, 80), rng.normal(11, 2, 80)) if case == "two normals"
            else (rng.exponential(1.0, 120), rng.exponential(1.3, 60)))
    n = 20_000  # enough that the noise (tol below) is under half the gap to a 90% interval's ends
    low, high = ex.bootstrap_diff_ci(a.tolist(), b.tolist(), confidence=0.95, n_resamples=n, seed=1)
    ref_low, ref_high = scipy_interval(a, b, 0.95, n)
    # two Monte Carlo estimates of the same quantiles: each wanders by sqrt(q (1 - q) / n) / density
    # (density of a normal with the bootstrap's sd s at its 2.5% point: phi(1.96) / s); allow 5 of each
    s = math.sqrt(a.var() / a.size + b.var() / b.size)
    tol = 5 * math.sqrt(2) * math.sqrt(0.025 * 0.975 / n) / (math.exp(-1.96**2 / 2) / math.sqrt(2 * math.pi)) * s
    if abs(low + ref_high) <= tol and abs(high + ref_low) <= tol and abs(low - ref_low) > tol:
        pytest.fail(f"{case}: your interval ({low:.4g}, {high:.4g}) is of mean(a) - mean(b); the difference is "
                    f"B minus A, mean(b) - mean(a): scipy gives ({ref_low:.4g}, {ref_high:.4g})")
    assert abs(low - ref_low) <= tol and abs(high - ref_high) <= tol, (
        f"{case}: your 95% interval ({low:.4g}, {high:.4g}); scipy.stats.bootstrap's percentile interval "
        f"({ref_low:.4g}, {ref_high:.4g}), equal within {tol:.2g} (resampling noise). Resample each group "
        "separately, with replacement, to its own size, and take the 2.5% and 97.5% quantiles"
        + (" (yours is scipy's 90% interval: each tail gets (1 - confidence) / 2 = 2.5%, not 1 - confidence)"
           if all(abs(g - w) <= tol for g, w in zip((low, high), scipy_interval(a, b, 0.90, n))) else ""))


def test_ex12_8_bootstrap_ci_is_reproducible_and_narrows_with_confidence(ex):
    rng = np.random.default_rng(5)
    a, b = rng.normal(0, 1, 60).tolist(), rng.normal(0.3, 1, 60).tolist()
    assert ex.bootstrap_diff_ci(a, b, seed=7) == ex.bootstrap_diff_ci(a, b, seed=7), (
        "the same seed must give the same interval: draw with np.random.default_rng(seed)")
    lo95, hi95 = ex.bootstrap_diff_ci(a, b, confidence=0.95, seed=7)
    lo80, hi80 = ex.bootstrap_diff_ci(a, b, confidence=0.80, seed=7)
    assert lo95 < lo80 < hi80 < hi95, (
        f"an 80% interval ({lo80:.3g}, {hi80:.3g}) must lie inside the 95% one ({lo95:.3g}, {hi95:.3g}): "
        "the quantiles are (1 - confidence) / 2 and (1 + confidence) / 2")
