"""The router's Prometheus metrics (chapter 12, section 12.4): every series has a ``variant`` label.

==========================================  =========  =============================================
``llmrs:ab_requests_total``                 counter    proxied requests, by ``variant`` and ``status``
``llmrs:ab_request_errors_total``           counter    failed ones, by ``variant`` and ``reason``
                                                       (``upstream_unavailable``, ``upstream_timeout``,
                                                       ``upstream_broke``, ``http_4xx``/``http_5xx``)
``llmrs:ab_prompt_tokens_total``            counter    the upstreams' reported prompt tokens
``llmrs:ab_generation_tokens_total``        counter    their reported completion tokens
``llmrs:ab_time_to_first_token_seconds``    histogram  arrival at the router to the first content
``llmrs:ab_time_per_output_token_seconds``  histogram  vLLM's TPOT, streamed answers of 2+ tokens
``llmrs:ab_e2e_request_latency_seconds``    histogram  arrival to the last byte
``llmrs:ab_variant_weight``                 gauge      each variant's configured weight
==========================================  =========  =============================================

The ``ab_`` prefix keeps them apart from the variants' own servers' metrics
(``llmrs:time_to_first_token_seconds{model_name}``) when one Prometheus scrapes
them all. Buckets are vLLM's (:mod:`llmrs_core.server.metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..server.metrics import ITL_BUCKETS, REQUEST_LATENCY_BUCKETS, TTFT_BUCKETS
from .record import RequestRecord


class RouterMetrics:
    """The router's metrics in their own registry; ``render()`` is the ``/metrics`` body."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, weights: Mapping[str, float]):
        self.registry = r = CollectorRegistry()
        v = ["variant"]
        self.requests = Counter("llmrs:ab_requests", "Proxied requests.", [*v, "status"], registry=r)
        self.errors = Counter("llmrs:ab_request_errors", "Failed requests.", [*v, "reason"], registry=r)
        self.prompt_tokens = Counter("llmrs:ab_prompt_tokens", "Prompt tokens reported.", v, registry=r)
        self.generation_tokens = Counter("llmrs:ab_generation_tokens", "Completion tokens reported.", v, registry=r)
        self.ttft = Histogram("llmrs:ab_time_to_first_token_seconds", "Time to first token at the router.", v,
                              buckets=TTFT_BUCKETS, registry=r)
        self.tpot = Histogram("llmrs:ab_time_per_output_token_seconds", "Time per output token after the first.",
                              v, buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("llmrs:ab_e2e_request_latency_seconds", "Arrival to the last byte.", v,
                             buckets=REQUEST_LATENCY_BUCKETS, registry=r)
        weight = Gauge("llmrs:ab_variant_weight", "Configured weight of each variant.", v, registry=r)
        for name, w in weights.items():
            weight.labels(variant=name).set(w)
            self.requests.labels(variant=name, status="200")  # every variant's series exists from the start

    def observe(self, rec: RequestRecord, error_reason: str | None = None) -> None:
        v = rec.variant
        self.requests.labels(variant=v, status=str(rec.status)).inc()
        if error_reason is not None:
            self.errors.labels(variant=v, reason=error_reason).inc()
        if rec.prompt_tokens:
            self.prompt_tokens.labels(variant=v).inc(rec.prompt_tokens)
        if rec.completion_tokens:
            self.generation_tokens.labels(variant=v).inc(rec.completion_tokens)
        if rec.ttft_s is not None:
            self.ttft.labels(variant=v).observe(rec.ttft_s)
        if rec.tpot_s is not None:
            self.tpot.labels(variant=v).observe(rec.tpot_s)
        if rec.e2e_s is not None:
            self.e2e.labels(variant=v).observe(rec.e2e_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["RouterMetrics"]
