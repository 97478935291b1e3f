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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from ..generate import Completion, StopStringFilter
from ..kv_cache.paged import PagedKVCache
from ..model import LlamaModel
from ..sampling import Sampler, SamplingParams
from ..tokenizer import Tokenizer
from .radix_cache import RadixCache
from .scheduler import Request, RequestRejected, RequestStatus, Scheduler


@dataclass
class _Progress:
    """Per-request generation state the scheduler does not need to know about."""

    sampler: Callable[..., int]
    stop_ids: frozenset[int]
    decoder: object
    stops: StopStringFilter
    text: list[str] = field(default_factory=list)
    arrival_time: float = 0.0
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request: its new token (if any) and new text."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None


class Engine:
    """Serve many generation requests at once over a paged KV cache.

    Args:
        model, tokenizer: the network and its tokenizer.
        num_blocks, block_size: the KV block pool (SmolLM2, float32: 737 KiB a block of 16).
        max_num_seqs: requests running at once.
        max_num_batched_tokens: tokens computed in one step (chunked prefill).
        policy: ``"fcfs"`` or ``"priority"``.
        prefix_caching: reuse the KV blocks of shared prompt prefixes (radix tree).
        scheduler_class, prefix_cache_class: other implementations with the same
            interface — chapter 7's exercises plug yours in here.
    """

    def __init__(
        self,
        model: LlamaModel,
        tokenizer: Tokenizer,
        num_blocks: int = 512,
        block_size: int = 16,
        max_num_seqs: int = 16,
        max_num_batched_tokens: int = 512,
        policy: str = "fcfs",
        prefix_caching: bool = True,
        scheduler_class: type = Scheduler,
        prefix_cache_class: type = RadixCache,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.cache = PagedKVCache(model.config, num_blocks=num_blocks, block_size=block_size)
        self.prefix_cache = prefix_cache_class(self.cache.allocator, block_size) if prefix_caching else None
        self.scheduler = scheduler_class(self.cache, max_num_seqs, max_num_batched_tokens, policy, self.prefix_cache)
        self.requests: dict[str, Request] = {}
        self._ids = itertools.count()
        self.steps = 0

    # -- requests -------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | Sequence[int],
        max_tokens: int = 128,
        sampling: SamplingParams | None = None,
        stop: Sequence[str] = (),
        stop_token_ids: Sequence[int] = (),
        priority: int = 0,
        request_id: str | None = None,
        ignore_eos: bool = False,
    ) -> str:
        """Queue a request; returns its id. Raises ``RequestRejected`` if it can never run.

        ``ignore_eos`` generates exactly ``max_tokens`` (for benchmarks).
        """
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else [int(i) for i in prompt]
        if not ids:
            raise RequestRejected("the prompt is empty: give at least one token")
        if max_tokens < 1:
            raise RequestRejected(f"max_tokens must be >= 1, got {max_tokens}")
        limit = self.model.config.context_length
        if len(ids) + max_tokens > limit:
            raise RequestRejected(
                f"prompt ({len(ids)} tokens) + max_tokens ({max_tokens}) exceeds the context length {limit}"
            )
        rid = request_id or f"req-{next(self._ids)}"
        if rid in self.requests and not self.requests[rid].finished:
            raise ValueError(f"a request with id {rid!r} is already in flight")
        request = Request(rid, ids, max_tokens, priority)
        stop_ids = set(stop_token_ids)
        if self.tokenizer.eos_token_id is not None and not ignore_eos:
            stop_ids.add(self.tokenizer.eos_token_id)
        request.state = _Progress(
            sampler=Sampler(sampling), stop_ids=frozenset(stop_ids),
            decoder=self.tokenizer.stream_decoder(skip_special=True), stops=StopStringFilter(stop),
            arrival_time=time.perf_counter(),
        )
        self.scheduler.add(request)
        self.requests[rid] = request
        return rid

    def abort(self, request_id: str) -> None:
        """Cancel a request; its blocks are free when this returns."""
        request = self.requests.get(request_id)
        if request is not None and not request.finished:
            self.scheduler.abort(request)

    # -- the loop --------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """One scheduler iteration, one batched forward pass; outputs of requests that advanced."""
        chunks = self.scheduler.schedule()
        if not chunks:
            return []
        self.steps += 1
        batch = []
        for chunk in chunks:
            r = chunk.request
            batch.append((r.all_ids[r.num_computed : r.num_computed + chunk.n_tokens],
                          self.cache.sequence(r.request_id)))
        logits = self.model.forward_batch(batch, last_only=True)
        now = time.perf_counter()
        outputs = []
        for chunk, lg in zip(chunks, logits):
            r = chunk.request
            before = r.num_computed
            r.num_computed += chunk.n_tokens
            if before < len(r.prompt_ids) <= r.num_computed:
                self.scheduler.cache_prompt(r)  # later arrivals can share this prompt already
            if r.num_computed < r.num_tokens:
                continue  # a prefill chunk that has not reached the end of the prompt yet
            outputs.append(self._advance(r, lg[0], now))
        return outputs

    def _advance(self, r: Request, logits, now: float) -> RequestOutput:
        p: _Progress = r.state
        token = p.sampler(logits, r.all_ids)
        if p.first_token_time is None:
            p.first_token_time = now
        p.token_times.append(now)
        if token in p.stop_ids:
            self.scheduler.finish(r, "stop")
            tail = p.stops.feed(p.decoder.flush()) + p.stops.flush()
            p.text.append(tail)
            return RequestOutput(r.request_id, [], tail, True, "stop")
        r.output_ids.append(token)
        piece = p.stops.feed(p.decoder.add(token))
        finished, reason = False, None
        if p.stops.hit is not None:
            finished, reason = True, "stop"
        elif len(r.output_ids) >= r.max_tokens:
            finished, reason = True, "length"
            piece += p.stops.feed(p.decoder.flush()) + p.stops.flush()
        p.text.append(piece)
        if finished:
            self.scheduler.finish(r, reason)
        return RequestOutput(r.request_id, [token], piece, finished, reason)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work

    def run(self) -> Iterator[RequestOutput]:
        """Step until every request is done, yielding outputs as they come (streaming)."""
        while self.scheduler.has_work:
            outputs = self.step()
            if not outputs and self.scheduler.has_work and not self.scheduler.running:
                raise RuntimeError("the scheduler made no progress: a waiting request cannot get blocks")
            yield from outputs

    def completion(self, request_id: str) -> Completion:
        """The result of a finished request, as ``model.generate`` returns it."""
        r = self.requests[request_id]
        p: _Progress = r.state
        first = (p.first_token_time - p.arrival_time) if p.first_token_time else 0.0
        decode = (p.token_times[-1] - p.token_times[0]) if len(p.token_times) > 1 else 0.0
        return Completion(
            token_ids=list(r.output_ids), text="".join(p.text), finish_reason=r.finish_reason or "abort",
            prompt_tokens=len(r.prompt_ids), prefill_seconds=first, decode_seconds=decode,
        )

    def generate(
        self, prompts: Sequence[str | Sequence[int]], max_tokens: int = 128,
        sampling: SamplingParams | None = None, stop: Sequence[str] = (), stop_token_ids: Sequence[int] = (),
    ) -> list[Completion]:
        """Run ``prompts`` together to completion; one Completion per prompt, in order."""
        ids = [self.add_request(p, max_tokens, sampling, stop, stop_token_ids) for p in prompts]
        for _ in self.run():
            pass
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


__all__ = ["Engine", "RequestOutput", "RequestRejected", "RequestStatus"]
