"""Checks of what callers hand the engine, in one place (the front door of every path).

``model.generate``, ``Engine.add_request``, the CLI and the server (chapter
11) take prompts, token ids, token budgets and stop strings from people and
programs that make mistakes. Each check here turns a mistake into a
``ValueError`` that names the parameter, what was given and what is
accepted — never an internal error from deep inside, and never a silent
wrong answer (a string of stop *characters*, bytes taken for token ids).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def is_integer(value: Any) -> bool:
    """An int or NumPy integer, but not a bool (``True`` is no token id or count)."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int within ``[minimum, maximum]``; ``ValueError`` naming ``name`` otherwise."""
    if not is_integer(value):
        raise ValueError(f"{name} must be an integer, got {_describe(value)}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be at most {maximum}, got {value}")
    return value


def check_float(name: str, value: Any) -> float:
    """``value`` as a finite float (ints accepted); ``ValueError`` naming ``name`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating, np.integer)):
        raise ValueError(f"{name} must be a number, got {_describe(value)}")
    try:
        value = float(value)
    except OverflowError:  # an int too large for a float (10**400)
        raise ValueError(f"{name} must be a finite number, got an integer of {len(str(value))} digits") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value}")
    return value


def check_max_tokens(value: Any) -> int:
    """The generation budget: an integer >= 1 (as vLLM and the OpenAI API require)."""
    return check_int("max_tokens", value, minimum=1)


#: the most stop strings a request may give (OpenAI's API allows 4), and the longest one, in characters:
#: the engine checks every generated character against them (``output.StopStringFilter``)
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


def normalise_stop(stop: Any) -> tuple[str, ...]:
    """Stop strings as a tuple: one string is *one* stop string (not its characters). At most
    :data:`MAX_STOP_STRINGS` strings of at most :data:`MAX_STOP_CHARS` characters each."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, (bytes, bytearray)) or not isinstance(stop, Sequence):
        raise ValueError(f"stop must be a string or a list of strings, got {_describe(stop)}")
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop has {len(stop):,} strings; the limit is {MAX_STOP_STRINGS}")
    for i, s in enumerate(stop):
        if not isinstance(s, str):
            raise ValueError(f"stop must be a string or a list of strings; one entry is {_describe(s)}")
        if len(s) > MAX_STOP_CHARS:
            raise ValueError(f"stop string {i} is {len(s):,} characters long; the limit is {MAX_STOP_CHARS}")
    return tuple(s for s in stop if s)


def stop_token_set(tokenizer: Tokenizer | None, stop_token_ids: Sequence[int] | None,
                   ignore_eos: bool = False) -> set[int]:
    """The token ids that end a generation: ``stop_token_ids`` (``None``: the tokenizer's
    end-of-turn tokens, ``Tokenizer.stop_token_ids``) plus the tokenizer's EOS; none at all
    with ``ignore_eos``. ``tokenizer`` may be ``None`` (a model without one)."""
    if ignore_eos:
        return set()
    if stop_token_ids is not None:
        ids = set(stop_token_ids)
    else:
        ids = set(tokenizer.stop_token_ids) if tokenizer is not None else set()
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def check_token_ids(ids: Any, vocab_size: int, what: str = "prompt") -> list[int]:
    """A non-empty sequence of integer token ids, each in ``0 .. vocab_size - 1``."""
    if isinstance(ids, (str, bytes, bytearray)) or not isinstance(ids, (Sequence, np.ndarray)):
        raise ValueError(f"{what} must be text or a list of token ids, got {_describe(ids)}")
    out = []
    for i, t in enumerate(ids):
        if not is_integer(t):
            raise ValueError(f"{what} token {i} must be an integer token id, got {_describe(t)}")
        t = int(t)
        if not 0 <= t < vocab_size:
            raise ValueError(f"{what} token {i} is id {t}, outside the vocabulary (0..{vocab_size - 1})")
        out.append(t)
    if not out:
        raise ValueError(f"the {what} is empty: give at least one token")
    return out


def check_prompt(prompt: Any) -> str | Sequence[int]:
    """A prompt is text (``str``) or token ids; bytes and None are refused with a reason."""
    if isinstance(prompt, (bytes, bytearray)):
        raise ValueError("prompt is bytes: decode it to text first (prompt.decode('utf-8')), or give token ids")
    if prompt is None:
        raise ValueError("prompt is None: give text or a list of token ids")
    if not isinstance(prompt, (str, Sequence, np.ndarray)):
        raise ValueError(f"prompt must be text or a list of token ids, got {_describe(prompt)}")
    return prompt


