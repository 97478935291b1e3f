"""Chapter 2 solutions: the engine's tokenizer functions (llmrs_core.tokenizer)."""

from __future__ import annotations

from collections.abc import Mapping

from llmrs_core.tokenizer import bpe
from llmrs_core.tokenizer.bpe import bpe_merge_word, decode_ordinary, train_bpe
from llmrs_core.tokenizer.bytes_map import bytes_to_unicode
from llmrs_core.tokenizer.chat import PromptTooLongError, encode_chat, fit_to_budget, render_chatml
from llmrs_core.tokenizer.pretokenize import pretokenize


def encode_ordinary(
    text: str, vocab: Mapping[str, int], ranks: Mapping[tuple[str, str], int], cache: dict | None = None
) -> list[int]:
    """The engine's :func:`llmrs_core.tokenizer.bpe.encode_ordinary` with SmolLM2's pre-tokeniser
    (the exercise's signature; the engine's also takes another ``split`` and ``ignore_merges``)."""
    return bpe.encode_ordinary(text, vocab, ranks, cache)


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
