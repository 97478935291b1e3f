"""What the server writes when a request finishes (chapter 12): one JSON log line, and its trace.

The HTTP handler :meth:`~RequestObserver.register`\\ s each engine request before
submitting it (its client address, the caller's trace context, and its prompt
text only when prompts are logged); the engine loop calls
:meth:`~RequestObserver.observe_step` after every iteration, and for each
request that finished there it writes one line to ``log`` (a text stream) and
the request's spans (:mod:`.tracing`), then forgets it. A line::

    {"event": "request", "time": 1764590000.123, "request_id": "chatcmpl-...-0", "model": "smol",
     "client": "127.0.0.1:50312", "prompt_tokens": 31, "completion_tokens": 12, "ttft_s": 0.0412,
     "e2e_s": 0.3127, "finish_reason": "stop"}

``completion_tokens`` is what the response's ``usage`` reported; ``ttft_s`` is
``null`` for a request that never produced a token. With ``log_prompts`` the
line adds ``"prompt"`` and ``"output"`` (off by default: prompts are user data).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TextIO

from opentelemetry import trace
from opentelemetry.context import Context

from ..engine import RequestOutput, StepStats
from .tracing import PerfClock, record_request_spans


@dataclass(frozen=True)
class RequestContext:
    """What the handler knows about one engine request that the engine does not."""

    client: str
    trace_context: Context
    prompt: object = None  # the prompt as the client sent it, kept only when prompts are logged


class RequestObserver:
    """Log lines and traces of finished requests; ``log=None`` writes no lines."""

    def __init__(self, model_name: str, log: TextIO | None = None, log_prompts: bool = False,
                 tracer_provider: trace.TracerProvider | None = None):
        self.model_name = model_name
        self.log = log
        self.log_prompts = log_prompts
        self.tracer = trace.get_tracer("llmrs.server", tracer_provider=tracer_provider)
        self.clock = PerfClock()
        self._lock = threading.Lock()
        self._contexts: dict[str, RequestContext] = {}

    # -- the handlers' side ---------------------------------------------------------------

    def register(self, request_ids: list[str], client: str, trace_context: Context,
                 prompts: Mapping[str, object] | None = None) -> None:
        """Before submitting: remember each request's client, trace parent and (when logged) prompt."""
        with self._lock:
            for rid in request_ids:
                prompt = prompts.get(rid) if (prompts is not None and self.log_prompts) else None
                self._contexts[rid] = RequestContext(client, trace_context, prompt)

    def discard(self, request_ids: list[str]) -> None:
        """Forget requests that never reached the engine (refused, or their client left first)."""
        with self._lock:
            for rid in request_ids:
                self._contexts.pop(rid, None)

    @property
    def num_open(self) -> int:
        return len(self._contexts)

    # -- the engine loop's side -------------------------------------------------------------

    def observe_step(self, outputs: list[RequestOutput], stats: StepStats) -> None:
        for out in outputs:
            if out.finished:
                with self._lock:
                    ctx = self._contexts.pop(out.request_id, None)
                if ctx is not None:
                    self._finish(stats, out, ctx)

    def _finish(self, stats: StepStats, out: RequestOutput, ctx: RequestContext) -> None:
        request = stats.requests[out.request_id]
        m = request.timing
        prompt_tokens, completion_tokens = request.prompt_tokens, len(request.output_token_ids)
        reason = out.finish_reason
        attributes = {"gen_ai.request.model": self.model_name, "llmrs.request_id": out.request_id,
                      "gen_ai.usage.input_tokens": prompt_tokens, "gen_ai.usage.output_tokens": completion_tokens,
                      "llmrs.finish_reason": reason or "", "client.address": ctx.client}
        record_request_spans(self.tracer, ctx.trace_context, self.clock, m, attributes, prompt_tokens,
                             completion_tokens)
        if self.log is None:
            return
        line = {"event": "request", "time": round(time.time(), 3), "request_id": out.request_id,
                "model": self.model_name, "client": ctx.client, "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens, "ttft_s": _rounded(m.ttft), "e2e_s": _rounded(m.e2e),
                "finish_reason": reason}
        if out.error:
            line["error"] = out.error
        if self.log_prompts:
            line["prompt"] = ctx.prompt
            line["output"] = request.text
        self._write(line)

    def log_event(self, line: dict) -> None:
        """One JSON line that is not a request's (an engine failure, chapter 12.3): to the log,
        or to stderr when there is none — an operator must see it either way."""
        if self.log is None:
            print(json.dumps(line, ensure_ascii=False, default=str), file=sys.stderr, flush=True)
        else:
            self._write(line)

    def _write(self, line: dict) -> None:
        if self.log is None:
            return
        try:
            with self._lock:  # the watchdog thread writes too
                self.log.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")
                self.log.flush()
        except (OSError, ValueError) as e:  # a closed or broken log stream must not stop the engine loop
            self.log = None
            print(f"llmrs: request log disabled, writing it failed: {type(e).__name__}: {e}", file=sys.stderr)


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 6)


__all__ = ["RequestContext", "RequestObserver"]
