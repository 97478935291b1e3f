"""Chapter 12 solutions: the engine's production pieces (llmrs_core.server, llmrs_core.ab, llmrs_core.cost)."""

from __future__ import annotations

# each exercise's region adds its names
__all__: list[str] = []

# -- Exercise 12.6 ----------------------------------------------------------------------

from llmrs_core.server.entrypoint import check_serve_environment  # noqa: E402

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
