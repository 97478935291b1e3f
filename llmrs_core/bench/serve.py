"""``llmrs bench serve``: load against an OpenAI-compatible server, vLLM's method (chapter 11).

vLLM's ``benchmark_serving``, for any server with a streaming ``POST /v1/completions``
(ours, vLLM, llama.cpp's, llama-cpp-python's):

* **Load.** Each load level sends ``num_prompts`` requests, either *open loop* — at times drawn from a
  gamma process of ``request_rate`` requests/s (``burstiness`` 1 is Poisson, lower is burstier),
  rescaled so that the last request leaves at exactly ``num_prompts / request_rate`` s whatever the seed
  — or *closed loop*: at most ``max_concurrency`` requests in flight, each finished one letting the next
  go. One warm-up request first, not counted.
* **Prompts.** ``random``: ``input_len`` random token ids decoded to text with the model's tokenizer
  (vLLM's random dataset); ``prompts``: the short questions of :mod:`.prompts`. Each level gets prompts
  of its own, so a prefix cache cannot reuse an earlier level's. Every request asks for ``output_len``
  tokens, greedy; ``ignore_eos`` (ours, vLLM) or ``min_tokens`` (llama-cpp-python) keeps a server from
  stopping early.
* **Measured per request, from the SSE stream** (seconds): TTFT, from sending to the first chunk with
  text; ITL, every later gap between chunks with text; E2E, from sending to the end of the stream; TPOT
  = (E2E - TTFT) / (output tokens - 1). Output tokens are the usage chunk's ``completion_tokens`` where
  the server sends one (``stream_options.include_usage``), else the number of chunks with text.
* **Outcomes.** A request *succeeded* when its stream had text and ended with a ``finish_reason``. It
  was *truncated* when the answer was HTTP 200 but the stream ended — with ``[DONE]`` or not — without a
  ``finish_reason`` (llama-cpp-python's server cuts a running stream so when another request arrives).
  It *failed* otherwise: an HTTP error, an error event, no text, a refused connection. Only successes
  enter the latencies and the token counts; truncated and failed requests are counted apart, never as
  fast successes.
* **Summary.** Mean, median and p99 of TTFT, TPOT, ITL and E2E; requests/s and output tokens/s over the
  level's wall time; goodput: requests/s that met every SLO of ``--goodput ttft:MS,tpot:MS,e2el:MS``.

:mod:`.serve_compare` starts servers (ours, llama-cpp-python's) and runs the same load on each.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .common import percentiles, random_ids
from .prompts import PROMPTS

#: how a request asks for exactly ``max_tokens`` tokens: vLLM's and our ``ignore_eos``,
#: llama-cpp-python's ``min_tokens``, or nothing (the server may stop at end-of-sequence)
LENGTH_FIELDS = ("ignore_eos", "min_tokens", "none")
#: the SLOs ``--goodput`` knows (vLLM's names), in milliseconds on the command line
SLO_NAMES = ("ttft", "tpot", "e2el")


# -- the load -------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """One load level: closed loop (``max_concurrency`` in flight) or open loop (``request_rate``
    requests/s, gamma arrivals of shape ``burstiness``; ``inf`` sends every request at once)."""

    max_concurrency: int | None = None
    request_rate: float = math.inf
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max concurrency must be at least 1, got {self.max_concurrency}")
        if not self.request_rate > 0:
            raise ValueError(f"the request rate must be > 0 requests/s, got {self.request_rate}")
        if not (self.burstiness > 0 and math.isfinite(self.burstiness)):
            raise ValueError(f"burstiness must be a positive number, got {self.burstiness}")

    @property
    def label(self) -> str:
        if self.max_concurrency is not None:
            return f"{self.max_concurrency} client{'s' if self.max_concurrency > 1 else ''}"
        return f"{self.request_rate:g} req/s" + (f", burstiness {self.burstiness:g}" if self.burstiness != 1 else "")


def arrival_times(n: int, request_rate: float, burstiness: float = 1.0,
                  rng: np.random.Generator | None = None) -> np.ndarray:
    """When each of ``n`` requests is sent, in seconds from the start (vLLM's schedule).

    Gaps are gamma-distributed with shape ``burstiness`` and mean ``1 / request_rate``
    (``burstiness`` 1: exponential gaps, a Poisson process); their running sum is then
    rescaled so that the last request is sent at exactly ``n / request_rate`` s — without it,
    the sum misses that target by a few per cent, differently for each seed. An infinite
    rate sends everything at 0.
    """
    if n < 1:
        raise ValueError(f"need at least one request, got {n}")
    if math.isinf(request_rate):
        return np.zeros(n)
    Load(request_rate=request_rate, burstiness=burstiness)  # the checks
    rng = rng if rng is not None else np.random.default_rng(0)
    times = np.cumsum(rng.gamma(shape=burstiness, scale=1.0 / (request_rate * burstiness), size=n))
    return times * (n / request_rate / times[-1])


@dataclass(frozen=True)
class Workload:
    """The requests of one level: prompt texts, and the tokens each asks for (``output_len``)."""

    prompts: tuple[str, ...]
    output_len: int


def random_workload(tokenizer, n: int, input_len: int, output_len: int, seed: int | Sequence[int]) -> Workload:
    """``n`` prompts of about ``input_len`` random tokens, as text (vLLM's random dataset).

    Random ids are decoded, re-encoded and cut to ``input_len`` tokens, so the text the
    server encodes again comes back to about that length. ``seed``: NumPy's seed (an int or
    a sequence of ints, e.g. ``[seed, level]``).
    """
    rng = np.random.default_rng(seed)
    vocab = tokenizer.vocab_size
    prompts = []
    for _ in range(n):
        ids = tokenizer.encode(tokenizer.decode(random_ids(rng, vocab, input_len)), allow_special=False)
        prompts.append(tokenizer.decode(ids[:input_len]))
    return Workload(tuple(prompts), output_len)


def prompt_set_workload(n: int, output_len: int, tag: str) -> Workload:
    """``n`` prompts from the shipped set (:data:`.prompts.PROMPTS`, cycled), each led by ``tag``
    and its number, so that no two requests of a run — nor of two runs — share a prefix."""
    return Workload(tuple(f"[{tag}.{i}] {PROMPTS[i % len(PROMPTS)]}" for i in range(n)), output_len)


def request_body(model: str, prompt: str, output_len: int, length_field: str) -> dict:
    """The streamed, greedy ``/v1/completions`` body of one request (``length_field``: one of
    :data:`LENGTH_FIELDS`, how the server is told to produce all ``output_len`` tokens)."""
    if length_field not in LENGTH_FIELDS:
        raise ValueError(f"unknown length field {length_field!r}; known: {', '.join(LENGTH_FIELDS)}")
    body = {"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}}
    if length_field == "ignore_eos":
        body["ignore_eos"] = True
    elif length_field == "min_tokens":
        body["min_tokens"] = output_len
    return body


# -- one request, from its stream --------------------------------------------------------


@dataclass
class RequestResult:
    """What one request gave. ``outcome``: ``"ok"``, ``"truncated"`` or ``"failed"``; times in
    seconds from sending (``ttft``, ``e2e``) and between chunks with text (``itl``)."""

    outcome: str
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    output_tokens: int = 0
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first; ``None`` with fewer than 2 tokens."""
        if self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


class StreamParser:
    """Reads one streamed completion's SSE lines as they arrive (``feed``), then says how it went.

    ``start`` and every ``now`` are :func:`time.perf_counter` readings, in seconds.
    """

    def __init__(self, start: float):
        self.start = start
        self.text_times: list[float] = []
        self.finish_reason: str | None = None
        self.usage_tokens: int | None = None
        self.error = ""
        self.done = False

    def feed(self, line: str, now: float) -> None:
        if not line.startswith("data:"):
            return  # blank separators, comments, event names
        data = line[5:].strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            chunk = json.loads(data)
        except ValueError:
            self.error = self.error or f"a stream event is not JSON: {data[:80]!r}"
            return
        if not isinstance(chunk, dict):
            self.error = self.error or f"a stream event is not a JSON object: {data[:80]!r}"
            return
        if "error" in chunk:
            err = chunk["error"]
            self.error = self.error or str(err.get("message", err) if isinstance(err, dict) else err)
            return
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            delta = choice.get("delta")
            text = choice.get("text") if delta is None else delta.get("content") if isinstance(delta, dict) else None
            if text:
                self.text_times.append(now)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def result(self, end: float, broken: str = "") -> RequestResult:
        """The outcome, the stream having ended at ``end`` (``broken``: why, if it broke off)."""
        if self.error:
            return RequestResult("failed", error=self.error)
        if self.finish_reason is None:
            why = broken or ("[DONE] came" if self.done else "the stream ended")
            return RequestResult("truncated", output_tokens=len(self.text_times),
                                 error=f"truncated: {why} without a finish_reason")
        if not self.text_times:
            return RequestResult("failed", error="the answer had no text")
        times = self.text_times
        return RequestResult(
            "ok", ttft=times[0] - self.start, itl=list(np.diff(times).tolist()), e2e=end - self.start,
            output_tokens=self.usage_tokens if self.usage_tokens is not None else len(times),
        )


def _error_message(status: int, body: bytes) -> str:
    text = body.decode("utf-8", errors="replace")
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = text[:200]
    return f"HTTP {status}: {' '.join(str(message).split())}"


async def send(client, url: str, body: dict) -> RequestResult:
    """POST one streamed request with ``client`` (an ``httpx.AsyncClient``) and read it to the end."""
    import httpx

    start = time.perf_counter()
    parser = StreamParser(start)
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                return RequestResult("failed", error=_error_message(response.status_code, await response.aread()))
            try:
                async for line in response.aiter_lines():
                    parser.feed(line, time.perf_counter())
            except httpx.HTTPError as e:  # after a 200: the stream broke off
                return parser.result(time.perf_counter(), broken=f"{type(e).__name__} {e}".strip())
    except httpx.HTTPError as e:
        return RequestResult("failed", error=f"{type(e).__name__}: {e}".rstrip(": "))
    return parser.result(time.perf_counter())


# -- a level, and the figures --------------------------------------------------------------


def parse_goodput(text: str | None) -> dict[str, float]:
    """``"ttft:500,tpot:50"`` (milliseconds) -> ``{"ttft": 0.5, "tpot": 0.05}`` (seconds)."""
    slos: dict[str, float] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, value = item.partition(":")
        name = name.strip().lower()
        try:
            ms = float(value) if sep else math.nan
        except ValueError:
            ms = math.nan
        if name not in SLO_NAMES or not ms > 0:
            raise ValueError(f"--goodput takes NAME:MILLISECONDS pairs, NAME one of {', '.join(SLO_NAMES)} "
                             f"(e.g. ttft:500,tpot:50); got {item.strip()!r}")
        slos[name] = ms / 1e3
    return slos


def meets(r: RequestResult, slos: dict[str, float]) -> bool:
    """Whether a successful request met every SLO (seconds); a one-token answer has TPOT 0."""
    measured = {"ttft": r.ttft, "tpot": r.tpot or 0.0, "e2el": r.e2e}
    return r.outcome == "ok" and all(measured[k] <= limit for k, limit in slos.items())


def summarise(results: Sequence[RequestResult], duration: float, slos: dict[str, float] | None = None) -> dict:
    """The figures of one level: counts, rates over ``duration`` seconds, latencies (s) of successes."""
    ok = [r for r in results if r.outcome == "ok"]
    tokens = sum(r.output_tokens for r in ok)
    errors = list(dict.fromkeys(r.error for r in results if r.outcome != "ok"))
    summary = {
        "requests": len(results), "completed": len(ok),
        "failed": sum(r.outcome == "failed" for r in results),
        "truncated": sum(r.outcome == "truncated" for r in results),
        "duration_s": duration, "output_tokens": tokens,
        "requests_per_s": len(ok) / duration if duration > 0 else 0.0,
        "output_tokens_per_s": tokens / duration if duration > 0 else 0.0,
        "ttft_s": percentiles([r.ttft for r in ok]),
        "tpot_s": percentiles([t for r in ok if (t := r.tpot) is not None]),
        "itl_s": percentiles([gap for r in ok for gap in r.itl]),
        "e2e_s": percentiles([r.e2e for r in ok]),
        "errors": errors[:5],
    }
    if slos:
        good = sum(meets(r, slos) for r in ok)
        summary["goodput"] = {"slo_ms": {k: v * 1e3 for k, v in slos.items()}, "good_requests": good,
                              "requests_per_s": good / duration if duration > 0 else 0.0}
    return summary


def _client(timeout: float):
    import httpx

    # trust_env=False: no proxy from the environment; the load goes to the URL given, nowhere else
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0, pool=None), trust_env=False,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))


