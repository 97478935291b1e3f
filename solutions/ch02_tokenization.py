"""Chapter 2 solutions: the engine's tokenizer functions (llmrs_core.tokenizer)."""

from llmrs_core.tokenizer.bpe import bpe_merge_word, decode_ordinary, encode_ordinary, train_bpe
from llmrs_core.tokenizer.bytes_map import bytes_to_unicode
from llmrs_core.tokenizer.chat import PromptTooLongError, encode_chat, fit_to_budget, render_chatml
from llmrs_core.tokenizer.pretokenize import pretokenize

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
