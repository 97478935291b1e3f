"""The statistics of a benchmark figure (appendix A.6) and of an A/B test (chapter 12, section 12.4).

One module for both, one implementation of each tool (assumptions stated where each is defined):

* :func:`finite_sample` checks a sample; :func:`resampled` is the bootstrap's one resampling
  (Efron & Tibshirani, *An Introduction to the Bootstrap*, ch. 13: resample with replacement,
  recompute the statistic), seeded so that the same data give the same interval;
* :func:`bootstrap_diff_ci` — the percentile CI of ``stat(B) - stat(A)`` (A/B, unpaired or paired);
  :func:`bootstrap_median_ci` — of one figure's median; :func:`compare_samples` — of the ratio of
  two runs' medians (``bench compare``);
* :func:`mann_whitney_u` — the rank-sum test for latencies and timings, whose long right tails make
  a t-test's normality a poor assumption: midranks, tie-corrected variance, continuity correction,
  two-sided; ``scipy.stats.mannwhitneyu(x, y, method="asymptotic")``'s statistic and p-value;
* :func:`sample_size_means` / :func:`sample_size_mann_whitney` — observations per group that detect
  ``effect`` at ``alpha`` and ``power``: ``n = 2 (z_{1-alpha/2} + z_{power})^2 sd^2 / effect^2``
  (paired: without the 2), over the rank test's efficiency 3/pi (Lehmann, *Nonparametrics*, ch. 2);
  :func:`repetitions_for` — repetitions for a wanted precision of a figure;
* a benchmark figure (:class:`Figure`) is the **median** of its repetitions (timings on a shared
  machine have a long right tail), its 95% bootstrap interval and its coefficient of variation,
  marked noisy above :data:`NOISY_CV`;
* :func:`compare` runs the A/B tools on two samples and says what the data support, including
  "not enough data" when that is the truth.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist

import numpy as np

#: a figure whose repetitions vary more than this (standard deviation / mean) is marked noisy
NOISY_CV = 0.10
#: the fewest repetitions a figure is reported from
MIN_REPETITIONS = 5
#: below this many observations per group the normal approximation of U (and a bootstrap) says little
MIN_N = 8
_N = NormalDist()
#: a statistic of a sample: a NumPy reduction taking ``axis`` (``np.mean``, ``np.median``), so that
#: the bootstrap computes it over all resamples at once, row by row
Reduction = Callable[..., np.ndarray]


def finite_sample(x: Sequence[float] | np.ndarray, what: str, kind: str = "observations") -> np.ndarray:
    """``x`` as a float64 array [n], n >= 1, every value finite; else a ValueError naming ``what``
    and counting the ``kind`` (observations, repetitions) at fault."""
    a = np.asarray(x, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"{what}: empty, no {kind}")
    if not np.isfinite(a).all():
        raise ValueError(f"{what}: {int((~np.isfinite(a)).sum())} {kind} are NaN or infinite")
    return a


def resample_rows(n: int, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """The bootstrap's resamples of ``n`` observations: indices [n_resamples, n], drawn with
    replacement (one row per resample; pairs index both of their samples with the same row)."""
    return rng.integers(0, n, size=(n_resamples, n))


def resampled(x: np.ndarray, stat: Reduction, n_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """``stat`` of each of ``n_resamples`` resamples of ``x`` [n]: [n_resamples]."""
    return stat(x[resample_rows(x.size, n_resamples, rng)], axis=1)


@dataclass(frozen=True)
class Interval:
    """A point estimate of ``stat(B) - stat(A)`` and its bootstrap confidence interval."""

    estimate: float
    low: float
    high: float
    confidence: float

    @property
    def excludes_zero(self) -> bool:
        return self.low > 0 or self.high < 0


def bootstrap_diff_ci(a: Sequence[float], b: Sequence[float], *, stat: Reduction = np.mean,
                      paired: bool = False, confidence: float = 0.95, n_resamples: int = 2000,
                      seed: int = 0) -> Interval:
    """Percentile bootstrap CI of ``stat(b) - stat(a)``.

    ``a``: [n_a], ``b``: [n_b] observations. ``paired``: ``a[i]`` and ``b[i]`` belong
    together (the same token scored by both models), n_a == n_b, and the pairs are
    resampled together (for the mean, that is the mean of the differences). ``stat``
    is a :data:`Reduction` (``np.mean``, ``np.median``).
    """
    a, b = finite_sample(a, "a"), finite_sample(b, "b")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    if n_resamples < 100:
        raise ValueError(f"n_resamples must be at least 100, got {n_resamples}")
    rng = np.random.default_rng(seed)
    if paired:
        if a.size != b.size:
            raise ValueError(f"paired samples must have the same length, got {a.size} and {b.size}")
        estimate = float(stat(b) - stat(a))
        idx = resample_rows(a.size, n_resamples, rng)
        diffs = stat(b[idx], axis=1) - stat(a[idx], axis=1)
    else:
        estimate = float(stat(b) - stat(a))
        sa = resampled(a, stat, n_resamples, rng)  # A's resamples drawn first, then B's
        sb = resampled(b, stat, n_resamples, rng)
        diffs = sb - sa
    tail = (1 - confidence) / 2
    low, high = np.quantile(diffs, [tail, 1 - tail])
    return Interval(estimate, float(low), float(high), confidence)


def bootstrap_median_ci(samples: Sequence[float], confidence: float = 0.95, n_resamples: int = 4000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``samples`` (seeded: the same data give the
    same interval)."""
    a = finite_sample(samples, "bootstrap", "repetitions")
    if a.size == 1:
        return float(a[0]), float(a[0])
    medians = resampled(a, np.median, n_resamples, np.random.default_rng(seed))
    tail = (1 - confidence) / 2
    return float(np.quantile(medians, tail)), float(np.quantile(medians, 1 - tail))


