"""Chapter 2 — Tokenization and the Vocabulary: your exercises.

Exercise 2.4  Implementing a Simple BPE Tokenizer  (ch02_tokenization.ipynb, section 2.4)
Exercise 2.5  Building a Prompt Assembler          (ch02_tokenization.ipynb, section 2.5)

Fill in every function that raises ``NotImplementedError``, then check your
work with ``make test-chapter 2`` (or ``make test-exercise E=2.4``).

Vocabulary of this chapter:
    word      a piece of text from pre-tokenisation; BPE never merges across words
    piece     a token's text in "byte stand-in" characters, e.g. "Ġthe" for " the"
    ranks     {(left, right): rank}; lower rank = learned earlier = merged first
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmrs_core.tokenizer.chat import SMOLLM2_DEFAULT_SYSTEM, PromptTooLongError

if TYPE_CHECKING:
    from llmrs_core.tokenizer import Tokenizer

__all__ = [
    "PromptTooLongError",
    "bpe_merge_word",
    "bytes_to_unicode",
    "decode_ordinary",
    "encode_chat",
    "encode_ordinary",
    "fit_to_budget",
    "pretokenize",
    "render_chatml",
    "train_bpe",
]


# -- Exercise 2.4: a byte-level BPE tokenizer ---------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte value (0..255) to a printable character.

    Bytes that are printable Latin-1 characters map to themselves:
    ``"!"..."~"`` (33-126), ``"¡"..."¬"`` (161-172) and ``"®"..."ÿ"`` (174-255).
    The remaining 68 bytes, in increasing order, map to ``chr(256)``,
    ``chr(257)``, ... So the space (32) becomes ``"Ġ"`` (U+0120) and the newline
    (10) ``"Ċ"`` (U+010A). Return a dict with 256 entries.
    """
    raise NotImplementedError(
        "Exercise 2.4 `bytes_to_unicode`: not implemented yet — see ch02_tokenization.ipynb §2.4"
    )


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into words the way SmolLM2 does, before BPE.

    1. Every Unicode number character (regex ``\\p{N}``) is a word on its own.
    2. Each remaining stretch of text is split with GPT-2's pattern (use the
       ``regex`` module, which knows ``\\p{L}``)::

           's|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+

    ``"I'm 42!"`` -> ``["I", "'m", " ", "4", "2", "!"]``. The words joined give
    back ``text``.
    """
    raise NotImplementedError(
        "Exercise 2.4 `pretokenize`: not implemented yet — see ch02_tokenization.ipynb §2.4"
    )


def train_bpe(text: str, num_merges: int, min_frequency: int = 2) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` BPE merges from ``text``, most frequent pair first.

    Pre-tokenise ``text`` (:func:`pretokenize`), turn each word into its UTF-8
    bytes mapped through :func:`bytes_to_unicode`, and count each distinct
    word. Then repeat: count every adjacent pair of symbols over all words
    (weighted by how often the word occurs), pick the most frequent pair —
    ties go to the pair that sorts first (``min`` over ``(-count, pair)``) —
    record it, and replace it by the merged symbol everywhere: in each word left
    to right, without overlaps (``a a a`` with ``(a, a)`` becomes ``aa a``, and a
    word's symbols always join back to the word). Stop after
    ``num_merges`` merges, or when the best pair occurs fewer than
    ``min_frequency`` times. Return the merges in order.
    """
    raise NotImplementedError(
        "Exercise 2.4 `train_bpe`: not implemented yet — see ch02_tokenization.ipynb §2.4"
    )


def bpe_merge_word(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Split one word (already in byte stand-in characters) into BPE pieces.

    Start from its characters. Repeatedly find the adjacent pair with the
    lowest rank in ``ranks`` (leftmost if several share it) and merge it;
    stop when no adjacent pair has a rank. ``bpe_merge_word("Ġlower", ranks)``
    might give ``["Ġlow", "er"]``.
    """
    raise NotImplementedError(
        "Exercise 2.4 `bpe_merge_word`: not implemented yet — see ch02_tokenization.ipynb §2.4"
    )


def encode_ordinary(
    text: str, vocab: Mapping[str, int], ranks: Mapping[tuple[str, str], int], cache: dict | None = None
) -> list[int]:
    """Encode text without special tokens: pre-tokenise, map bytes, merge, look up ids.

    For each word of :func:`pretokenize`: its UTF-8 bytes through
    :func:`bytes_to_unicode`, then :func:`bpe_merge_word`, then each piece's id
    in ``vocab``. If some character of a word is not in ``vocab`` at all
    (SmolLM2 lacks a few rare bytes), drop those characters before merging,
    as the reference does. ``cache`` (optional) maps a word's stand-in
    string to its ids: words repeat a lot, so caching makes encoding fast.
    """
    raise NotImplementedError(
        "Exercise 2.4 `encode_ordinary`: not implemented yet — see ch02_tokenization.ipynb §2.4"
    )


def decode_ordinary(ids: Sequence[int], tokens: Sequence[str]) -> str:
    """Token ids -> text: join the tokens' stand-in strings, map each character back
    to its byte (invert :func:`bytes_to_unicode`), decode UTF-8 with
    ``errors="replace"``. An id outside ``tokens`` raises ``ValueError`` naming it.
    """
    raise NotImplementedError(
        "Exercise 2.4 `decode_ordinary`: not implemented yet — see ch02_tokenization.ipynb §2.4"
    )


# -- Exercise 2.5: a prompt assembler --------------------------------------------


def render_chatml(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    default_system: str | None = SMOLLM2_DEFAULT_SYSTEM,
) -> str:
    """Lay out a conversation in ChatML, exactly as SmolLM2's chat template does.

    Each message ``{"role": r, "content": c}`` becomes
    ``"<|im_start|>" + r + "\\n" + c + "<|im_end|>\\n"``. If the first message
    is not a system message and ``default_system`` is not None, a system
    message with that text comes first. With ``add_generation_prompt``, end
    with ``"<|im_start|>assistant\\n"`` so the model writes the reply.
    Malformed messages (not a dict, an unknown role, non-text content, an
    empty list) raise ``ValueError``.
    """
    raise NotImplementedError(
        "Exercise 2.5 `render_chatml`: not implemented yet — see ch02_tokenization.ipynb §2.5"
    )


def encode_chat(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
) -> list[int]:
    """Messages -> :func:`render_chatml` string -> token ids, with special tokens
    recognised (``tokenizer.encode(text, allow_special=True)``)."""
    raise NotImplementedError(
        "Exercise 2.5 `encode_chat`: not implemented yet — see ch02_tokenization.ipynb §2.5"
    )


def fit_to_budget(
    messages: Sequence[Mapping[str, Any]],
    count_tokens: Callable[[list], int],
    max_tokens: int,
    reserve_for_reply: int = 0,
) -> list:
    """Drop the oldest whole turns until the prompt fits in ``max_tokens - reserve_for_reply``.

    ``count_tokens(msgs)`` returns the token count of the rendered prompt for a
    list of messages. Keep a leading system message always. The rest is a
    list of turns, each starting at a user message and holding the replies
    after it; drop whole turns, oldest first, never the newest. Return the
    kept messages (a new list, in order). If even the system message plus
    the newest turn do not fit — or no room is left at all — raise
    ``PromptTooLongError`` saying how many tokens were needed and available.
    """
    raise NotImplementedError(
        "Exercise 2.5 `fit_to_budget`: not implemented yet — see ch02_tokenization.ipynb §2.5"
    )
