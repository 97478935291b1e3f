"""The continuous-batching engine (chapter 7): many requests, one model, one block pool.

``Engine.step()`` is one iteration: the scheduler picks the work (decode
tokens and prefill chunks of many requests), the model runs them in one
batched forward pass (every weight read once for all of them), and each
request whose chunk reached its end samples its next token with its own
sampler and checks its own stop conditions. Finished requests free their
blocks — into the prefix cache, if one is enabled — and waiting requests
take their place in the very next step: that is *continuous* batching.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from ..backends.base import Backend
from ..config import ModelConfig
from ..generate import Completion
from ..kv_cache.base import KVCache
from ..kv_cache.paged import PagedKVCache
from ..logprobs import TokenLogprob, check_top_logprobs, token_logprob
from ..output import OutputStream
from ..sampling import SamplingParams
from ..tokenizer import Tokenizer
from ..validation import check_max_tokens, normalise_stop, prompt_ids, stop_token_set
from .interface import PrefixCache, SchedulerInterface
from .parts import EngineParts
from .scheduler import Request, RequestRejected, RequestStatus
from .stats import RequestStats, StepStats


class Network(Protocol):
    """What the engine needs of a model: :class:`~llmrs_core.model.LlamaModel`, or a stand-in
    (chapter 7's notebook runs the scheduler on one that computes nothing)."""

    config: ModelConfig
    #: where the KV pool is allocated (``backend.xp``) and samplers come from (``backend.sampler``)
    backend: Backend

    def forward_batch(self, batch: list[tuple[list[int], KVCache]], last_only: bool = True) -> list[np.ndarray]:
        """One step: each ``(new ids, cache)`` pair's logits (``[1, vocab]`` with ``last_only``)."""
        ...


@dataclass
class RequestMetrics:
    """When things happened to one request (``time.perf_counter()`` seconds).

    ``token_times`` has one entry per sampled token, the first of which is
    ``first_token_time``; ``ttft`` is the time to first token and ``itl`` the
    inter-token latencies, as vLLM's benchmarks define them. ``scheduled_time``
    is when a step first took the request (its first prefill chunk), so the
    phases are vLLM's: queued (arrival to scheduled), prefill (scheduled to
    first token), decode (first token to the last) and e2e (arrival to finish).
    """

    arrival_time: float
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    scheduled_time: float | None = None

    @property
    def queue_time(self) -> float | None:
        return None if self.scheduled_time is None else self.scheduled_time - self.arrival_time

    @property
    def prefill_time(self) -> float | None:
        if self.scheduled_time is None or self.first_token_time is None:
            return None
        return self.first_token_time - self.scheduled_time

    @property
    def decode_time(self) -> float | None:
        return None if not self.token_times else self.token_times[-1] - self.token_times[0]

    @property
    def e2e(self) -> float | None:
        return None if self.finished_time is None else self.finished_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def itl(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]


@dataclass
class _RequestState:
    """Per-request generation state the scheduler does not need to know about."""

    sampler: Callable[..., int]
    stream: OutputStream
    metrics: RequestMetrics
    #: ``None``: no log-probabilities; ``k``: each token's, with its ``k`` best alternatives
    logprobs: int | None = None


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: its new token (if any) and new text."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    #: why the request failed, for finish reason "error"
    error: str | None = None
    #: with ``add_request(logprobs=k)``: one entry per id of ``new_token_ids``
    logprobs: tuple[TokenLogprob, ...] = ()


class Engine:
    """Serve many generation requests at once over a paged KV cache.

    Args:
        model, tokenizer: the network and its tokenizer.
        num_blocks, block_size: the KV block pool (SmolLM2, float32: 737 KiB a block of 16).
        max_num_seqs: requests running at once.
        max_num_batched_tokens: tokens computed in one step (chunked prefill).
        policy: ``"fcfs"`` or ``"priority"``.
        prefix_caching: reuse the KV blocks of shared prompt prefixes (radix tree).
        parts: the classes the engine's state is built from (default: the engine's own;
            ``load(backend="learner")``'s model gives the learner's, wrapped in their checks:
            ``Engine(model.network, ..., parts=model.parts)``).
        scheduler_class, prefix_cache_class: other implementations of
            :mod:`~llmrs_core.engine.interface`, in place of ``parts``' — chapter 7's
            exercises plug yours in here (used as given: the workbook's
            :func:`~llmrs_core.workbook.checked.checked_parts` wraps one in its checks).

    The block pool is ``parts.paged_kv_cache`` (the learner's is Exercise 5.7's ``PagedKVCache``
    where it is written).

    Each request samples with the sampler the model's backend makes for its
    parameters (``backend.sampler``: the learner backend's is the learner's),
    and turns tokens into text through its own
    :class:`~llmrs_core.output.OutputStream`, as ``model.generate`` does. The
    KV pool lives in the backend's array module.
    """

    def __init__(
        self,
        model: Network,
        tokenizer: Tokenizer | None,
        num_blocks: int = 512,
        block_size: int = 16,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        policy: str = "fcfs",
        prefix_caching: bool = True,
        scheduler_class: type | None = None,
        prefix_cache_class: type | None = None,
        parts: EngineParts | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.parts = parts = EngineParts.engines_own() if parts is None else parts
        self.cache: PagedKVCache = parts.paged_kv_cache(
            model.config, num_blocks=num_blocks, block_size=block_size, xp=model.backend.xp
        )
        self.make_sampler: Callable[[SamplingParams], Callable[..., int]] = model.backend.sampler
        scheduler_class = scheduler_class or parts.scheduler
        prefix_cache_class = prefix_cache_class or parts.prefix_cache
        self.prefix_cache: PrefixCache | None = (
            prefix_cache_class(self.cache.allocator, block_size) if prefix_caching else None)
        self.scheduler: SchedulerInterface = scheduler_class(
            self.cache, max_num_seqs, max_num_batched_tokens, policy, self.prefix_cache)
        self.requests: dict[str, Request] = {}
        self._states: dict[str, _RequestState] = {}
        self._ids = itertools.count()
        self.steps = 0

    # -- requests -------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 128,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] | None = None,
        priority: int = 0,
        request_id: str | None = None,
        ignore_eos: bool = False,
        allow_special: bool = False,
        logprobs: int | None = None,
    ) -> str:
        """Queue a request; returns its id. Raises ``RequestRejected`` (a ``ValueError``
        naming the problem) if it is malformed or can never run: nothing is queued then.

        A text prompt is encoded as ordinary text (special tokens in it stay text)
        unless ``allow_special``; token ids are checked against the vocabulary
        here, so that a bad id fails its own request, not every later step.
        ``stop_token_ids`` end the request (default: the tokenizer's end-of-turn
        tokens, ``Tokenizer.stop_token_ids``); ``ignore_eos`` ignores them all and
        generates exactly ``max_tokens`` (for benchmarks). ``logprobs=k`` (0 to 20)
        gives every generated token's log-probability under the raw logits, with
        its ``k`` most likely alternatives (:mod:`llmrs_core.logprobs`).
        """
        c = self.model.config
        try:
            max_tokens = check_max_tokens(max_tokens)
            stop = normalise_stop(stop)
            ids = prompt_ids(prompt, self.tokenizer, c.vocab_size, c.context_length, max_tokens, allow_special)
            if logprobs is not None:
                logprobs = check_top_logprobs(logprobs, "logprobs")
            sampling = sampling if sampling is not None else SamplingParams()
            if not isinstance(sampling, SamplingParams):
                raise ValueError(f"sampling must be SamplingParams, got {type(sampling).__name__}")
        except RequestRejected:
            raise
        except ValueError as e:
            raise RequestRejected(str(e)) from None
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self.requests and not self.requests[rid].finished:
            raise ValueError(f"a request with id {rid!r} is already in flight")
        request = Request(rid, ids, max_tokens, priority)
        stop_ids = stop_token_set(self.tokenizer, stop_token_ids, ignore_eos)
        state = _RequestState(
            sampler=self.make_sampler(sampling),
            stream=OutputStream(self.tokenizer, max_tokens, stop, stop_ids),
            metrics=RequestMetrics(arrival_time=time.perf_counter()),
            logprobs=logprobs,
        )
        self.scheduler.add(request)
        self.requests[rid] = request
        self._states[rid] = state
        return rid

    def abort(self, request_id: str) -> None:
        """Cancel a request; its blocks are free when this returns."""
        request = self.requests.get(request_id)
        if request is not None and not request.finished:
            self.scheduler.abort(request)
            state = self._states[request_id]
            state.stream.abort()
            state.metrics.finished_time = time.perf_counter()

    # -- the loop --------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One scheduler iteration, one batched forward pass; outputs of requests that advanced.

        A request that makes the step fail (its forward pass or its sampler raises)
        fails alone: it finishes with reason ``"error"`` and the message (with its
        id) in its output, its blocks are freed, and the other requests go on.
        """
        chunks = self.scheduler.schedule()
        if not chunks:
            return []
        self.steps += 1
        batch = []
        scheduled = time.perf_counter()
        for chunk in chunks:
            r = chunk.request
            m = self._states[r.request_id].metrics
            if m.scheduled_time is None:
                m.scheduled_time = scheduled
            batch.append((r.all_ids[r.num_computed : r.num_computed + chunk.n_tokens],
                          self.cache.sequence(r.request_id)))
        results = self._forward_isolated(batch)
        now = time.perf_counter()
        outputs = []
        for chunk, result in zip(chunks, results):
            r = chunk.request
            if isinstance(result, Exception):
                outputs.append(self._fail(r, "its forward pass", result, now))
                continue
            before = r.num_computed
            r.num_computed += chunk.n_tokens
            if before < len(r.prompt_ids) <= r.num_computed:
                self.scheduler.cache_prompt(r)  # later arrivals can share this prompt already
            if r.num_computed < r.num_tokens:
                continue  # a prefill chunk that has not reached the end of the prompt yet
            state = self._states[r.request_id]
            try:
                token = state.sampler(result[0], r.all_ids)
                lp = None
                if state.logprobs is not None:
                    lp = token_logprob(self.model.backend.to_host(result[0]), token, state.logprobs)
            except Exception as e:  # a sampler (the learner's, say) that raises fails its request only
                outputs.append(self._fail(r, "sampling", e, now))
                continue
            outputs.append(self._advance(r, token, now, lp))
        return outputs

    def _forward_isolated(self, batch: list) -> list:
        """Logits for each sequence of ``batch``, or the exception that sequence raised.

        The batch runs as one forward pass; only if that raises is each sequence
        run alone, to find which one fails (a failed pass advanced no cache, and
        rewriting the same positions is harmless).
        """
        try:
            return self.model.forward_batch(batch, last_only=True)
        except Exception as e:
            if len(batch) == 1:
                return [e]
        results: list = []
        for item in batch:
            try:
                results.append(self.model.forward_batch([item], last_only=True)[0])
            except Exception as e:
                results.append(e)
        return results

    def probe(self) -> None:
        """Run a known-good input through the model: one token (id 0) on a one-token KV cache of
        its own, outside the block pool (no request's state is touched). Returns if the model
        computes finite logits; raises what the forward pass raised otherwise (a broken backend or
        device: ``NonFiniteError`` for NaN logits). The server's engine loop runs it after a step
        in which every request failed, to tell a broken engine from requests that fail alone."""
        config, backend = self.model.config, self.model.backend
        cache = self.parts.kv_cache(config, 1, xp=backend.xp)
        self.model.forward_batch([([0], cache)], last_only=True)

    def _advance(self, r: Request, token: int, now: float, logprob: TokenLogprob | None = None) -> RequestOutput:
        """Feed ``r``'s new token to its output stream; finish it if that ended it."""
        state = self._states[r.request_id]
        if state.metrics.first_token_time is None:
            state.metrics.first_token_time = now
        state.metrics.token_times.append(now)
        stream = state.stream
        before = len(stream.token_ids)
        delta, finish = stream.feed(token)
        new_ids = stream.token_ids[before:]  # empty for an end-of-turn token
        r.output_ids.extend(new_ids)
        if finish is not None:
            self.scheduler.finish(r, finish)
            state.metrics.finished_time = now
        # a token the output leaves out (end of turn) has no entry: logprobs pair with new_ids
        logprobs = (logprob,) if logprob is not None and new_ids else ()
        return RequestOutput(r.request_id, new_ids, delta, finish is not None, finish, logprobs=logprobs)

    def _fail(self, r: Request, where: str, error: Exception, now: float) -> RequestOutput:
        message = f"request {r.request_id!r} failed in {where}: {type(error).__name__}: {error}"
        state = self._states[r.request_id]
        self.scheduler.abort(r)  # frees its blocks; none go to the prefix cache
        r.finish_reason = "error"
        delta = state.stream.fail(message)
        state.metrics.finished_time = now
        return RequestOutput(r.request_id, [], delta, True, "error", error=message)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def check_progress(self, outputs: list[RequestOutput]) -> None:
        """Raise ``RuntimeError`` if the step that gave ``outputs`` could make no progress: work is
        waiting but nothing runs (a waiting request cannot get blocks), so stepping again would spin."""
        if not outputs and self.scheduler.has_work and not self.scheduler.running:
            raise RuntimeError("the scheduler made no progress: a waiting request cannot get blocks")

    def run(self) -> Iterator[RequestOutput]:
        """Step until every request is done, yielding outputs as they come (streaming)."""
        while self.scheduler.has_work:
            outputs = self.step()
            self.check_progress(outputs)
            yield from outputs

    def release(self, request_id: str) -> None:
        """Forget a finished (or aborted) request: its state, metrics and completion are gone.

        A long-running server calls this for every request it is done with, so that the
        engine holds no state for requests that are over (``requests`` does not grow).
        ``ValueError`` if the request is still in flight; unknown ids are ignored.
        """
        request = self.requests.get(request_id)
        if request is None:
            return
        if not request.finished:
            raise ValueError(f"request {request_id!r} is still in flight: abort it first")
        del self.requests[request_id]
        del self._states[request_id]

    def completion(self, request_id: str) -> Completion:
        """The result of a finished request, as ``model.generate`` returns it."""
        r = self.requests[request_id]
        state = self._states[request_id]
        m = state.metrics
        decode = (m.token_times[-1] - m.token_times[0]) if len(m.token_times) > 1 else 0.0
        return Completion(
            token_ids=list(r.output_ids), text=state.stream.text, finish_reason=r.finish_reason or "abort",
            prompt_tokens=len(r.prompt_ids), prefill_seconds=m.ttft or 0.0, decode_seconds=decode,
            stop_reason=state.stream.stop_reason, error=state.stream.error,
        )

    def request_metrics(self, request_id: str) -> RequestMetrics:
        """Arrival, first-token and per-token times of a request (``KeyError`` if unknown)."""
        try:
            return self._states[request_id].metrics
        except KeyError:
            raise KeyError(f"no request {request_id!r} in this engine") from None

    def generate(
        self, prompts: Sequence[str | Sequence[int]], max_tokens: int = 128,
        sampling: SamplingParams | None = None, stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] | None = None,
        on_text: Callable[[int, str], None] | None = None,
    ) -> list[Completion]:
        """Run ``prompts`` together to completion; one Completion per prompt, in order.

        ``on_text(i, text)`` receives prompt ``i``'s text pieces as they become final.
        """
        ids = [self.add_request(p, max_tokens, sampling, stop, stop_token_ids) for p in prompts]
        index = {rid: i for i, rid in enumerate(ids)}
        for out in self.run():
            if on_text is not None and out.new_text:
                on_text(index[out.request_id], out.new_text)
        return [self.completion(i) for i in ids]

    def stats(self) -> dict[str, float]:
        pc = self.prefix_cache
        return {
            "steps": self.steps,
            "preemptions": self.scheduler.num_preemptions,
            "prefix_hit_rate": pc.hit_rate if pc else 0.0,
            "prefix_tokens_saved": pc.hit_tokens if pc else 0,
            "blocks_free": self.cache.allocator.num_free,
            "blocks_cached": pc.num_blocks if pc else 0,
        }

    def step_stats(self, request_ids: Iterable[str] = ()) -> StepStats:
        """The engine now, for the server's metrics, logs and loop (:mod:`.stats`): the queues,
        the block pool, the cumulative counters, and the named requests it still knows."""
        pc = self.prefix_cache
        requests = {}
        for rid in request_ids:
            r = self.requests.get(rid)
            if r is None:
                continue
            state = self._states[rid]
            requests[rid] = RequestStats(len(r.prompt_ids), tuple(r.output_ids), r.num_computed, state.metrics,
                                         state.stream.text)
        held = set().union(*self.cache.tables.values())  # blocks in some request's table
        return StepStats(
            engine_id=id(self), running=tuple(r.request_id for r in self.scheduler.running),
            num_waiting=len(self.scheduler.waiting), kv_blocks_used=len(held),
            kv_blocks_total=self.cache.allocator.num_blocks, num_preemptions=self.scheduler.num_preemptions,
            prefix_cache_queries=pc.lookup_tokens if pc else 0, prefix_cache_hits=pc.hit_tokens if pc else 0,
            requests=requests,
        )


__all__ = ["Engine", "RequestMetrics", "RequestOutput", "RequestRejected", "RequestStatus"]
