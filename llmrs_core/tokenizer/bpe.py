"""Byte-pair encoding: applying merges by rank, and learning them (chapter 2).

A BPE model is an ordered list of merges ``(left, right)``; a merge's index is
its *rank*. To encode a word, start from its characters (byte stand-ins,
see :mod:`.bytes_map`) and repeatedly merge the adjacent pair with the lowest
rank, leftmost first, until no adjacent pair has a rank. Training finds those
merges: repeatedly merge the most frequent adjacent pair in a corpus.

Merging by rescanning the word for its best pair after every merge is the
clearest statement of the rule, and the fastest way for the short words that
make up nearly all text; but it is quadratic, and one pre-tokenised "word" can
be 20,000 spaces long (a whitespace run) — 40 seconds of merging. Long words
therefore go through an O(n log n) version that gives the very same pieces
(:func:`bpe_merge_word` picks; see :func:`_merge_long_word`).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence

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


SHORT_WORD = 16
"""Words of up to this many characters are merged by rescanning (faster than the
bookkeeping of :func:`_merge_long_word` below this length, measured on SmolLM2)."""


def bpe_merge_word(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """Split one pre-tokenised word (in byte stand-in characters) into BPE pieces.

    ``bpe_merge_word("Ġlower", ranks)`` might give ``["Ġlow", "er"]``. Merges
    apply lowest rank first; among equal ranks, leftmost first.
    """
    if len(word) > SHORT_WORD:
        return _merge_long_word(word, ranks)
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


def _merge_long_word(word: str, ranks: Mapping[tuple[str, str], int]) -> list[str]:
    """:func:`bpe_merge_word` in O(n log n), for long words: the same pieces, always.

    The rescanning loop costs O(n) per merge. Here nothing is rescanned:

    * The symbols are a linked list over the word's positions: the symbol that
      starts at ``i`` is ``word[i:nxt[i]]`` (``prv`` links back). A merge
      unlinks the right symbol; ``nxt`` of a dead position is ``n``, and
      ``nxt[n] == -1``.
    * Each adjacent pair is filed once, when it comes into being, in a bucket
      for its rank, as one int ``start << shift | end``: where its left symbol
      starts and its right symbol ends. Sorting a bucket sorts its pairs left
      to right. A filed pair is *stale* once either symbol has been merged into
      something longer, which shows as ``nxt[nxt[start]] != end``; stale pairs
      are skipped when they come up (lazy deletion, as Hugging Face
      ``tokenizers`` does with its heap of pairs).
    * A heap holds the ranks that have buckets, so the lowest comes first.

    In a BPE learned by training, a merge can only use tokens made by earlier
    merges, so merging pairs of rank ``r`` only ever creates pairs of higher
    rank: all of rank ``r``'s bucket can be merged in one left-to-right sweep,
    which is what the rescanning loop would do too. Should a hand-made table
    break that rule (a new pair of rank ``<= r``), the sweep stops there and
    the rest of the bucket is filed back, so the result is still the loop's.
    """
    n = len(word)
    symbols = list(word)  # symbols[i]: the symbol starting at i, while position i is alive
    nxt = list(range(1, n + 2))
    nxt[n] = -1
    prv = list(range(-1, n))
    shift = (n + 1).bit_length()
    mask = (1 << shift) - 1
    get = ranks.get
    buckets: defaultdict[int, list[int]] = defaultdict(list)  # rank -> pairs filed under it
    for i, pair in enumerate(zip(symbols, symbols[1:])):
        rank = get(pair)
        if rank is not None:
            buckets[rank].append((i << shift) | (i + 2))
    pending = list(buckets)  # a heap of the ranks that have (or had) a bucket
    heapq.heapify(pending)
    while pending:
        rank = heapq.heappop(pending)
        todo = buckets.pop(rank, None)
        if todo is None:
            continue
        todo.sort()
        for k, pair in enumerate(todo):
            end = pair & mask
            i = pair >> shift
            j = nxt[i]
            if nxt[j] != end:
                continue  # stale: one of its symbols has grown since it was filed
            symbols[i] = merged = symbols[i] + symbols[j]
            nxt[i], nxt[j], prv[end] = end, n, i
            lower = False  # did this merge make a pair that must come before the rest of this bucket?
            if end < n and (new_rank := get((merged, symbols[end]))) is not None:
                bucket = buckets[new_rank]
                if not bucket:
                    heapq.heappush(pending, new_rank)
                bucket.append((i << shift) | nxt[end])
                lower = new_rank <= rank
            p = prv[i]
            if p >= 0 and (new_rank := get((symbols[p], merged))) is not None:
                bucket = buckets[new_rank]
                if not bucket:
                    heapq.heappush(pending, new_rank)
                bucket.append((p << shift) | end)
                lower = lower or new_rank <= rank
            if lower:
                if not buckets[rank]:
                    heapq.heappush(pending, rank)
                buckets[rank].extend(todo[k + 1 :])
                break
    pieces = []
    i = 0
    while i < n:
        pieces.append(symbols[i])
        i = nxt[i]
    return pieces


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


def encode_ordinary(
    text: str,
    vocab: Mapping[str, int],
    ranks: Mapping[tuple[str, str], int],
    cache: dict | None = None,
    split: Callable[[str], list[str]] = pretokenize,
    ignore_merges: bool = False,
) -> list[int]:
    """Encode plain text (no special tokens) with a byte-level BPE vocabulary and merges.

    ``cache`` maps a word's stand-in string to its ids: a dict, or anything
    with ``get`` and item assignment (the :class:`~.tokenizer.Tokenizer`
    passes a bounded :class:`~.word_cache.WordCache`). ``split`` cuts text into
    words (SmolLM2's :func:`.pretokenize.pretokenize` by default; see
    :mod:`.pretokenizers` for the others); with ``ignore_merges`` (Llama 3) a
    word that is itself a token is that token, whatever the merges would make.
    """
    ids: list[int] = []
    for word in split(text):
        chars = encode_bytes(word.encode("utf-8"))
        if cache is not None:
            cached = cache.get(chars)
            if cached is not None:
                ids.extend(cached)
                continue
        if ignore_merges and chars in vocab:
            word_ids = [vocab[chars]]
            if cache is not None:
                cache[chars] = word_ids
            ids.extend(word_ids)
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
