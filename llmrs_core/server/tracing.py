"""OpenTelemetry traces of the server's requests (chapter 12).

One trace per engine request, written when the request finishes, from the
times the engine already recorded (:class:`~llmrs_core.engine.RequestMetrics`),
so the hot path pays nothing per token::

    llmrs.request            arrival -> finish   model, request id, prompt/generation tokens, finish reason
    ├── llmrs.queued         arrival -> the first step that ran it
    ├── llmrs.prefill        that step -> first token               prompt tokens
    └── llmrs.decode         first token -> last token              generation tokens

The parent is the W3C ``traceparent`` header of the HTTP request (the caller's
trace), or a new trace without one. Which tracer provider gets the spans is the
app's choice (``create_app(tracer_provider=...)``; tests use the SDK's in-memory
exporter); ``llmrs serve`` exports with OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT``
is set (:func:`otlp_provider_from_env`). With no provider the API's no-op tracer
makes the spans free.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from ..engine.engine import RequestMetrics

_W3C = TraceContextTextMapPropagator()


def context_from_headers(headers: Mapping[str, str]) -> Context:
    """The caller's trace context from a W3C ``traceparent`` (and ``tracestate``) header;
    an empty context (a new trace) when there is none or it is malformed."""
    return _W3C.extract({k.lower(): v for k, v in headers.items() if k.lower() in ("traceparent", "tracestate")})


class PerfClock:
    """``time.perf_counter()`` seconds -> epoch nanoseconds (what span times are), fixed at creation."""

    def __init__(self) -> None:
        self.offset_ns = time.time_ns() - time.perf_counter_ns()

    def ns(self, perf_seconds: float) -> int:
        return int(perf_seconds * 1e9) + self.offset_ns


def record_request_spans(tracer: trace.Tracer, parent: Context, clock: PerfClock, m: RequestMetrics,
                         attributes: Mapping[str, object], prompt_tokens: int, generation_tokens: int) -> None:
    """Write one finished request's spans (see the module docstring). Phases that never
    happened (an abort while queued: no prefill, no decode) get no span."""
    end = m.finished_time if m.finished_time is not None else time.perf_counter()
    root = tracer.start_span("llmrs.request", context=parent, kind=trace.SpanKind.SERVER,
                             start_time=clock.ns(m.arrival_time), attributes=dict(attributes))
    inside = trace.set_span_in_context(root)
    phases = [("llmrs.queued", m.arrival_time, m.scheduled_time if m.scheduled_time is not None else end, {})]
    if m.scheduled_time is not None and m.first_token_time is not None:
        phases.append(("llmrs.prefill", m.scheduled_time, m.first_token_time,
                       {"llmrs.prompt_tokens": prompt_tokens}))
        phases.append(("llmrs.decode", m.first_token_time, m.token_times[-1],
                       {"llmrs.generation_tokens": generation_tokens}))
    for name, start, stop, attrs in phases:
        span = tracer.start_span(name, context=inside, start_time=clock.ns(start), attributes=attrs)
        span.end(end_time=clock.ns(stop))
    if attributes.get("llmrs.finish_reason") == "error":
        root.set_status(trace.Status(trace.StatusCode.ERROR))
    root.end(end_time=clock.ns(end))


def otlp_provider_from_env(service_name: str = "llmrs"):  # -> TracerProvider | None
    """A tracer provider exporting over OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) is set; ``None`` when neither is.

    The exporter reads the standard ``OTEL_EXPORTER_OTLP_*`` variables itself (HTTP/protobuf,
    the ``opentelemetry-exporter-otlp-proto-http`` package). Raises ``ValueError`` saying what
    to install when the SDK or the exporter is missing.
    """
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ValueError("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OpenTelemetry SDK is missing: "
                         "pip install opentelemetry-sdk") from None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError:
        raise ValueError("OTEL_EXPORTER_OTLP_ENDPOINT is set but the OTLP exporter is not installed: "
                         "pip install opentelemetry-exporter-otlp-proto-http (or unset the variable)") from None
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


__all__ = ["PerfClock", "context_from_headers", "otlp_provider_from_env", "record_request_spans"]
