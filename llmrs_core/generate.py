"""The autoregressive generation loop (introduced in chapter 4).

Prefill runs the whole prompt through the model once, filling the KV cache;
then each decode step feeds the one token just chosen and reads the next
token's logits. Generation stops at an end-of-sequence token, at a stop
string, or after ``max_tokens``. Tokens become text through the request's
:class:`~llmrs_core.output.OutputStream` — the same one the batching engine
uses — so no broken UTF-8 is ever emitted, and text that might be the start
of a stop string is held back until it is clear that it is not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .model import LlamaModel
from .output import OutputStream
from .sampling import Sampler, SamplingParams
from .tokenizer import Tokenizer
from .validation import check_fits_context, check_token_ids, normalise_stop, stop_token_set


@dataclass
class Completion:
    """The result of one generation.

    ``token_ids`` are the generated tokens (not the prompt, not the final
    end-of-sequence token); ``text`` is their text, cut before a stop string;
    ``finish_reason`` is ``"stop"`` (end-of-sequence or a stop string),
    ``"length"`` (``max_tokens`` reached), ``"abort"`` (cancelled, in the engine) or
    ``"error"`` (the engine could not compute it; ``error`` says why).
    """

    token_ids: list[int]
    text: str
    finish_reason: str
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str | int | None = field(default=None, repr=False)
    error: str | None = field(default=None, repr=False)

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens after the first, per second of decode steps."""
        steps = max(len(self.token_ids) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def generate_ids(
    model: LlamaModel,
    tokenizer: Tokenizer | None,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int = 128,
    sampling: SamplingParams | None = None,
    stop: str | Sequence[str] = (),
    stop_token_ids: Sequence[int] = (),
    on_text: Callable[[str], None] | None = None,
    sampler: Callable[..., int] | None = None,
) -> Completion:
    """Generate up to ``max_tokens`` (>= 1) tokens after ``prompt_ids``.

    Generation ends at any of ``stop_token_ids`` or the tokenizer's EOS, at a
    ``stop`` string, or after ``max_tokens``. ``on_text`` receives text pieces
    as they become final (for streaming). ``sampler`` overrides the token
    choice (called as ``sampler(logits, history)``). ``tokenizer`` may be
    ``None`` for a model without one: then the completion has ids and no text.
    """
    prompt_ids = check_token_ids(prompt_ids, model.config.vocab_size)
    check_fits_context(len(prompt_ids), max_tokens, model.config.context_length)
    choose = sampler or Sampler(sampling)
    stream = OutputStream(tokenizer, max_tokens, normalise_stop(stop), stop_token_set(tokenizer, stop_token_ids))
    cache = model.new_cache(len(prompt_ids) + max_tokens)
    history = list(prompt_ids)
    start = time.perf_counter()
    logits = model.forward(prompt_ids, cache, last_only=True)[0]
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    while True:
        token = choose(logits, history)
        delta, finish = stream.feed(token)
        if delta and on_text is not None:
            on_text(delta)
        if finish is not None:
            break
        history.append(token)
        logits = model.forward([token], cache, last_only=True)[0]
    decode = time.perf_counter() - start
    return Completion(
        token_ids=stream.token_ids,
        text=stream.text,
        finish_reason=stream.finish_reason,
        prompt_tokens=len(prompt_ids),
        prefill_seconds=prefill,
        decode_seconds=decode,
        stop_reason=stream.stop_reason,
    )
