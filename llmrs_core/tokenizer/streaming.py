"""Streaming detokenisation that never emits broken UTF-8 (chapter 2).

A byte-level token can end in the middle of a character: the emoji 🦀 is four
bytes and may span two or three tokens. Decoding each token on its own prints
``U+FFFD`` replacement characters — a real bug class in servers. The fix:
keep the bytes of an incomplete character back until the next token
completes it. Python's incremental UTF-8 decoder does exactly that.
"""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .tokenizer import Tokenizer


class StreamDecoder:
    """Turns token ids, one at a time, into text pieces that are always whole characters.

    ``text = decoder.add(token_id)`` returns what can be printed now (maybe
    ``""``); ``decoder.flush()`` returns what is left at the end (an
    incomplete sequence then becomes ``U+FFFD``: the input really was broken).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False, drop_leading_space: bool = False):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        # SentencePiece writes a space before a text; Tokenizer.decode drops it at the start, and so
        # does a stream that starts a text (the first byte it sees, if that is a space)
        self._drop_space = drop_leading_space

    def add(self, token_id: int) -> str:
        if self.skip_special and self.tokenizer.is_special(token_id):
            return ""
        data = self.tokenizer.token_bytes(token_id)
        if self._drop_space and data:
            self._drop_space = False
            if data.startswith(b" "):
                data = data[1:]
        return self._decoder.decode(data)

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)

    def pending_bytes(self) -> int:
        """Bytes held back, waiting for the rest of a character."""
        return len(self._decoder.getstate()[0])
