"""A bounded word cache for the tokenizer (chapter 2).

Text repeats words constantly, so the tokenizer remembers the ids of each word
it has merged. An unbounded dict is a memory leak in a server: every unique
word anyone ever sends stays (200,000 unique words grew the process by
54 MiB). :class:`WordCache` keeps the most recently used ``max_words`` words
and does not keep long words at all: they rarely repeat, cost the most memory,
and merging them again is cheap (O(n log n), :func:`.bpe.bpe_merge_word`).

Measured when full, at the defaults (2**16 words, up to 64 characters):
words of ordinary text (4-10 letters, one to three ids) grow the process
by about 25 MiB; the worst case, 64-character words of 63 ids each, by 50 MiB.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class WordCache:
    """Least-recently-used map from a word (stand-in characters) to its token ids.

    ``get`` and item assignment are all :func:`.bpe.encode_ordinary` uses.
    Safe to share between threads: a race can only cost a cache miss.
    """

    def __init__(self, max_words: int = 2**16, max_word_chars: int = 64):
        if max_words < 0 or max_word_chars < 0:
            raise ValueError(f"max_words and max_word_chars must be >= 0, got {max_words}, {max_word_chars}")
        self.max_words = max_words
        self.max_word_chars = max_word_chars
        self._words: OrderedDict[str, Sequence[int]] = OrderedDict()

    def get(self, word: str, default: Sequence[int] | None = None) -> Sequence[int] | None:
        ids = self._words.get(word)
        if ids is None:
            return default
        try:
            self._words.move_to_end(word)
        except KeyError:  # evicted by another thread in between
            pass
        return ids

    def __setitem__(self, word: str, ids: Sequence[int]) -> None:
        if len(word) > self.max_word_chars or self.max_words == 0:
            return
        words = self._words
        words[word] = ids
        while len(words) > self.max_words:
            try:
                words.popitem(last=False)
            except KeyError:  # emptied by another thread
                break

    def __contains__(self, word: object) -> bool:
        return word in self._words

    def __len__(self) -> int:
        return len(self._words)

    def clear(self) -> None:
        self._words.clear()

    def __repr__(self) -> str:
        return f"WordCache({len(self)} of {self.max_words} words, up to {self.max_word_chars} characters each)"
