"""Prometheus metrics of the server (chapter 11; chapter 12 completes the set).

vLLM's names (``vllm/v1/metrics/loggers.py``) with an ``llmrs:`` prefix and vLLM's
buckets, so dashboards written for vLLM read ours. Every series carries the
``model_name`` label.

=============================================  =========  ==========================================
``llmrs:num_requests_running``                 gauge      requests in the engine's running batch
``llmrs:num_requests_waiting``                 gauge      requests queued, not yet running
``llmrs:kv_cache_usage_perc``                  gauge      KV blocks held by requests, 0..1 (blocks kept
                                                          only by the prefix cache count as free: they
                                                          are evictable, as in vLLM)
``llmrs:prompt_tokens_total``                  counter    prompt tokens of requests that got a first token
``llmrs:generation_tokens_total``              counter    tokens returned to clients (the ``usage``'s
                                                          ``completion_tokens``: an end-of-turn token
                                                          that ends a request is not returned)
``llmrs:num_preemptions_total``                counter    requests preempted (their KV freed, recomputed)
``llmrs:prefix_cache_queries_total``           counter    prompt tokens looked up in the prefix cache
``llmrs:prefix_cache_hits_total``              counter    of those, tokens found cached
``llmrs:request_success_total``                counter    finished requests, by ``finished_reason``
                                                          (``stop``, ``length``, ``abort``, ``error``)
``llmrs:engine_restarts_total``                counter    fresh engines built after an engine failure
                                                          (chapter 12.3; not a vLLM metric)
``llmrs:time_to_first_token_seconds``          histogram  arrival to first token, per request
``llmrs:inter_token_latency_seconds``          histogram  between consecutive tokens of a request
``llmrs:e2e_request_latency_seconds``          histogram  arrival to finish, per finished request
``llmrs:request_queue_time_seconds``           histogram  arrival to the first step that ran it
``llmrs:request_prefill_time_seconds``         histogram  that step to the first token
``llmrs:request_decode_time_seconds``          histogram  first token to last token
``llmrs:request_prompt_tokens``                histogram  prompt length, per finished request
``llmrs:request_generation_tokens``            histogram  tokens returned, per finished request
=============================================  =========  ==========================================

The five per-request histograms from ``e2e`` on observe requests that finished
with ``stop`` or ``length`` (a request aborted or failed has no complete
phases); ``request_success_total`` counts every reason. With ``n > 1`` or
several prompts in one call, each choice is one engine request, and its prompt
counts once per choice (as in vLLM).

Every app gets its own registry (never the process-global one), so tests and
notebooks can run several servers in one process. :meth:`ServerMetrics.observe_step`
is called in the engine-loop thread after each iteration: it reads the engine
(``Engine.request_metrics``, the scheduler's queues, the block pool, the prefix
cache's counters) and updates the metrics; ``prometheus_client`` metrics are
thread-safe, so ``/metrics`` reads them from the event loop.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine import Engine, RequestOutput

# vLLM's buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

#: finish reasons after which a request's phases are all known
COMPLETE = ("stop", "length")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count buckets)."""
    if max_value < 1:
        raise ValueError(f"max_value must be >= 1, got {max_value}")
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


