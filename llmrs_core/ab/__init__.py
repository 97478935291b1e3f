"""A/B testing of model variants (chapter 12, section 12.4; Exercise 12.8).

One idea per module:

* :mod:`.assign` — weighted, sticky assignment of a request's ``user`` to a variant (a hash);
* :mod:`.variants` — the variants as the command line names them (``NAME=MODEL[:backend][@weight]``);
* :mod:`.record` — the router's request log: one JSON line per request (TTFT, TPOT, tokens);
* :mod:`.metrics` — the router's Prometheus metrics, with a ``variant`` label;
* :mod:`.quality` — offline quality of a variant: log-likelihood of a held-out text, greedy
  agreement with the transformers goldens;
* :mod:`.load` — a small load of users through the router, to fill its request log;
* :mod:`.report` — ``llmrs ab report``: quality, latency and cost of the variants, decided;
* :mod:`.launch` — ``llmrs ab serve``: one ``llmrs serve`` per variant, and the router;
* :mod:`.router` — the A/B router itself (it needs the ``serve`` extra).

The statistics (bootstrap CI of a difference, Mann-Whitney U, sample sizes, the verdict) are
:mod:`llmrs_core.bench.stats`, one module for the benchmarks and the A/B test.
"""

from ..bench.stats import (
    Comparison,
    Interval,
    MannWhitney,
    bootstrap_diff_ci,
    compare,
    mann_whitney_u,
    sample_size_means,
)
from .assign import check_weights, user_bucket, user_hash  # (the function assign: from .assign import assign)

__all__ = [
    "Comparison",
    "Interval",
    "MannWhitney",
    "bootstrap_diff_ci",
    "check_weights",
    "compare",
    "mann_whitney_u",
    "sample_size_means",
    "user_bucket",
    "user_hash",
]