@dataclass(frozen=True)
class MannWhitney:
    """``u``: the U statistic of the first sample (how many pairs (x, y) have x > y, ties
    counting 1/2); ``p_value``: two-sided; ``z``: the standardised statistic;
    ``effect``: u / (n_x n_y), the probability that an x exceeds a y (0.5: no difference)."""

    u: float
    p_value: float
    z: float
    effect: float


def midranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n of ``values`` [n], tied values sharing the mean of their ranks; and the size of
    each group of ties [groups]."""
    order = np.argsort(values, kind="mergesort")
    sorted_v = values[order]
    starts = np.flatnonzero(np.r_[True, sorted_v[1:] != sorted_v[:-1]])
    sizes = np.diff(np.r_[starts, values.size])
    mean_rank = starts + (sizes + 1) / 2  # ranks start + 1 .. start + size
    ranks = np.empty(values.size)
    ranks[order] = np.repeat(mean_rank, sizes)
    return ranks, sizes


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test of ``x`` [n_x] against ``y`` [n_y] (normal approximation,
    tie-corrected variance, continuity correction). All values tied: no evidence, p = 1."""
    x, y = finite_sample(x, "x"), finite_sample(y, "y")
    n1, n2 = x.size, y.size
    ranks, ties = midranks(np.concatenate([x, y]))
    u1 = float(ranks[:n1].sum() - n1 * (n1 + 1) / 2)
    n = n1 + n2
    mu = n1 * n2 / 2
    tie_term = float((ties.astype(np.float64) ** 3 - ties).sum())
    var = n1 * n2 / 12 * ((n + 1) - tie_term / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return MannWhitney(u1, 1.0, 0.0, u1 / (n1 * n2))
    # the larger of U1 and U2 = n1 n2 - U1, moved half a step towards the mean
    z = (max(u1, n1 * n2 - u1) - mu - 0.5) / math.sqrt(var)
    p = min(1.0, max(0.0, 2 * (1 - _N.cdf(z))))
    return MannWhitney(u1, p, z, u1 / (n1 * n2))


def _z(alpha: float, power: float) -> float:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be between 0 and 1, got {alpha}")
    if not 0 < power < 1:
        raise ValueError(f"power must be between 0 and 1, got {power}")
    return _N.inv_cdf(1 - alpha / 2) + _N.inv_cdf(power)


def sample_size_means(sd: float, effect: float, alpha: float = 0.05, power: float = 0.8,
                      paired: bool = False) -> int:
    """Observations per group to detect a difference of means ``effect`` (same units as ``sd``)
    with a two-sided test at ``alpha`` and ``power`` (normal approximation). ``paired``: the
    number of pairs, ``sd`` being the differences' standard deviation."""
    if not (effect > 0 and math.isfinite(effect)):
        raise ValueError(f"effect must be a positive number, got {effect}")
    if not (sd >= 0 and math.isfinite(sd)):
        raise ValueError(f"sd must be a finite number >= 0, got {sd}")
    groups = 1 if paired else 2
    return max(2, math.ceil(groups * (_z(alpha, power) * sd / effect) ** 2))


def sample_size_mann_whitney(sd: float, effect: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """:func:`sample_size_means` over the rank test's efficiency 3/pi (normal data; for heavier
    tails than the normal the rank test needs fewer, so this errs on the safe side there)."""
    return math.ceil(sample_size_means(sd, effect, alpha, power) / (3 / math.pi))


def repetitions_for(samples: Sequence[float], precision: float, confidence: float = 0.95) -> int:
    """Repetitions needed for the mean's ``confidence`` interval to be within ±``precision`` of
    it (a fraction: 0.02 is ±2%), from the coefficient of variation of ``samples``:
    ``n = (z · cv / precision)²`` (normal approximation; at least 2)."""
    if not precision > 0:
        raise ValueError(f"precision must be > 0 (a fraction of the figure), got {precision}")
    z = _N.inv_cdf(0.5 + confidence / 2)
    return max(2, math.ceil((z * coefficient_of_variation(samples) / precision) ** 2))


def coefficient_of_variation(samples: Sequence[float]) -> float:
    """Sample standard deviation over the mean (0 for one repetition)."""
    a = finite_sample(samples, "coefficient of variation", "repetitions")
    if a.size < 2 or a.mean() == 0:
        return 0.0
    return float(a.std(ddof=1) / abs(a.mean()))


@dataclass(frozen=True)
class Figure:
    """One benchmark figure: what it is, its repetitions and their summary.

    ``key``: a stable identifier (``"speed.tg128.numba"``) that :func:`compare_samples`
    matches between two result files; ``higher_is_better``: tokens/s yes, latency no.
    """

    key: str
    title: str
    unit: str
    samples: tuple[float, ...]
    higher_is_better: bool = True
    median: float = 0.0
    ci_low: float = 0.0
    ci_high: float = 0.0
    cv: float = 0.0
    noisy: bool = False

    @classmethod
    def of(cls, key: str, title: str, unit: str, samples: Sequence[float], higher_is_better: bool = True) -> Figure:
        a = finite_sample(samples, key, "repetitions")
        low, high = bootstrap_median_ci(a)
        cv = coefficient_of_variation(a)
        return cls(key, title, unit, tuple(float(x) for x in a), higher_is_better, float(np.median(a)), low, high,
                   cv, cv > NOISY_CV)

    def to_json(self) -> dict:
        d = asdict(self)
        d["samples"] = list(self.samples)
        return d

    @classmethod
    def from_json(cls, d: dict) -> Figure:
        return cls(**{**d, "samples": tuple(d["samples"])})


@dataclass(frozen=True)
class Change:
    """One figure in two runs: NEW's median over OLD's, its interval, and what the test says."""

    key: str
    ratio: float
    ci_low: float
    ci_high: float
    p_value: float
    significant: bool
    better: bool | None  # None when not significant

    def to_json(self) -> dict:
        return asdict(self)


def compare_samples(old: Figure, new: Figure, alpha: float = 0.05, n_resamples: int = 4000, seed: int = 0) -> Change:
    """``median(new) / median(old)`` with a bootstrap 95% interval (each run resampled on its own),
    and the two-sided Mann-Whitney U test of the repetitions at level ``alpha``."""
    a, b = finite_sample(old.samples, old.key, "repetitions"), finite_sample(new.samples, new.key, "repetitions")
    rng = np.random.default_rng(seed)
    ma = resampled(a, np.median, n_resamples, rng)
    mb = resampled(b, np.median, n_resamples, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = mb / ma
    ratios = ratios[np.isfinite(ratios)]
    ratio = float(np.median(b) / np.median(a)) if np.median(a) else math.inf
    low, high = (float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))) if ratios.size else (ratio, ratio)
    p = mann_whitney_u(a, b).p_value if a.size >= 2 and b.size >= 2 else 1.0
    significant = p < alpha
    better = None if not significant else (ratio > 1) == new.higher_is_better
    return Change(new.key, ratio, low, high, float(p), significant, better)


@dataclass(frozen=True)
class Comparison:
    """What two samples say about ``B - A``: see :func:`compare`."""

    metric: str
    n_a: int
    n_b: int
    a: float  # stat of A
    b: float  # stat of B
    difference: Interval | None
    p_value: float | None
    test: str
    effect_of_interest: float
    n_needed: int | None
    verdict: str  # "B higher", "B lower", "no difference", "not enough data"
    reason: str

    def as_dict(self) -> dict:
        d = asdict(self)
        return d


def compare(metric: str, a: Sequence[float], b: Sequence[float], *, effect_of_interest: float,
            paired: bool = False, stat: Reduction = np.median, alpha: float = 0.05,
            power: float = 0.8, seed: int = 0) -> Comparison:
    """Compare ``b`` with ``a`` on ``metric``: the bootstrap CI of ``stat(b) - stat(a)`` at
    1 - ``alpha``, a p-value (Mann-Whitney U unpaired; the bootstrap's unpaired p is not
    reported, ``paired`` gives the paired CI only), and the sample size that would detect
    ``effect_of_interest`` (in the metric's units).

    The verdict: "B higher"/"B lower" when the CI excludes 0 and, unpaired, p < alpha;
    "not enough data" below :data:`MIN_N` per group, when the CI and the U test disagree,
    or when neither finds a difference with fewer observations than it takes to detect
    ``effect_of_interest``; otherwise "no difference" (none as large as the effect of
    interest, with the power asked for).
    """
    a_, b_ = finite_sample(a, f"{metric} of A"), finite_sample(b, f"{metric} of B")
    n_a, n_b = a_.size, b_.size
    stat_a, stat_b = float(stat(a_)), float(stat(b_))
    if min(n_a, n_b) < MIN_N:
        return Comparison(metric, n_a, n_b, stat_a, stat_b, None, None, "none", effect_of_interest, None,
                          "not enough data", f"{min(n_a, n_b)} observations in the smaller group; "
                          f"the tests need at least {MIN_N}")
    ci = bootstrap_diff_ci(a_, b_, stat=stat, paired=paired, confidence=1 - alpha, seed=seed)
    if paired:
        p, test = None, f"paired bootstrap of the {stat.__name__} difference"
        n_needed = sample_size_means(float(np.std(b_ - a_, ddof=1)), effect_of_interest, alpha, power, paired=True)
        have = n_a
    else:
        mw = mann_whitney_u(b_, a_)
        p, test = mw.p_value, f"Mann-Whitney U (two-sided) and bootstrap CI of the {stat.__name__} difference"
        sd = math.sqrt((np.var(a_, ddof=1) + np.var(b_, ddof=1)) / 2)
        n_needed = sample_size_mann_whitney(sd, effect_of_interest, alpha, power)
        have = min(n_a, n_b)
    significant = ci.excludes_zero and (p is None or p < alpha)
    if significant:
        verdict = "B higher" if ci.estimate > 0 else "B lower"
        reason = f"the {ci.confidence:.0%} CI of B - A, [{ci.low:.4g}, {ci.high:.4g}], excludes 0"
        if p is not None:
            reason += f"; p = {p:.3g}"
    elif ci.excludes_zero or (p is not None and p < alpha):
        verdict = "not enough data"
        reason = (f"the tests disagree: the CI [{ci.low:.4g}, {ci.high:.4g}] "
                  f"{'excludes' if ci.excludes_zero else 'holds'} 0, Mann-Whitney p = {p:.3g}; "
                  f"about {n_needed} per group (have {have}) would detect {effect_of_interest:.4g}")
    elif have < n_needed:
        verdict = "not enough data"
        reason = (f"no significant difference with {have} per group; detecting a difference of "
                  f"{effect_of_interest:.4g} needs about {n_needed}")
    else:
        verdict = "no difference"
        reason = (f"the CI [{ci.low:.4g}, {ci.high:.4g}] holds 0 with {have} per group, enough to detect "
                  f"{effect_of_interest:.4g} with power {power:.0%}")
    return Comparison(metric, n_a, n_b, stat_a, stat_b, ci, p, test, effect_of_interest, n_needed, verdict, reason)


__all__ = ["MIN_N", "MIN_REPETITIONS", "NOISY_CV", "Change", "Comparison", "Figure", "Interval", "MannWhitney",
           "bootstrap_diff_ci", "bootstrap_median_ci", "coefficient_of_variation", "compare", "compare_samples",
           "finite_sample", "mann_whitney_u", "midranks", "repetitions_for", "resample_rows", "resampled", "sample_size_mann_whitney",
           "sample_size_means"]
