"""Chapter 12 — Production Deployment and Monitoring: your exercises.

Exercise 12.6  Deploying with Docker            (ch12_production.ipynb, section 12.6)
Exercise 12.7  Setting Up Prometheus Metrics    (ch12_production.ipynb, section 12.7)
Exercise 12.8  A/B Testing Pipeline             (ch12_production.ipynb, section 12.8)

Check your work with ``make test-chapter 12`` (or ``make test-exercise E=12.8``).
"""

from __future__ import annotations

# each exercise's region adds its names
__all__: list[str] = []

# -- Exercise 12.6: deploying with Docker -------------------------------------------
# (section 12.6)
#
# The container's entrypoint reads its configuration from environment variables and stops at once,
# naming each variable at fault, when one is wrong. What you get (llmrs_core.ops.entrypoint):
#
#   ServeSettings(model: Path, host: str, port: int, threads: int | None, backend: str)
#   ServeEnvironmentError(problems: list[str])   a ValueError; one sentence per problem, each
#                                                starting with the variable's name
#   BACKENDS        the engine's backend names;  GGUF_MAGIC = b"GGUF" (a GGUF file's first bytes)
#   DEFAULT_MODEL, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_BACKEND   what an unset variable means
#
# chapters/ch12_production/Dockerfile runs your function in the project's image
# (`make container-test-learner`).

from collections.abc import Mapping  # noqa: E402
from pathlib import Path  # noqa: E402, F401

from llmrs_core.backends import BACKENDS, DEFAULT_BACKEND  # noqa: E402, F401
from llmrs_core.formats.gguf import GGUF_MAGIC  # noqa: E402, F401
from llmrs_core.ops.entrypoint import (  # noqa: E402, F401
    DEFAULT_HOST,
    DEFAULT_MODEL,
    DEFAULT_PORT,
    ServeEnvironmentError,
    ServeSettings,
)

__all__ += ["check_serve_environment"]


def check_serve_environment(env: Mapping[str, str], cpu_count: int | None = None) -> ServeSettings:
    """The settings the container's environment ``env`` asks for, or every problem in it at once.

    ``LLMRS_MODEL``: an existing file whose first four bytes are ``GGUF_MAGIC`` (default
    ``DEFAULT_MODEL``); ``LLMRS_HOST``: not empty (default ``DEFAULT_HOST``); ``LLMRS_PORT``: a
    decimal integer in 1..65535 (default ``DEFAULT_PORT``); ``LLMRS_THREADS``: unset or empty (every
    core: ``threads=None``) or a decimal integer from 1 to ``cpu_count`` (default: the cores this
    process may use, ``len(os.sched_getaffinity(0))``); ``LLMRS_BACKEND``: one of ``BACKENDS``
    (default ``DEFAULT_BACKEND``). Raise ``ServeEnvironmentError`` with one message per variable at
    fault, each starting with the variable's name, after checking them all.
    """
    raise NotImplementedError(
        "Exercise 12.6 `check_serve_environment`: not implemented yet — see ch12_production.ipynb §12.6"
    )


# -- Exercise 12.7: setting up Prometheus metrics -----------------------------------
# (section 12.7)
#
# The server hands each request that finished (with "stop" or "length") to your
# record_finished_request, once (ServerMetrics.record_at_finish). What you get:
#
#   metrics: RequestMetricSet   prometheus_client series with their labels applied:
#       prompt_tokens, generation_tokens                    counters: .inc(n)
#       time_to_first_token, inter_token_latency,           histograms, in seconds: .observe(s)
#       e2e_request_latency, request_queue_time, request_prefill_time, request_decode_time
#       request_prompt_tokens, request_generation_tokens    histograms of counts: .observe(n)
#   timing: RequestMetrics      the engine's clock readings, time.perf_counter() seconds:
#       arrival_time, scheduled_time, first_token_time, finished_time, token_times (one per
#       SAMPLED token: an end-of-turn token that ended the request is in it, and not in the
#       output); properties ttft, itl (list of gaps), e2e, queue_time, prefill_time, decode_time
#
# vLLM's definitions: TTFT = first token - arrival; inter-token latency = each gap between
# consecutive tokens; queue = arrival to the first step that ran it; prefill = that step to the
# first token; decode = first token to last token; e2e = arrival to finish.

