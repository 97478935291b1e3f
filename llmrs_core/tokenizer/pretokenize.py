"""Pre-tokenisation as SmolLM2 does it (chapter 2).

Before BPE, text is cut into words; merges never cross a word boundary.
SmolLM2's tokenizer (Hugging Face ``pre_tokenizer``:
``Sequence[Digits(individual_digits=True), ByteLevel(add_prefix_space=False, use_regex=True)]``,
llama.cpp's ``smollm`` pre-tokeniser) does two passes:

1. every Unicode number character (``\\p{N}``: digits, but also ``²``, ``½``,
   ``Ⅻ``, ``٣``) becomes a word of its own — so numbers are tokenised digit by
   digit, which helps arithmetic;
2. each remaining piece is split with GPT-2's pattern: contractions, an
   optional space plus letters, an optional space plus numbers, an optional
   space plus other symbols, and whitespace runs (a run before a word gives its
   last space to that word).

The second pass runs on each piece of the first separately, as in the
reference: ``"a  1"`` gives ``["a", "  ", "1"]``, not GPT-2's ``["a", " ", " 1"]``.
"""

from __future__ import annotations

import regex

DIGIT = regex.compile(r"(\p{N})")
GPT2_PATTERN = regex.compile(
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
)


def pretokenize(text: str) -> list[str]:
    """Split ``text`` into the words BPE works on, SmolLM2's way.

    ``"I'm 42!"`` -> ``["I", "'m", " ", "4", "2", "!"]``. The words concatenate
    back to ``text`` exactly.
    """
    words: list[str] = []
    for piece in DIGIT.split(text):
        if not piece:
            continue
        if DIGIT.fullmatch(piece):
            words.append(piece)
        else:
            words.extend(GPT2_PATTERN.findall(piece))
    return words
