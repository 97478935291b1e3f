"""Chapter 12 solutions: the engine's production pieces (llmrs_core.server, llmrs_core.ab, llmrs_core.cost)."""

from __future__ import annotations

# each exercise's region adds its names
__all__: list[str] = []

# -- Exercise 12.6 ----------------------------------------------------------------------

from llmrs_core.ops.entrypoint import check_serve_environment  # noqa: E402

__all__ += ["check_serve_environment"]

# -- Exercise 12.7 ----------------------------------------------------------------------

from collections.abc import Sequence  # noqa: E402

from llmrs_core.server.metrics import record_finished_request  # noqa: E402

__all__ += ["le_buckets", "record_finished_request"]


def le_buckets(bounds: Sequence[float], values: Sequence[float]) -> list[tuple[float, int]]:
    """A Prometheus histogram's cumulative ``le`` buckets for ``values`` (the exposition's
    ``_bucket`` lines; ``prometheus_client`` computes them inside ``Histogram``, so this exists to teach)."""
    ordered = sorted(values)
    out, i = [], 0
    for le in [*bounds, float("inf")]:
        while i < len(ordered) and ordered[i] <= le:
            i += 1
        out.append((float(le), i))
    return out


# -- Exercise 12.8 ----------------------------------------------------------------------

from llmrs_core.ab.assign import assign as _assign  # noqa: E402
from llmrs_core.bench.stats import bootstrap_diff_ci as _bootstrap_diff_ci  # noqa: E402
from llmrs_core.bench.stats import mann_whitney_u as _mann_whitney_u  # noqa: E402

__all__ += ["assign_variant", "bootstrap_diff_ci", "mann_whitney_u"]


def assign_variant(user: str, weights: dict[str, float], salt: str = "") -> str:
    return _assign(user, weights, salt)


def mann_whitney_u(x: list[float], y: list[float]) -> tuple[float, float]:
    result = _mann_whitney_u(x, y)
    return result.u, result.p_value


def bootstrap_diff_ci(a: list[float], b: list[float], confidence: float = 0.95, n_resamples: int = 2000,
                      seed: int = 0) -> tuple[float, float]:
    ci = _bootstrap_diff_ci(a, b, confidence=confidence, n_resamples=n_resamples, seed=seed)
    return ci.low, ci.high