from collections.abc import Sequence  # noqa: E402

from llmrs_core.engine.engine import RequestMetrics  # noqa: E402
from llmrs_core.server.metrics import RequestMetricSet  # noqa: E402

__all__ += ["le_buckets", "record_finished_request"]


def record_finished_request(metrics: RequestMetricSet, timing: RequestMetrics, prompt_tokens: int,
                            output_token_ids: Sequence[int]) -> None:
    """Record one finished request into ``metrics``: both token counters, TTFT, every inter-token
    gap, e2e, queue, prefill and decode times (seconds), and the prompt and output lengths.
    ``output_token_ids``: the tokens the client got (its usage's ``completion_tokens``)."""
    raise NotImplementedError(
        "Exercise 12.7 `record_finished_request`: not implemented yet — see ch12_production.ipynb §12.7"
    )


def le_buckets(bounds: Sequence[float], values: Sequence[float]) -> list[tuple[float, int]]:
    """A Prometheus histogram's buckets for ``values``: ``[(le, count), ...]``, one per bound of the
    increasing ``bounds`` and a last one with ``le = float("inf")``, where ``count`` is how many values
    are less than or equal to ``le`` (so the counts never decrease, and the last is ``len(values)``)."""
    raise NotImplementedError(
        "Exercise 12.7 `le_buckets`: not implemented yet — see ch12_production.ipynb §12.7"
    )


# -- Exercise 12.8: an A/B testing pipeline -----------------------------------------
# (section 12.8)

__all__ += ["assign_variant", "bootstrap_diff_ci", "mann_whitney_u"]


def assign_variant(user: str, weights: dict[str, float], salt: str = "") -> str:
    """The variant (a key of ``weights``) that ``user`` sees: weighted and sticky.

    Sticky: the answer depends on ``user`` and ``salt`` only, and is the same in every
    process (so not Python's ``hash()``, which changes with ``PYTHONHASHSEED``).
    Weighted: over many users, variant ``k`` gets a share ``weights[k] / sum(weights)``;
    a weight of 0 is never chosen. Weights that are negative, or that sum to 0, raise
    ``ValueError``. A different ``salt`` splits the same users independently.
    """
    raise NotImplementedError(
        "Exercise 12.8 `assign_variant`: not implemented yet — see ch12_production.ipynb §12.8"
    )


def mann_whitney_u(x: list[float], y: list[float]) -> tuple[float, float]:
    """``(U, p)``: the Mann-Whitney U statistic of ``x`` [n_x] against ``y`` [n_y], and its two-sided p-value.

    U counts the pairs (x_i, y_j) with x_i > y_j, a tie counting 1/2 (equivalently
    R_x - n_x (n_x + 1) / 2, R_x the sum of x's ranks in the pooled sample, ties
    given the mean of their ranks). The p-value: the normal approximation, mean
    n_x n_y / 2, variance n_x n_y / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1))) over the
    groups of t tied values, and a continuity correction of 1/2 towards the mean.
    """
    raise NotImplementedError(
        "Exercise 12.8 `mann_whitney_u`: not implemented yet — see ch12_production.ipynb §12.8"
    )


def bootstrap_diff_ci(a: list[float], b: list[float], confidence: float = 0.95, n_resamples: int = 2000,
                      seed: int = 0) -> tuple[float, float]:
    """``(low, high)``: a percentile bootstrap confidence interval of ``mean(b) - mean(a)``.

    ``a`` [n_a] and ``b`` [n_b] are independent samples. Each of ``n_resamples`` rounds
    draws n_a values from ``a`` and n_b from ``b`` with replacement and records the
    difference of their means; the interval is that distribution's (1 - confidence) / 2
    and (1 + confidence) / 2 quantiles. Use ``np.random.default_rng(seed)``.
    """
    raise NotImplementedError(
        "Exercise 12.8 `bootstrap_diff_ci`: not implemented yet — see ch12_production.ipynb §12.8"
    )
