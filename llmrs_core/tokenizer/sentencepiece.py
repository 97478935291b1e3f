"""SentencePiece tokenisation as llama.cpp does it (``tokenizer.ggml.model == "llama"``; chapter 2, beyond the book).

Llama 2, TinyLlama, Mistral v0.1 and Phi-3 store a SentencePiece vocabulary:
pieces with *scores*, no merge list, and no byte-level stand-in alphabet.
Encoding one run of ordinary text (llama.cpp's ``llm_tokenizer_spm_session``):

1. write a space before it (``add_space_prefix``, default on: "Hello" is
   encoded as " Hello", so a word at the start gets the same token as
   mid-sentence), and every space as ``▁`` (U+2581);
2. start from one symbol per character;
3. file every adjacent pair whose concatenation is a piece of the
   vocabulary, and repeatedly merge the pair whose piece has the *highest
   score*, leftmost first among equal scores (a heap, with pairs made stale
   by an earlier merge skipped when they come up: O(n log n));
4. each final symbol is its piece's id; a symbol that is no piece (a
   character the vocabulary lacks, say an emoji) is written as its UTF-8
   bytes, one ``<0xXX>`` token each: *byte fallback*, so nothing is unknown.

Decoding turns ``▁`` back into a space and each ``<0xXX>`` token into its
byte; the stream decoder reassembles characters from those bytes exactly as it
does for byte-level BPE.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from .model import TextModel

SPACE = "\u2581"  # "▁", SentencePiece's visible space
TOKEN_BYTE = 6  # llama.cpp's token type of the <0xXX> byte tokens


class SentencePieceModel(TextModel):
    """A SentencePiece vocabulary: ``tokens`` (pieces), ``scores`` and ``token_types`` by id.

    ``vocab`` maps a piece to its id (for a repeated piece, the last id, as
    llama.cpp's ``token_to_id`` keeps). ``unk_token_id`` stands for a byte that
    has no ``<0xXX>`` token (no vocabulary we know lacks them).
    """

    kind = "llama"

    def __init__(self, tokens: Sequence[str], scores: Sequence[float], token_types: Sequence[int],
                 vocab: Mapping[str, int], *, add_space_prefix: bool = True, unk_token_id: int | None = None):
        if len(scores) != len(tokens):
            raise ValueError(f"{len(scores)} scores for {len(tokens)} tokens")
        self.tokens, self.scores, self.token_types, self.vocab = tokens, scores, token_types, vocab
        self.leading_space = add_space_prefix
        self.unk_token_id = unk_token_id
        # a byte's token: <0xXX>, else (ASCII) the character itself, as llama.cpp's byte_to_token; else <unk>
        found = [vocab.get(f"<0x{b:02X}>", vocab.get(chr(b)) if b < 128 else None) for b in range(256)]
        self.byte_ids = [unk_token_id if i is None else i for i in found]

    def encode(self, text: str) -> list[int]:
        if self.leading_space:
            text = " " + text
        symbols = list(text.replace(" ", SPACE))
        n = len(symbols)
        if n == 0:
            return []
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        get, scores = self.vocab.get, self.scores
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, length of the joined piece)

        def file_pair(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            piece = symbols[left] + symbols[right]
            token_id = get(piece)
            if token_id is not None:
                heapq.heappush(heap, (-scores[token_id], left, right, len(piece)))

        for i in range(n - 1):
            file_pair(i, i + 1)
        while heap:
            _, left, right, length = heapq.heappop(heap)
            a, b = symbols[left], symbols[right]
            if not a or not b or len(a) + len(b) != length:
                continue  # stale: one side was merged into something else since this pair was filed
            symbols[left], symbols[right] = a + b, ""
            nxt[left] = after = nxt[right]
            if after >= 0:
                prv[after] = left
            file_pair(prv[left], left)
            file_pair(left, after)
        ids: list[int] = []
        i = 0
        while i >= 0:
            token_id = get(symbols[i])
            if token_id is not None:
                ids.append(token_id)
            else:  # byte fallback
                ids.extend(t for t in (self.byte_ids[b] for b in symbols[i].encode("utf-8")) if t is not None)
            i = nxt[i]
        return ids

    def piece_bytes(self, token_id: int) -> bytes:
        text = self.tokens[token_id]
        if self.token_types[token_id] == TOKEN_BYTE:
            return bytes([int(text[3:5], 16)])
        return text.replace(SPACE, " ").encode("utf-8")

    def text_bytes(self, token_id: int) -> int:
        return len(self.piece_bytes(token_id))

    def dropped_bytes(self) -> bytes | None:
        # with a token for every byte nothing is dropped; without one, a missing byte costs nothing
        return b"" if all(i is not None for i in self.byte_ids) else bytes(
            b for b in range(256) if self.byte_ids[b] is None)
