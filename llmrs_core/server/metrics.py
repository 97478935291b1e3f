"""Prometheus metrics of the server (chapter 11; chapter 12 completes the set).

vLLM's names (``vllm/v1/metrics/loggers.py``) with an ``llmrs:`` prefix and vLLM's
buckets, so dashboards written for vLLM read ours. Every series carries the
``model_name`` label. Gauges: ``num_requests_running``, ``num_requests_waiting``,
``kv_cache_usage_perc`` (0..1, prefix-cache-only blocks count as free). Counters:
``prompt_tokens_total`` (a prompt with ``n`` > 1 choices counts once, as ``usage``
does: :meth:`ServerMetrics.share_prompt`), ``generation_tokens_total``,
``num_preemptions_total``, ``prefix_cache_queries_total``, ``prefix_cache_hits_total``,
``request_success_total`` (by ``finished_reason``), ``engine_restarts_total``.
Histograms: ``time_to_first_token_seconds``, ``inter_token_latency_seconds``,
``e2e_request_latency_seconds``, ``request_queue_time_seconds``,
``request_prefill_time_seconds``, ``request_decode_time_seconds``,
``request_prompt_tokens``, ``request_generation_tokens``. Each one's meaning and
caveats: chapter 12.2 ("The metrics, one by one").

Invariants: the per-request histograms from ``e2e`` on observe only requests that
finished with ``stop`` or ``length``; gauges and counters are exported from the
start, at 0; every app has its own registry (never the process-global one).

:meth:`ServerMetrics.observe_step` is called in the engine-loop thread after each
iteration with its outputs and the engine's :class:`~llmrs_core.engine.StepStats`
(never the engine); ``prometheus_client`` metrics are thread-safe, so ``/metrics``
reads them from the event loop. By default tokens are observed as they come;
:meth:`ServerMetrics.record_at_finish` hands each finished request's timings to one
function instead (:class:`RequestMetricSet`, :class:`FinishedRequestRecorder`;
:func:`record_finished_request` is the engine's; Exercise 12.7 plugs the learner's
in). The scrape gives the same totals either way.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine import RequestOutput, StepStats
from ..engine.engine import RequestMetrics

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


@dataclass(frozen=True)
class RequestMetricSet:
    """The metrics one finished request goes into: ``prometheus_client`` series with their labels
    already applied, so ``counter.inc(n)`` and ``histogram.observe(x)`` are all a recorder calls.
    Times are in seconds (the ``_seconds`` in the names), token counts are plain counts."""

    prompt_tokens: Counter  # llmrs:prompt_tokens_total
    generation_tokens: Counter  # llmrs:generation_tokens_total
    time_to_first_token: Histogram  # llmrs:time_to_first_token_seconds
    inter_token_latency: Histogram  # llmrs:inter_token_latency_seconds
    e2e_request_latency: Histogram  # llmrs:e2e_request_latency_seconds
    request_queue_time: Histogram  # llmrs:request_queue_time_seconds
    request_prefill_time: Histogram  # llmrs:request_prefill_time_seconds
    request_decode_time: Histogram  # llmrs:request_decode_time_seconds
    request_prompt_tokens: Histogram  # llmrs:request_prompt_tokens
    request_generation_tokens: Histogram  # llmrs:request_generation_tokens


class FinishedRequestRecorder(Protocol):
    """Records one request that finished with ``stop`` or ``length``, once, into ``metrics``.

    ``timing``: the engine's :class:`~llmrs_core.engine.RequestMetrics` (``perf_counter`` seconds;
    ``token_times`` has one entry per *sampled* token, including an end-of-turn token that ended
    the request, which the client never sees); ``prompt_tokens``: the prompt's length;
    ``output_token_ids``: the tokens returned to the client (the usage's ``completion_tokens``).
    """

    def __call__(self, metrics: RequestMetricSet, timing: RequestMetrics, prompt_tokens: int,
                 output_token_ids: Sequence[int]) -> None: ...


def record_finished_request(metrics: RequestMetricSet, timing: RequestMetrics, prompt_tokens: int,
                            output_token_ids: Sequence[int]) -> None:
    """The engine's :class:`FinishedRequestRecorder`: every per-request series of one finished request."""
    metrics.prompt_tokens.inc(prompt_tokens)
    metrics.generation_tokens.inc(len(output_token_ids))
    metrics.time_to_first_token.observe(timing.ttft)
    for gap in timing.itl:  # one per pair of consecutive sampled tokens
        metrics.inter_token_latency.observe(gap)
    metrics.e2e_request_latency.observe(timing.e2e)
    metrics.request_queue_time.observe(timing.queue_time)
    metrics.request_prefill_time.observe(timing.prefill_time)
    metrics.request_decode_time.observe(timing.decode_time)
    metrics.request_prompt_tokens.observe(prompt_tokens)
    metrics.request_generation_tokens.observe(len(output_token_ids))


@dataclass(eq=False)
class _SharedPrompt:
    """One prompt of several engine requests (choices): its tokens count once, for the first of them."""

    counted: bool = False


class RecorderError(RuntimeError):
    """A recorder given to :meth:`ServerMetrics.record_at_finish` raised (its error is the cause)."""


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
        # every counter is exported from the start, at 0: a series that appears only at its first
        # increment breaks rate() and alerts on it (a server that has had no prefix-cache hit yet has 0)
        for metric in (self.prompt_tokens, self.generation_tokens, self.preemptions, self.prefix_queries,
                       self.prefix_hits, self.engine_restarts):
            metric.labels(**self._label)
        for gauge in (self.running, self.waiting, self.kv_usage):  # so are the gauges: an idle replica has 0
            gauge.labels(**self._label).set(0)
        self._lock = threading.Lock()
        self._shared: dict[str, _SharedPrompt] = {}  # engine request id -> the prompt it shares
        # where a recorder's prompt count goes for a choice whose prompt was counted already: nowhere
        self._uncounted = Counter("llmrs:prompt_tokens_counted_once", "Not exported.", registry=None)
        # the engine's cumulative counters at the last step (the Prometheus counters take the differences)
        self._engine_id: int | None = None
        self._seen = (0, 0, 0)
        self._recorder: FinishedRequestRecorder | None = None

    def share_prompt(self, request_ids: Sequence[str]) -> None:
        """The engine requests ``request_ids`` are choices of one prompt (``n`` > 1): count its
        tokens once in ``prompt_tokens_total``. Called by the handler before it submits them
        (thread-safe); each id is forgotten when its request finishes, or with :meth:`forget`."""
        group = _SharedPrompt()
        with self._lock:
            for rid in request_ids:
                self._shared[rid] = group

    def forget(self, request_ids: Sequence[str]) -> None:
        """Drop what :meth:`share_prompt` knows of requests that never reached the engine."""
        with self._lock:
            for rid in request_ids:
                self._shared.pop(rid, None)

    @property
    def num_shared(self) -> int:
        """Requests :meth:`share_prompt` still knows (0 once every request finished or was forgotten)."""
        return len(self._shared)

    def _counts_prompt(self, request_id: str) -> bool:
        """Whether ``request_id``'s prompt tokens count now: yes, unless another choice of the same
        prompt counted them already."""
        with self._lock:
            group = self._shared.get(request_id)
            if group is None:
                return True
            counted, group.counted = group.counted, True
            return not counted

    def _finished(self, request_id: str) -> None:
        with self._lock:
            self._shared.pop(request_id, None)

    def record_at_finish(self, recorder: FinishedRequestRecorder | None) -> None:
        """From now on, hand each request finished with ``stop`` or ``length`` to ``recorder`` (once,
        at its finish) instead of observing its tokens as they come; ``None``: back to streaming.
        Requests aborted or failed still count their tokens here (they have no complete phases)."""
        self._recorder = recorder

    def request_metric_set(self) -> RequestMetricSet:
        """This server's per-request series, labelled, for a :class:`FinishedRequestRecorder`."""
        label = self._label
        return RequestMetricSet(
            self.prompt_tokens.labels(**label), self.generation_tokens.labels(**label), self.ttft.labels(**label),
            self.itl.labels(**label), self.e2e.labels(**label), self.queue_time.labels(**label),
            self.prefill_time.labels(**label), self.decode_time.labels(**label),
            self.request_prompt_tokens.labels(**label), self.request_generation_tokens.labels(**label))

    def observe_step(self, outputs: list[RequestOutput], stats: StepStats) -> None:
        """Update from one engine-loop iteration (runs in the loop thread). ``outputs`` includes
        the iteration's aborts; ``stats`` is the engine after it, with each output's request."""
        label = self._label
        self.running.labels(**label).set(stats.num_running)
        self.waiting.labels(**label).set(stats.num_waiting)
        self.kv_usage.labels(**label).set(stats.kv_cache_usage)
        self._observe_engine_counters(stats)
        recorder = self._recorder
        for out in outputs:
            if recorder is not None:
                if out.finished:
                    self._finish_with(recorder, stats, out)
                    self._finished(out.request_id)
                continue
            self.generation_tokens.labels(**label).inc(len(out.new_token_ids))
            m = stats.requests[out.request_id].timing
            if out.finish_reason not in ("abort", "error") and m.token_times:
                if len(m.token_times) == 1:  # this step sampled the request's first token
                    if self._counts_prompt(out.request_id):
                        self.prompt_tokens.labels(**label).inc(stats.requests[out.request_id].prompt_tokens)
                    self.ttft.labels(**label).observe(m.ttft)
                else:
                    self.itl.labels(**label).observe(m.token_times[-1] - m.token_times[-2])
            if out.finished:
                self.success.labels(**label, finished_reason=out.finish_reason).inc()
                if out.finish_reason in COMPLETE:
                    self._observe_finished(stats, out.request_id)
                self._finished(out.request_id)

    def _finish_with(self, recorder: FinishedRequestRecorder, stats: StepStats, out: RequestOutput) -> None:
        label = self._label
        request = stats.requests[out.request_id]
        timing = request.timing
        self.success.labels(**label, finished_reason=out.finish_reason).inc()
        if out.finish_reason in COMPLETE:
            metric_set = self.request_metric_set()
            if not self._counts_prompt(out.request_id):  # another choice of its prompt counted the prompt
                metric_set = dataclasses.replace(metric_set, prompt_tokens=self._uncounted)
            try:
                recorder(metric_set, timing, request.prompt_tokens, request.output_token_ids)
            except Exception as e:  # name the plugged-in code (Exercise 12.7), not "the engine loop failed"
                raise RecorderError(f"the finished-request recorder (record_at_finish: Exercise 12.7's "
                                    f"record_finished_request) raised {type(e).__name__}: {e}, on request "
                                    f"{out.request_id!r}") from e
        else:  # what the streaming path counts for an aborted or failed request
            self.generation_tokens.labels(**label).inc(len(request.output_token_ids))
            if request.output_token_ids and self._counts_prompt(out.request_id):
                self.prompt_tokens.labels(**label).inc(request.prompt_tokens)

    def _observe_finished(self, stats: StepStats, request_id: str) -> None:
        label = self._label
        request = stats.requests[request_id]
        m = request.timing
        self.e2e.labels(**label).observe(m.e2e)
        self.queue_time.labels(**label).observe(m.queue_time)
        self.prefill_time.labels(**label).observe(m.prefill_time)
        self.decode_time.labels(**label).observe(m.decode_time)
        self.request_prompt_tokens.labels(**label).observe(request.prompt_tokens)
        self.request_generation_tokens.labels(**label).observe(len(request.output_token_ids))

    def _observe_engine_counters(self, stats: StepStats) -> None:
        """Preemptions and prefix-cache lookups: the engine counts them; add what is new."""
        now = (stats.num_preemptions, stats.prefix_cache_queries, stats.prefix_cache_hits)
        if self._engine_id != stats.engine_id:  # a new engine counts from zero
            self._engine_id, self._seen = stats.engine_id, (0, 0, 0)
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


__all__ = ["COMPLETE", "ITL_BUCKETS", "REQUEST_LATENCY_BUCKETS", "TTFT_BUCKETS", "FinishedRequestRecorder", "RecorderError",
           "RequestMetricSet", "ServerMetrics", "build_1_2_5_buckets", "record_finished_request"]
