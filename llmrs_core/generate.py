"""The autoregressive generation loop (introduced in chapter 4).

Prefill runs the whole prompt through the model once, filling the KV cache;
then each decode step feeds the one token just chosen and reads the next
token's logits. Generation stops at an end-of-sequence token, at a stop
string, or after ``max_tokens``. Text is streamed through a
:class:`~llmrs_core.tokenizer.StreamDecoder` so no broken UTF-8 is ever
emitted, and text that might be the start of a stop string is held back
until it is clear that it is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .model import LlamaModel
from .sampling import Sampler, SamplingParams
from .tokenizer import Tokenizer


@dataclass
class Completion:
    """The result of one generation.

    ``token_ids`` are the generated tokens (not the prompt, not the final
    end-of-sequence token); ``text`` is their text, cut before a stop string;
    ``finish_reason`` is ``"stop"`` (end-of-sequence or a stop string) or
    ``"length"`` (``max_tokens`` reached).
    """

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str | int | None = field(default=None, repr=False)

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens after the first, per second of decode steps."""
        steps = max(len(self.token_ids) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


class StopStringFilter:
    """Passes text through, holding back any tail that could begin a stop string."""

    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.pending = ""
        self.hit: str | None = None

    def feed(self, text: str) -> str:
        self.pending += text
        for s in self.stops:
            i = self.pending.find(s)
            if i >= 0:
                self.hit = s
                out, self.pending = self.pending[:i], ""
                return out
        hold = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.pending)), 0, -1):
                if self.pending.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        out = self.pending[: len(self.pending) - hold]
        self.pending = self.pending[len(out) :]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def generate_ids(
    model: LlamaModel,
    tokenizer: Tokenizer,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int = 128,
    sampling: SamplingParams | None = None,
    stop: Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    on_text: Callable[[str], None] | None = None,
    sampler: Callable[..., int] | None = None,
) -> Completion:
    """Generate up to ``max_tokens`` tokens after ``prompt_ids``.

    ``on_text`` receives text pieces as they become final (for streaming).
    ``sampler`` overrides the token choice (called as ``sampler(logits, history)``).
    """
    if len(prompt_ids) == 0:
        raise ValueError("the prompt is empty: give at least one token")
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    limit = model.config.context_length
    if len(prompt_ids) + max_tokens > limit:
        raise ValueError(
            f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds the model's "
            f"context length {limit}"
        )
    choose = sampler or Sampler(sampling)
    eos = set(stop_token_ids)
    if tokenizer.eos_token_id is not None:
        eos.add(tokenizer.eos_token_id)
    decoder = tokenizer.stream_decoder(skip_special=True)
    stops = StopStringFilter(stop)
    emitted: list[str] = []

    def emit(piece: str) -> None:
        if piece:
            emitted.append(piece)
            if on_text is not None:
                on_text(piece)

    cache = model.new_cache(len(prompt_ids) + max_tokens)
    history = list(prompt_ids)
    generated: list[int] = []
    finish, stop_reason = "length", None
    start = time.perf_counter()
    logits = model.forward(prompt_ids, cache, last_only=True)[0] if max_tokens else None
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for step in range(max_tokens):
        if step:
            logits = model.forward([generated[-1]], cache, last_only=True)[0]
        token = choose(logits, history)
        if token in eos:
            finish, stop_reason = "stop", token
            break
        generated.append(token)
        history.append(token)
        emit(stops.feed(decoder.add(token)))
        if stops.hit is not None:
            finish, stop_reason = "stop", stops.hit
            break
    decode = time.perf_counter() - start
    if stops.hit is None:
        emit(stops.feed(decoder.flush()))
        emit(stops.flush())
    return Completion(
        token_ids=generated,
        text="".join(emitted),
        finish_reason=finish,
        prompt_tokens=len(prompt_ids),
        prefill_seconds=prefill,
        decode_seconds=decode,
        stop_reason=stop_reason,
    )
