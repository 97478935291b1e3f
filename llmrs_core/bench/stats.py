"""The statistics of a benchmark figure (appendix A.6): a median, its bootstrap interval, its noise.

A benchmark repeats a measurement and reports one figure. Which one, and how sure:

* the **median** of the repetitions, not the mean: timings on a shared machine
  have a long right tail (a repetition that lost its core for 50 ms), and the
  median ignores a few of those;
* its **95% confidence interval** by the percentile bootstrap (resample the
  repetitions with replacement, take the median of each resample, read the 2.5th
  and 97.5th percentiles): no shape assumed for the distribution. With 5
  repetitions the interval is wide, honestly so;
* the **coefficient of variation** (standard deviation over mean): above
  :data:`NOISY_CV` the report marks the figure "noisy" instead of hiding it;
* for two runs of one figure, :func:`compare_samples`: the ratio of medians with a
  bootstrap interval, and whether the change is significant by the Mann-Whitney U
  test (:func:`llmrs_core.ab.stats.mann_whitney_u`, the rank test chapter 12's A/B
  testing uses: latencies are not normal).
* :func:`repetitions_for` — how many repetitions a wanted precision needs, from the
  variance measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..ab.stats import mann_whitney_u

#: a figure whose repetitions vary more than this (standard deviation / mean) is marked noisy
NOISY_CV = 0.10
#: the fewest repetitions a figure is reported from
MIN_REPETITIONS = 5


def _values(samples: Sequence[float], what: str) -> np.ndarray:
    a = np.asarray(samples, dtype=np.float64).ravel()
    if a.size == 0:
        raise ValueError(f"{what}: no repetitions to summarise")
    if not np.isfinite(a).all():
        raise ValueError(f"{what}: {int((~np.isfinite(a)).sum())} repetitions are NaN or infinite")
    return a


def bootstrap_median_ci(samples: Sequence[float], confidence: float = 0.95, n_resamples: int = 4000,
                        seed: int = 0) -> tuple[float, float]:
    """Percentile-bootstrap interval of the median of ``samples`` (seeded: the same data give the
    same interval)."""
    a = _values(samples, "bootstrap")
    if a.size == 1:
        return float(a[0]), float(a[0])
    rng = np.random.default_rng(seed)
    medians = np.median(a[rng.integers(0, a.size, (n_resamples, a.size))], axis=1)
    tail = (1 - confidence) / 2
    return float(np.quantile(medians, tail)), float(np.quantile(medians, 1 - tail))


def coefficient_of_variation(samples: Sequence[float]) -> float:
    """Sample standard deviation over the mean (0 for one repetition)."""
    a = _values(samples, "coefficient of variation")
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
        a = _values(samples, key)
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
    a, b = _values(old.samples, old.key), _values(new.samples, new.key)
    rng = np.random.default_rng(seed)
    ma = np.median(a[rng.integers(0, a.size, (n_resamples, a.size))], axis=1)
    mb = np.median(b[rng.integers(0, b.size, (n_resamples, b.size))], axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = mb / ma
    ratios = ratios[np.isfinite(ratios)]
    ratio = float(np.median(b) / np.median(a)) if np.median(a) else math.inf
    low, high = (float(np.quantile(ratios, 0.025)), float(np.quantile(ratios, 0.975))) if ratios.size else (ratio, ratio)
    p = mann_whitney_u(a, b).p_value if a.size >= 2 and b.size >= 2 else 1.0
    significant = p < alpha
    better = None if not significant else (ratio > 1) == new.higher_is_better
    return Change(new.key, ratio, low, high, float(p), significant, better)


def repetitions_for(samples: Sequence[float], precision: float, confidence: float = 0.95) -> int:
    """Repetitions needed for the mean's ``confidence`` interval to be within ±``precision`` of
    it (a fraction: 0.02 is ±2%), from the coefficient of variation of ``samples``:
    ``n = (z · cv / precision)²`` (normal approximation; at least 2)."""
    if not precision > 0:
        raise ValueError(f"precision must be > 0 (a fraction of the figure), got {precision}")
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    return max(2, math.ceil((z * coefficient_of_variation(samples) / precision) ** 2))


__all__ = ["MIN_REPETITIONS", "NOISY_CV", "Change", "Figure", "bootstrap_median_ci", "coefficient_of_variation",
           "compare_samples", "repetitions_for"]