class ServerMetrics:
    """The server's metrics in their own registry; ``render()`` is the ``/metrics`` body.

    ``max_model_len`` (the context length) bounds the token-count buckets.
    """

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, model_name: str, max_model_len: int = 8192):
        self.registry = r = CollectorRegistry()
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        def counter(name: str, doc: str) -> Counter:  # prometheus_client adds the _total suffix
            return Counter(name, doc, labels, registry=r)

        self.running = Gauge("llmrs:num_requests_running", "Requests in the running batch.", labels, registry=r)
        self.waiting = Gauge("llmrs:num_requests_waiting", "Requests waiting to run.", labels, registry=r)
        self.kv_usage = Gauge("llmrs:kv_cache_usage_perc", "KV-cache usage; 1 means 100 percent.", labels,
                              registry=r)
        self.prompt_tokens = counter("llmrs:prompt_tokens", "Prompt tokens of requests that got a first token.")
        self.generation_tokens = counter("llmrs:generation_tokens", "Tokens returned to clients.")
        self.preemptions = counter("llmrs:num_preemptions", "Requests preempted.")
        self.prefix_queries = counter("llmrs:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("llmrs:prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.success = Counter("llmrs:request_success", "Finished requests.", [*labels, "finished_reason"],
                               registry=r)
        self.ttft = histogram("llmrs:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("llmrs:inter_token_latency_seconds", "Time between consecutive tokens.", ITL_BUCKETS)
        self.e2e = histogram("llmrs:e2e_request_latency_seconds", "Arrival to finish.", REQUEST_LATENCY_BUCKETS)
        self.queue_time = histogram("llmrs:request_queue_time_seconds", "Time waiting before the first step.",
                                    REQUEST_LATENCY_BUCKETS)
        self.prefill_time = histogram("llmrs:request_prefill_time_seconds", "First step to first token.",
                                      REQUEST_LATENCY_BUCKETS)
        self.decode_time = histogram("llmrs:request_decode_time_seconds", "First token to last token.",
                                     REQUEST_LATENCY_BUCKETS)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.request_prompt_tokens = histogram("llmrs:request_prompt_tokens", "Prompt tokens per request.",
                                               token_buckets)
        self.request_generation_tokens = histogram("llmrs:request_generation_tokens",
                                                   "Tokens returned per request.", token_buckets)
        self.engine_restarts = counter("llmrs:engine_restarts", "Fresh engines built after an engine failure.")
        self._label = {"model_name": model_name}
        self.engine_restarts.labels(**self._label)  # exported from the start, at 0
        # the engine's cumulative counters at the last step (the Prometheus counters take the differences)
        self._engine_id: int | None = None
        self._seen = (0, 0, 0)

    def observe_step(self, engine: Engine, outputs: list[RequestOutput]) -> None:
        """Update from one engine-loop iteration (runs in the loop thread, before finished
        requests are released). ``outputs`` includes the iteration's aborts."""
        label = self._label
        sched = engine.scheduler
        self.running.labels(**label).set(len(sched.running))
        self.waiting.labels(**label).set(len(sched.waiting))
        held = set().union(*engine.cache.tables.values())  # blocks in some request's table
        self.kv_usage.labels(**label).set(len(held) / engine.cache.allocator.num_blocks)
        self._observe_engine_counters(engine)
        for out in outputs:
            self.generation_tokens.labels(**label).inc(len(out.new_token_ids))
            m = engine.request_metrics(out.request_id)
            if out.finish_reason not in ("abort", "error") and m.token_times:
                if len(m.token_times) == 1:  # this step sampled the request's first token
                    self.prompt_tokens.labels(**label).inc(len(engine.requests[out.request_id].prompt_ids))
                    self.ttft.labels(**label).observe(m.ttft)
                else:
                    self.itl.labels(**label).observe(m.token_times[-1] - m.token_times[-2])
            if out.finished:
                self.success.labels(**label, finished_reason=out.finish_reason).inc()
                if out.finish_reason in COMPLETE:
                    self._observe_finished(engine, out.request_id)

    def _observe_finished(self, engine: Engine, request_id: str) -> None:
        label = self._label
        m = engine.request_metrics(request_id)
        request = engine.requests[request_id]
        self.e2e.labels(**label).observe(m.e2e)
        self.queue_time.labels(**label).observe(m.queue_time)
        self.prefill_time.labels(**label).observe(m.prefill_time)
        self.decode_time.labels(**label).observe(m.decode_time)
        self.request_prompt_tokens.labels(**label).observe(len(request.prompt_ids))
        self.request_generation_tokens.labels(**label).observe(len(request.output_ids))

    def _observe_engine_counters(self, engine: Engine) -> None:
        """Preemptions and prefix-cache lookups: the engine counts them; add what is new."""
        pc = engine.prefix_cache
        now = (engine.scheduler.num_preemptions, pc.lookup_tokens if pc else 0, pc.hit_tokens if pc else 0)
        if self._engine_id != id(engine):  # a new engine counts from zero
            self._engine_id, self._seen = id(engine), (0, 0, 0)
        label = self._label
        for metric, before, after in zip((self.preemptions, self.prefix_queries, self.prefix_hits), self._seen, now):
            if after > before:
                metric.labels(**label).inc(after - before)
        self._seen = now

    def observe_restart(self) -> None:
        """The engine loop restarted with a fresh engine (chapter 12.3)."""
        self.engine_restarts.labels(**self._label).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


__all__ = ["COMPLETE", "ITL_BUCKETS", "REQUEST_LATENCY_BUCKETS", "TTFT_BUCKETS", "ServerMetrics",
           "build_1_2_5_buckets"]