def check_fits_context(prompt_tokens: int, max_tokens: int, context_length: int) -> None:
    """The prompt plus the generation budget must fit the model's context; the message gives
    both numbers, as vLLM's does."""
    if prompt_tokens + max_tokens > context_length:
        raise ValueError(
            f"prompt ({prompt_tokens} tokens) + max_tokens ({max_tokens}) exceeds the model's context "
            f"length {context_length}"
        )


#: text longer than this many characters per context token is bounded before it is encoded
PRECHECK_CHARS_PER_TOKEN = 16


def precheck_text(texts: Sequence[str], tokenizer: Tokenizer, context_length: int, max_tokens: int,
                  what: str = "prompt") -> None:
    """Refuse text that cannot fit the context, *before* it is encoded (or rendered).

    ``texts`` are the strings that will be encoded together (one prompt, or every string a
    chat template sees); ``max_tokens`` the generation budget that must fit beside them (0:
    none, as for ``/tokenize``). Encoding is fast (O(n log n)) but pure Python, so only text
    far larger than any context is bounded here, in O(n): ``tokenizer.min_token_count`` (a
    lower bound on the tokens) of their concatenation, which must leave room for
    ``max_tokens``. Shorter text gets its exact count once encoded. ``ValueError`` naming
    ``what``, the bytes, the bound and the context length.
    """
    if sum(len(t) for t in texts) <= PRECHECK_CHARS_PER_TOKEN * context_length:
        return
    text = "".join(texts)
    at_least = tokenizer.min_token_count(text)
    if at_least + max_tokens > context_length:
        budget = f" + max_tokens ({max_tokens})" if max_tokens else ""
        raise ValueError(
            f"{what} ({len(text.encode('utf-8', errors='surrogatepass')):,} bytes, at least {at_least:,} "
            f"tokens){budget} exceeds the model's context length {context_length}"
        )


def precheck_chat(messages: Any, tokenizer: Tokenizer, context_length: int, max_tokens: int,
                  data: Any = None) -> None:
    """:func:`precheck_text` for chat ``messages``, before the template renders them: every
    string the template sees (roles, contents, names..., and in ``data`` the tools and template
    variables) counts, and there may be at most ``context_length`` messages. ``ValueError``
    naming ``messages`` otherwise."""
    from .tokenizer.chat import check_messages, message_texts

    check_messages(messages)
    if len(messages) > context_length:
        raise ValueError(f"messages: {len(messages):,} messages cannot fit the model's context length "
                         f"{context_length}")
    precheck_text(message_texts([messages, data]), tokenizer, context_length, max_tokens, "messages")


def prompt_ids(
    prompt: Any,
    tokenizer: Tokenizer | None,
    vocab_size: int,
    context_length: int,
    max_tokens: int,
    allow_special: bool = False,
) -> list[int]:
    """The token ids of a checked prompt that fits the context with ``max_tokens`` more.

    Text is encoded as ordinary text: ``<|im_start|>`` typed by a user is
    text, not a control token, unless the caller opts in with
    ``allow_special`` (the chat path builds its control tokens itself).
    BOS comes first where the model's rule says so (``Tokenizer.encode_prompt``:
    Llama 2/3 and Phi-3 yes, SmolLM2 and Qwen2 no); token ids are taken as given.
    Text too long to fit is refused *before* it is encoded, from a cheap
    lower bound on its token count, so a huge prompt cannot occupy the
    tokenizer for minutes only to be refused.
    """
    prompt = check_prompt(prompt)
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ValueError("this model has no tokenizer: give token ids, not text")
        precheck_text([prompt], tokenizer, context_length, max_tokens)
        ids = tokenizer.encode_prompt(prompt, allow_special=allow_special)  # BOS by the model's rule
    else:
        ids = prompt
    ids = check_token_ids(ids, vocab_size)
    check_fits_context(len(ids), max_tokens, context_length)
    return ids


__all__ = [
    "MAX_STOP_CHARS",
    "MAX_STOP_STRINGS",
    "check_fits_context",
    "check_float",
    "check_int",
    "check_max_tokens",
    "check_prompt",
    "check_token_ids",
    "is_integer",
    "normalise_stop",
    "precheck_chat",
    "precheck_text",
    "prompt_ids",
]
