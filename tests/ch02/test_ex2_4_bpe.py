"""Exercise 2.4 — Implementing a Simple BPE Tokenizer.

The reference is Hugging Face `tokenizers` set up as SmolLM2's own tokenizer
(llmrs_core.tokenizer.reference), run on the same vocabulary and merges.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import pre_tokenizers

from llmrs_core.testing import first_difference
from llmrs_core.tokenizer import Tokenizer
from llmrs_core.tokenizer.bpe import vocab_from_merges
from llmrs_core.tokenizer.bytes_map import encode_bytes

TRAINING_TEXT = (Path(__file__).resolve().parents[1] / "data" / "bpe_training.txt").read_text()

TEXTS = [
    "Hello world",
    "I'm 42! It's 3.14159",
    "don't they'll WE'RE",
    "a  1",
    "   leading",
    "tabs\t\tand\r\nCRLF\n\n",
    "½ ² Ⅻ ٣٤ 12345",
    "naïve café 日本語",
    "🦀 and 👨‍👩‍👧 🇫🇷",
    "def f(x):\n    return x**2  # square",
    "",
    " ",
    "trailing spaces   ",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_tokenizer) -> Tokenizer:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def reference(smollm2_reference):
    return smollm2_reference


# -- bytes_to_unicode -------------------------------------------------------------


def test_ex2_4_bytes_to_unicode_is_gpt2s_map(ex):
    table = ex.bytes_to_unicode()
    assert sorted(table) == list(range(256)), "the map needs exactly one entry per byte value 0..255"
    assert len(set(table.values())) == 256, "two bytes map to the same character: the map must be invertible"
    assert table[32] == "Ġ" and table[10] == "Ċ", (
        f"space maps to {table[32]!r} and newline to {table[10]!r}; GPT-2 uses 'Ġ' and 'Ċ' — "
        "the non-printable bytes take chr(256), chr(257), ... in increasing byte order"
    )
    assert table[ord("a")] == "a" and table[ord("~")] == "~" and table[0xE9] == "é"
    assert set(table.values()) == set(pre_tokenizers.ByteLevel.alphabet())
    # every byte that valid UTF-8 can contain, checked against the reference's byte mapping
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    samples = [chr(c) for c in range(0x800)] + [chr(c) for c in (0x800, *range(0x1100, 0x10000, 0x1000))]
    samples += [chr(c) for c in (0x10000, 0x40000, 0x80000, 0xC0000, 0x100000)]
    for ch in samples:
        (want, _), *_ = byte_level.pre_tokenize_str(ch)
        got = "".join(table[b] for b in ch.encode("utf-8"))
        assert got == want, f"{ch!r} (bytes {ch.encode('utf-8').hex(' ')}) maps to {got!r}, reference {want!r}"


# -- pretokenize --------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS, ids=[repr(t)[:25] for t in TEXTS])
def test_ex2_4_pretokenize_matches_smollm2(ex, reference, text):
    words = ex.pretokenize(text)
    assert "".join(words) == text, "the words must join back to the original text"
    ours = [encode_bytes(w.encode("utf-8")) for w in words]
    theirs = [piece for piece, _ in reference.pre_tokenizer.pre_tokenize_str(text)]
    assert ours == theirs, (
        f"pretokenize({text!r}): {first_difference(ours, theirs)}. Remember: every \\p{{N}} "
        "character is a word of its own, and the GPT-2 pattern runs on the pieces in between"
    )


# -- bpe_merge_word -------------------------------------------------------------------


def test_ex2_4_bpe_merge_word_small_examples(ex):
    ranks = {("l", "o"): 0, ("lo", "w"): 1, ("e", "r"): 2, ("w", "e"): 3}
    assert ex.bpe_merge_word("lower", ranks) == ["low", "er"], (
        "merge the lowest rank first: l+o (0), then lo+w (1), then e+r (2); w+e never gets a chance"
    )
    assert ex.bpe_merge_word("aaa", {("a", "a"): 0}) == ["aa", "a"], "equal ranks: merge the leftmost first"
    assert ex.bpe_merge_word("xyz", ranks) == ["x", "y", "z"], "no rank, no merge"
    assert ex.bpe_merge_word("q", ranks) == ["q"]


@pytest.mark.parametrize("word", ["tokenization", " the", " Hello", "antidisestablishment", "ÿÿÿ", " 🦀"])
def test_ex2_4_bpe_merge_word_with_smollm2_merges(ex, smollm2, reference, word):
    chars = encode_bytes(word.encode("utf-8"))
    ours = ex.bpe_merge_word(chars, smollm2.ranks)
    theirs = [t.value for t in reference.model.tokenize(chars)]
    assert ours == theirs, f"bpe_merge_word({chars!r}): {first_difference(ours, theirs)}"


# -- encode / decode ------------------------------------------------------------------


@pytest.mark.parametrize("text", TEXTS + ["x\x04y"], ids=[repr(t)[:25] for t in TEXTS + ["x\x04y"]])
def test_ex2_4_encode_ordinary_matches_reference(ex, smollm2, reference, text):
    ours = ex.encode_ordinary(text, smollm2.vocab, smollm2.ranks)
    theirs = reference.encode(text).ids
    assert ours == theirs, f"encode_ordinary({text!r}): " + first_difference(ours, theirs, smollm2.piece)
    cache: dict = {}
    assert ex.encode_ordinary(text, smollm2.vocab, smollm2.ranks, cache) == theirs
    assert ex.encode_ordinary(text, smollm2.vocab, smollm2.ranks, cache) == theirs, "wrong result from the cache"


def test_ex2_4_decode_ordinary_round_trips(ex, smollm2):
    for text in TEXTS:
        ids = smollm2.encode(text, allow_special=False)
        assert ex.decode_ordinary(ids, smollm2.tokens) == text, f"decode(encode({text!r})) differs"
    assert ex.decode_ordinary([], smollm2.tokens) == ""
    with pytest.raises(ValueError, match="49152"):
        ex.decode_ordinary([49152], smollm2.tokens)


# -- train_bpe ---------------------------------------------------------------------


def test_ex2_4_train_bpe_worked_example(ex):
    # "aaabdaaabac": a+a occurs 4 times; after it, (a,b) and (aa,a) tie at 2 and
    # ('a', 'b') sorts first; then (aa, ab) occurs twice; nothing else repeats.
    assert ex.train_bpe("aaabdaaabac", 10) == [("a", "a"), ("a", "b"), ("aa", "ab")]
    assert ex.train_bpe("aaabdaaabac", 1) == [("a", "a")], "stop after num_merges merges"
    assert ex.train_bpe("abc", 5) == [], "no pair occurs twice: nothing to learn"


def test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs(ex):
    merges = ex.train_bpe(TRAINING_TEXT, 100)
    assert len(merges) == 100, f"asked for 100 merges, got {len(merges)} (this text has enough repeated pairs)"
    assert len(set(merges)) == 100, "a pair was merged twice"
    # count the pairs of the untouched text: the first merge must be the most frequent one
    counts: dict = {}
    for word in ex.pretokenize(TRAINING_TEXT):
        chars = encode_bytes(word.encode("utf-8"))
        for pair in zip(chars, chars[1:]):
            counts[pair] = counts.get(pair, 0) + 1
    best = min(counts, key=lambda p: (-counts[p], p))
    assert merges[0] == best, f"first merge {merges[0]} occurs {counts.get(merges[0])} times; {best} occurs {counts[best]}"
    # each merge combines symbols that exist by then
    known = set(ex.bytes_to_unicode().values())
    for i, (left, right) in enumerate(merges):
        assert left in known and right in known, f"merge {i} {(left, right)} uses a symbol not yet created"
        known.add(left + right)


def test_ex2_4_your_merges_encode_like_the_reference(ex):
    """Encode with the merges you trained; the reference BPE with the same merges must agree."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    merges = ex.train_bpe(TRAINING_TEXT, 1000)  # stops early: min_frequency=2
    vocab = vocab_from_merges(merges)
    ranks = {pair: i for i, pair in enumerate(merges)}
    hf = HFTokenizer(models.BPE(vocab=vocab, merges=merges))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokens = sorted(vocab, key=vocab.get)
    for text in [TRAINING_TEXT, "The tokenizer learned these merges in 2024.", "unseen wörds 🦀"]:
        ours = ex.encode_ordinary(text, vocab, ranks)
        assert ours == hf.encode(text).ids, first_difference(ours, hf.encode(text).ids, tokens.__getitem__)
        assert ex.decode_ordinary(ours, tokens) == text
    n_tokens = len(ex.encode_ordinary(TRAINING_TEXT, vocab, ranks))
    assert n_tokens < len(TRAINING_TEXT.encode()) / 2, (
        f"{len(merges)} merges should at least halve the token count of their own training text; got {n_tokens} "
        f"tokens for {len(TRAINING_TEXT.encode())} bytes"
    )
