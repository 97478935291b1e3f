"""Tokenization (chapter 2): SmolLM2's byte-level BPE written from scratch.

    bytes_map     GPT-2's byte <-> printable-character map
    pretokenize   how text is cut into words before BPE (digits, then the GPT-2 pattern)
    bpe           merges by rank, BPE training, encode / decode of plain text
    tokenizer     the Tokenizer built from a GGUF file: special tokens, safe chat encoding, length bounds
    word_cache    the bounded (least-recently-used) cache of words' ids
    streaming     detokenising a token stream without ever emitting broken UTF-8
    chat          chat templates (jinja2, sandboxed), a ChatML assembler, token budgets
"""

from .bpe import bpe_merge_word, decode_ordinary, encode_ordinary, train_bpe
from .bytes_map import bytes_to_unicode, unicode_to_bytes
from .chat import (
    ChatMessage,
    PromptTooLongError,
    encode_chat,
    fit_to_budget,
    render_chat_template,
    render_chatml,
)
from .pretokenize import pretokenize
from .streaming import StreamDecoder
from .tokenizer import Tokenizer
from .word_cache import WordCache

__all__ = [
    "ChatMessage",
    "PromptTooLongError",
    "StreamDecoder",
    "Tokenizer",
    "WordCache",
    "bpe_merge_word",
    "bytes_to_unicode",
    "decode_ordinary",
    "encode_chat",
    "encode_ordinary",
    "fit_to_budget",
    "pretokenize",
    "render_chat_template",
    "render_chatml",
    "train_bpe",
    "unicode_to_bytes",
]
