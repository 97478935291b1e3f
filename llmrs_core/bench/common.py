"""What the benchmarks share: the repetition timer, random prompt ids, percentiles."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np


def timings(fn: Callable[[], None], repetitions: int, warm_up: bool = True) -> list[float]:
    """Seconds taken by each of ``repetitions`` calls of ``fn`` (after one untimed call)."""
    if warm_up:
        fn()
    times = []
    for _ in range(repetitions):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def random_ids(rng: np.random.Generator, vocab_size: int, n: int) -> list[int]:
    """``n`` random token ids, away from the special tokens at the start of most vocabularies."""
    margin = min(100, vocab_size // 4)
    return rng.integers(margin, vocab_size - margin, n).tolist()


def percentiles(values: list[float]) -> dict[str, float]:
    """Mean, median and 99th percentile of ``values`` (all 0.0 when there are none)."""
    if not values:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    a = np.asarray(values)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99))}
