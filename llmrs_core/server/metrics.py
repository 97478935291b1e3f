"""Prometheus metrics of the server (chapter 11; chapter 12 completes the set).

vLLM's names with an ``llmrs:`` prefix, so dashboards written for vLLM read ours:

==========================================  =========  ==========================================
``llmrs:num_requests_running``              gauge      requests in the engine's running batch
``llmrs:num_requests_waiting``              gauge      requests queued, not yet running
``llmrs:kv_cache_usage_perc``               gauge      KV blocks held by requests, 0..1 (blocks kept
                                                       only by the prefix cache count as free: they
                                                       are evictable, as in vLLM)
``llmrs:prompt_tokens_total``               counter    prompt tokens prefilled
``llmrs:generation_tokens_total``           counter    tokens sampled
``llmrs:request_success_total``             counter    finished requests, by ``finished_reason``
``llmrs:time_to_first_token_seconds``       histogram  arrival to first token
``llmrs:inter_token_latency_seconds``       histogram  between consecutive tokens of a request
==========================================  =========  ==========================================

Every app gets its own registry (never the process-global one), so tests and
notebooks can run several servers in one process. :meth:`ServerMetrics.observe_step`
is the engine loop's ``on_step``: it runs in the loop thread, reads the engine
(``Engine.request_metrics``, the scheduler's queues, the block pool) and updates
the metrics; ``prometheus_client`` metrics are thread-safe, so ``/metrics`` reads
them from the event loop.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine import Engine, RequestOutput

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
               0.4, 0.5, 0.75, 1.0, 2.5)


class ServerMetrics:
    """The server's metrics in their own registry; ``render()`` is the ``/metrics`` body."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge("llmrs:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge("llmrs:num_requests_waiting", "Requests waiting to run.", labels, registry=r)
        self.kv_usage = Gauge("llmrs:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", labels,
                              registry=r)
        self.prompt_tokens = Counter("llmrs:prompt_tokens", "Prompt tokens prefilled.", labels, registry=r)
        self.generation_tokens = Counter("llmrs:generation_tokens", "Tokens generated.", labels, registry=r)
        self.success = Counter("llmrs:request_success", "Finished requests.", [*labels, "finished_reason"],
                               registry=r)
        self.ttft = Histogram("llmrs:time_to_first_token_seconds", "Time to first token.", labels,
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("llmrs:inter_token_latency_seconds", "Time between consecutive tokens.", labels,
                             buckets=ITL_BUCKETS, registry=r)
        self._label = {"model_name": model_name}

    def observe_step(self, engine: Engine, outputs: list[RequestOutput]) -> None:
        """Update from one engine-loop iteration (runs in the loop thread)."""
        label = self._label
        sched = engine.scheduler
        self.running.labels(**label).set(len(sched.running))
        self.waiting.labels(**label).set(len(sched.waiting))
        held = set().union(*engine.cache.tables.values())  # blocks in some request's table
        self.kv_usage.labels(**label).set(len(held) / engine.cache.allocator.num_blocks)
        for out in outputs:
            if out.finish_reason == "error":
                self.success.labels(**label, finished_reason="error").inc()
                continue
            times = engine.request_metrics(out.request_id).token_times
            self.generation_tokens.labels(**label).inc()
            if len(times) == 1:
                m = engine.request_metrics(out.request_id)
                self.prompt_tokens.labels(**label).inc(len(engine.requests[out.request_id].prompt_ids))
                self.ttft.labels(**label).observe(m.ttft or 0.0)
            else:
                self.itl.labels(**label).observe(times[-1] - times[-2])
            if out.finished:
                self.success.labels(**label, finished_reason=out.finish_reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["ServerMetrics"]