async def _run_level(client, url: str, model: str, workload: Workload, load: Load, length_field: str,
                     seed: int) -> tuple[list[RequestResult], float]:
    n = len(workload.prompts)
    times = arrival_times(n, load.request_rate, load.burstiness, np.random.default_rng(seed))
    gate = asyncio.Semaphore(load.max_concurrency or n)

    async def one(prompt: str) -> RequestResult:
        async with gate:  # the clock of a request starts when it is sent, not while it waits here
            return await send(client, url, request_body(model, prompt, workload.output_len, length_field))

    start = time.perf_counter()
    tasks = []
    for prompt, at in zip(workload.prompts, times):
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(prompt)))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


def normalise_base_url(base_url: str) -> str:
    """``http://host:port``, without a trailing ``/`` or ``/v1``."""
    url = base_url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--base-url must start with http:// or https://, got {base_url!r}")
    return url[: -len("/v1")] if url.endswith("/v1") else url


async def served_model(client, base_url: str) -> str:
    """The first model ``GET /v1/models`` names; ``ValueError`` if nothing answers like OpenAI's API."""
    import httpx

    try:
        response = await client.get(base_url + "/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except httpx.HTTPError as e:
        raise ValueError(f"no OpenAI-compatible server at {base_url}: {type(e).__name__} {e} (start one with "
                         "`llmrs serve`, or let `llmrs bench serve --compare` start them)") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise ValueError(f"{base_url}/v1/models did not answer with a model list") from None


async def _benchmark(base_url: str, loads: Sequence[Load], workloads: Callable[[int], Workload],
                     length_field: str, seed: int, slos: dict[str, float], timeout: float,
                     on_level: Callable[[str], None] | None) -> dict:
    async with _client(timeout) as client:
        model = await served_model(client, base_url)
        url = base_url + "/v1/completions"
        warm = workloads(-1)
        first = await send(client, url, request_body(model, warm.prompts[0], warm.output_len, length_field))
        if first.outcome != "ok":
            raise ValueError(f"the warm-up request to {url} did not succeed: {first.error}")
        runs = []
        for i, load in enumerate(loads):
            results, duration = await _run_level(client, url, model, workloads(i), load, length_field, seed + i)
            runs.append({"load": asdict(load), "label": load.label, **summarise(results, duration, slos)})
            if on_level is not None:
                on_level(f"{load.label}: {runs[-1]['completed']}/{len(results)} succeeded, "
                         f"{runs[-1]['output_tokens_per_s']:.1f} output tokens/s")
    return {"base_url": base_url, "model": model, "length_field": length_field, "runs": runs}


def benchmark(base_url: str, loads: Sequence[Load], workloads: Callable[[int], Workload], *,
              length_field: str = "ignore_eos", seed: int = 0, slos: dict[str, float] | None = None,
              timeout: float = 300.0, on_level: Callable[[str], None] | None = None) -> dict:
    """Run each of ``loads`` against the server at ``base_url``, after one warm-up request.

    ``workloads(i)`` gives level ``i``'s requests (``-1``: the warm-up's, whose first prompt is
    sent); ``timeout``: seconds a request may wait for its next byte; ``on_level`` hears a line
    after each level. Returns ``{"base_url", "model", "length_field", "runs": [{"load", "label", **summary}]}``,
    each summary as :func:`summarise` gives it. ``ValueError`` if the server cannot be reached
    or the warm-up does not succeed.
    """
    return asyncio.run(_benchmark(normalise_base_url(base_url), loads, workloads, length_field, seed,
                                  slos or {}, timeout, on_level))


__all__ = [
    "LENGTH_FIELDS",
    "Load",
    "RequestResult",
    "StreamParser",
    "Workload",
    "arrival_times",
    "benchmark",
    "meets",
    "normalise_base_url",
    "parse_goodput",
    "prompt_set_workload",
    "random_workload",
    "request_body",
    "send",
    "summarise",
]
