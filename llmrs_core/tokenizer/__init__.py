"""Tokenization (chapter 2): SmolLM2's byte-level BPE written from scratch, and the other kinds GGUF files carry.

    bytes_map      GPT-2's byte <-> printable-character map
    pretokenize    how SmolLM2 cuts text into words before BPE (digits, then the GPT-2 pattern)
    pretokenizers  the pre-tokeniser zoo, by tokenizer.ggml.pre (Llama 3, Qwen2, GPT-2, DeepSeek, ...)
    bpe            merges by rank, BPE training, encode / decode of plain text
    sentencepiece  SentencePiece as llama.cpp runs it: merges by score, ▁ for spaces, byte fallback
    model          the TextModel interface both kinds implement
    special        special tokens in text (and their whitespace stripping), end-of-generation ids
    tokenizer      the Tokenizer built from a GGUF file or HF directory: BOS, safe chat encoding, length bounds
    hf             from_hf_dir / save_hf: Hugging Face tokenizer.json / tokenizer_config.json, read and written
    load           load_tokenizer: the tokenizer of any GGUF file (vocab-only too) or HF directory
    word_cache    the bounded (least-recently-used) cache of words' ids
    streaming     detokenising a token stream without ever emitting broken UTF-8
    chat          chat templates, a ChatML assembler, token budgets
    template      the chat-template sandbox: bounded Jinja2 with what transformers gives templates
    messages      what a template may be given (messages, tools, chat_template_kwargs), checked
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
from .model import TextModel
from .pretokenize import pretokenize
from .pretokenizers import PRE_TOKENIZERS, PreTokenizer
from .streaming import StreamDecoder
from .tokenizer import Tokenizer
from .word_cache import WordCache

__all__ = [
    "ChatMessage",
    "PRE_TOKENIZERS",
    "PreTokenizer",
    "PromptTooLongError",
    "StreamDecoder",
    "TextModel",
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
