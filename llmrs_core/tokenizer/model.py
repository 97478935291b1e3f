"""The two kinds of tokenizer model behind one :class:`~.tokenizer.Tokenizer` (chapter 2).

A GGUF file's ``tokenizer.ggml.model`` says which: ``"gpt2"`` is byte-level
BPE (merges applied by rank to the bytes of pre-tokenised words, SmolLM2,
Llama 3, Qwen), ``"llama"`` is SentencePiece (pieces merged by score over
the whole text, spaces written ``▁``, bytes only as a fallback: Llama 2,
TinyLlama, Phi-3). The :class:`~.tokenizer.Tokenizer` does everything the two
share — special tokens, BOS, decoding, streaming, the length bound, chat —
and asks its :class:`TextModel` only what differs, through this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence

from .bpe import encode_ordinary
from .bytes_map import bytes_to_unicode, decode_chars
from .pretokenizers import PreTokenizer
from .word_cache import WordCache

MODEL_KINDS = ("gpt2", "llama")
"""The ``tokenizer.ggml.model`` values we implement (byte-level BPE, SentencePiece)."""


class TextModel(ABC):
    """Ordinary text <-> ids for one vocabulary; no special tokens (the Tokenizer splits them out first).

    ``kind``: the GGUF ``tokenizer.ggml.model`` value. ``leading_space``: encoding
    writes one space before each run of text (SentencePiece's ``add_space_prefix``),
    which decoding the start of a text takes away again.
    """

    kind: str
    leading_space: bool = False

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """One run of ordinary text (at the start, or right after a special token) -> ids."""

    @abstractmethod
    def piece_bytes(self, token_id: int) -> bytes:
        """The bytes a normal (not special) token decodes to."""

    @abstractmethod
    def text_bytes(self, token_id: int) -> int:
        """How many bytes of *input text* a normal token covers (for the length bound)."""

    @abstractmethod
    def dropped_bytes(self) -> bytes | None:
        """Byte values encoding drops (they cost no token), or ``None`` if it can drop more
        than single byte values (then no length bound is possible)."""


class BPEModel(TextModel):
    """Byte-level BPE: words from the pre-tokeniser, each merged by rank (:mod:`.bpe`)."""

    kind = "gpt2"

    def __init__(self, tokens: Sequence[str], vocab: Mapping[str, int], ranks: Mapping[tuple[str, str], int],
                 pre: PreTokenizer, word_cache_size: int = 2**16):
        self.tokens, self.vocab, self.ranks, self.pre = tokens, vocab, ranks, pre
        self.cache = WordCache(word_cache_size)
        self._split = pre.split

    def encode(self, text: str) -> list[int]:
        return encode_ordinary(text, self.vocab, self.ranks, self.cache, self._split, self.pre.ignore_merges)

    def piece_bytes(self, token_id: int) -> bytes:
        return decode_chars(self.tokens[token_id])

    def text_bytes(self, token_id: int) -> int:
        return len(self.tokens[token_id])  # one stand-in character per byte

    def dropped_bytes(self) -> bytes | None:
        if any(a + b not in self.vocab for a, b in self.ranks):
            return None  # a merge can make a piece the vocabulary lacks: encoding drops it whole
        table = bytes_to_unicode()
        return bytes(b for b in range(256) if table[b] not in self.vocab)
