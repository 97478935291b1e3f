"""Byte-pair encoding: applying merges by rank, and learning them (chapter 2).

A BPE model is an ordered list of merges ``(left, right)``; a merge's index is
its *rank*. To encode a word, start from its characters (byte stand-ins,
see :mod:`.bytes_map`) and repeatedly merge the adjacent pair with the lowest
rank, leftmost first, until no adjacent pair has a rank. Training finds those
merges: repeatedly merge the most frequent adjacent pair in a corpus.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from .bytes_map import decode_chars, encode_bytes
from .pretokenize import pretokenize


def merge_ranks(merges: Iterable[str | tuple[str, str]]) -> dict[tuple[str, str], int]:
    """``["Ġ t", "i n", ...]`` (GGUF's form) or pairs -> ``{("Ġ", "t"): 0, ("i", "n"): 1, ...}``."""
    ranks: dict[tuple[str, str], int] = {}
    for rank, merge in enumerate(merges):
        if isinstance(merge, str):
            left, sep, right = merge.partition(" ")
            if not sep or not left or not right:
                raise ValueError(f"merge {rank} is {merge!r}; expected two tokens separated by one space")
            pair = (left, right)
        else:
            pair = tuple(merge)
        ranks.setdefault(pair, rank)  # a repeated merge keeps its first (lowest) rank
    return ranks


def bpe_merge_word(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Split one pre-tokenised word (in byte stand-in characters) into BPE pieces.

    ``bpe_merge_word("Ġlower", ranks)`` might give ``["Ġlow", "er"]``. Merges
    apply lowest rank first; among equal ranks, leftmost first.
    """
    parts = list(word)
    while len(parts) > 1:
        best_rank, best_i = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get((parts[i], parts[i + 1]))
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_i = rank, i
        if best_rank is None:
            break
        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]
    return parts


def train_bpe(text: str, num_merges: int, min_frequency: int = 2) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` byte-level BPE merges from ``text``.

    The text is pre-tokenised like SmolLM2's (:func:`pretokenize`), each word
    turned into byte stand-in characters, and the most frequent adjacent pair
    (counted over all words, weighted by word frequency) is merged, again and
    again. Ties go to the pair that sorts first, so training is deterministic.
    Stops early when no pair occurs ``min_frequency`` times.
    """
    if num_merges < 0:
        raise ValueError(f"num_merges must be >= 0, got {num_merges}")
    words = Counter(encode_bytes(w.encode("utf-8")) for w in pretokenize(text))
    corpus = [(list(w), n) for w, n in words.items()]
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges:
        pairs: Counter[tuple[str, str]] = Counter()
        for parts, n in corpus:
            for pair in itertools.pairwise(parts):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < min_frequency:
            break
        merges.append(best)
        merged = best[0] + best[1]
        for parts, _ in corpus:
            i = 0
            while i < len(parts) - 1:
                if parts[i] == best[0] and parts[i + 1] == best[1]:
                    parts[i : i + 2] = [merged]
                i += 1
    return merges


def vocab_from_merges(merges: Iterable[tuple[str, str]]) -> dict[str, int]:
    """The vocabulary a byte-level BPE with these merges needs: 256 byte characters, then each merge."""
    vocab = {encode_bytes(bytes([b])): b for b in range(256)}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    return vocab


def encode_ordinary(text: str, vocab: Mapping[str, int], ranks: Mapping[tuple[str, str], int], cache: dict | None = None) -> list[int]:
    """Encode plain text (no special tokens) with a byte-level BPE vocabulary and merges."""
    ids: list[int] = []
    for word in pretokenize(text):
        chars = encode_bytes(word.encode("utf-8"))
        if cache is not None and chars in cache:
            ids.extend(cache[chars])
            continue
        pieces = bpe_merge_word(chars, ranks)
        if any(p not in vocab for p in pieces):
            # A byte whose character is not in the vocabulary (SmolLM2 lacks 21 of the
            # 256, e.g. 0x04 and the lead bytes 0xF1/0xF2 of planes 4-11) cannot be
            # encoded. Hugging Face's BPE (no unknown token) drops it before merging;
            # so do we, to give the same ids. llama.cpp drops it after merging, so
            # the two differ when it sits inside a merge: "!\x04!" is [10095] for
            # Hugging Face and [17, 17] for llama.cpp.
            pieces = bpe_merge_word("".join(c for c in chars if c in vocab), ranks)
            pieces = [p for p in pieces if p in vocab]
        word_ids = [vocab[p] for p in pieces]
        if cache is not None:
            cache[chars] = word_ids
        ids.extend(word_ids)
    return ids


def decode_ordinary(ids: Sequence[int], tokens: Sequence[str]) -> str:
    """Token ids -> text for a byte-level BPE vocabulary ``tokens`` (id -> stand-in string).

    Joins the tokens' stand-in characters, maps them back to bytes and decodes
    UTF-8 (invalid bytes become U+FFFD). Special tokens are not handled here.
    """
    try:
        chars = "".join(tokens[i] for i in ids)
    except IndexError:
        bad = next(i for i in ids if not 0 <= i < len(tokens))
        raise ValueError(f"token id {bad} is outside the vocabulary (0..{len(tokens) - 1})") from None
    return decode_chars(chars).decode("utf-8", errors="replace")
