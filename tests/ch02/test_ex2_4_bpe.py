"""Exercise 2.4 — Implementing a Simple BPE Tokenizer.

The reference is Hugging Face `tokenizers` set up as SmolLM2's own tokenizer
(llmrs_core.tokenizer.reference), run on the same vocabulary and merges.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import regex
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


# The usual ways to get each step wrong, as known-wrong versions of the step: a failure
# that matches one of them names it. They only name mistakes; the references are
# Hugging Face's tokenizer and the worked examples.

DIGIT = regex.compile(r"(\p{N})")
GPT2 = regex.compile(r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")

PRETOKENIZE_MISTAKES = [
    ("GPT-2's pattern alone: SmolLM2 first makes every \\p{N} character a word of its own, so numbers go "
     "digit by digit", lambda text: GPT2.findall(text)),
    ("the GPT-2 pattern on the whole text, digits split afterwards: split the digits off first and run the "
     "pattern on each piece in between ('a  1' -> ['a', '  ', '1'])",
     lambda text: [d for w in GPT2.findall(text) for d in DIGIT.split(w) if d]),
]


def merged_by(word: str, ranks, pick, once: bool = False) -> list[str]:
    """BPE merging with ``pick`` choosing which ranked pair ``(rank, index)`` to merge."""
    parts = list(word)
    while len(parts) > 1:
        ranked = [(ranks[p], i) for i, p in enumerate(zip(parts, parts[1:])) if p in ranks]
        if not ranked:
            break
        i = pick(ranked)
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if once:
            break
    return parts


MERGE_MISTAKES = [
    ("merging the leftmost pair that has a rank, whatever its rank: merge the pair with the LOWEST rank first "
     "(learned earliest), wherever it is", lambda w, r: merged_by(w, r, lambda ranked: ranked[0][1])),
    ("merging the highest rank first: a lower rank was learned earlier and merges first",
     lambda w, r: merged_by(w, r, lambda ranked: max(ranked, key=lambda x: (x[0], -x[1]))[1])),
    ("stopping after one merge: repeat until no adjacent pair has a rank",
     lambda w, r: merged_by(w, r, lambda ranked: min(ranked)[1], once=True)),
]


def check_merge(ex, word: str, ranks, want: list[str], why: str = "") -> None:
    """bpe_merge_word(word) against ``want``, naming a known wrong merge order."""
    got = ex.bpe_merge_word(word, ranks)
    if got == want:
        return
    for mistake, wrong in MERGE_MISTAKES:
        if wrong(word, ranks) == got != want:
            raise AssertionError(f"bpe_merge_word({word!r}) = {got}, expected {want}: that comes from {mistake}")
    raise AssertionError(f"bpe_merge_word({word!r}): {first_difference(got, want)}" + (f": {why}" if why else ""))


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
    joined = "".join(words)
    if joined != text and joined == "".join(text.split()):
        raise AssertionError(
            f"pretokenize({text!r}) loses the whitespace: the words join to {joined!r}. A space belongs to the "
            "word after it (' world'), and a run of whitespace is a word of its own: nothing is dropped"
        )
    assert joined == text, f"the words must join back to the original text; they join to {joined!r}"
    ours = [encode_bytes(w.encode("utf-8")) for w in words]
    theirs = [piece for piece, _ in reference.pre_tokenizer.pre_tokenize_str(text)]
    for mistake, wrong in PRETOKENIZE_MISTAKES:
        variant = [encode_bytes(w.encode("utf-8")) for w in wrong(text)]
        if ours == variant != theirs:
            raise AssertionError(f"pretokenize({text!r}) = {words}: that is {mistake}")
    assert ours == theirs, (
        f"pretokenize({text!r}): {first_difference(ours, theirs)}. Remember: every \\p{{N}} "
        "character is a word of its own, and the GPT-2 pattern runs on the pieces in between"
    )


# -- bpe_merge_word -------------------------------------------------------------------


def test_ex2_4_bpe_merge_word_small_examples(ex):
    ranks = {("l", "o"): 0, ("lo", "w"): 1, ("e", "r"): 2, ("w", "e"): 3}
    check_merge(ex, "lower", ranks, ["low", "er"],
                "merge the lowest rank first: l+o (0), then lo+w (1), then e+r (2); w+e never gets a chance")
    check_merge(ex, "abc", {("b", "c"): 0, ("a", "b"): 1}, ["a", "bc"],
                "b+c has the lower rank, so it merges first, though a+b comes first in the word")
    check_merge(ex, "aaa", {("a", "a"): 0}, ["aa", "a"], "equal ranks: merge the leftmost first")
    check_merge(ex, "xyz", ranks, ["x", "y", "z"], "no rank, no merge")
    check_merge(ex, "q", ranks, ["q"])


@pytest.mark.parametrize("word", ["tokenization", " the", " Hello", "antidisestablishment", "ÿÿÿ", " 🦀"])
def test_ex2_4_bpe_merge_word_with_smollm2_merges(ex, smollm2, reference, word):
    chars = encode_bytes(word.encode("utf-8"))
    check_merge(ex, chars, smollm2.ranks, [t.value for t in reference.model.tokenize(chars)])


# -- encode / decode ------------------------------------------------------------------


def also_failing(ex, text: str, hf, vocab, ranks) -> str:
    """Which of the steps encode_ordinary builds on are wrong on ``text`` too, each judged by the
    reference tokenizer ``hf``: so that a failure of encode_ordinary points at its cause."""
    words = [piece for piece, _ in hf.pre_tokenizer.pre_tokenize_str(text)]
    wrong = []
    try:
        if [encode_bytes(w.encode("utf-8")) for w in ex.pretokenize(text)] != words:
            wrong.append("pretokenize")
    except Exception:
        wrong.append("pretokenize")
    try:
        known = ["".join(c for c in w if c in vocab) for w in words]
        if any(ex.bpe_merge_word(w, ranks) != [t.value for t in hf.model.tokenize(w)] for w in known if w):
            wrong.append("bpe_merge_word")
    except Exception:
        wrong.append("bpe_merge_word")
    return "".join(f" (your {name} fails on this text too: see its own test)" for name in wrong)


def encode(ex, text, vocab, ranks, cache=None, hf=None) -> list[int]:
    """encode_ordinary, with a KeyError from a vocabulary lookup explained."""
    try:
        return ex.encode_ordinary(text, vocab, ranks, cache)
    except KeyError as e:
        note = also_failing(ex, text, hf, vocab, ranks) if hf is not None else ""
        key = e.args[0] if e.args else None
        if isinstance(key, str) and any(c in key for c in " \t\r\n"):
            raise AssertionError(
                f"encode_ordinary({text!r}) looked up {key!r}, raw text, in the vocabulary: map each word's UTF-8 "
                "bytes through bytes_to_unicode first (the vocabulary spells ' the' as 'Ġthe')" + note
            ) from None
        raise AssertionError(
            f"encode_ordinary({text!r}) raised KeyError {key!r}: some byte of this text has no character in the "
            "vocabulary (SmolLM2 lacks a few, e.g. 0x04); drop such characters from the word before merging, "
            "as the reference does" + note
        ) from None


def dropped_after_merging(text: str, smollm2) -> list[int]:
    """llama.cpp's way with a byte missing from the vocabulary: merge first, then drop the piece."""
    from llmrs_core.tokenizer.bpe import bpe_merge_word
    from llmrs_core.tokenizer.pretokenize import pretokenize

    pieces = [p for w in pretokenize(text) for p in bpe_merge_word(encode_bytes(w.encode("utf-8")), smollm2.ranks)]
    return [smollm2.vocab[p] for p in pieces if p in smollm2.vocab]


UNKNOWN_BYTES = ["x\x04y", "!\x04!"]


@pytest.mark.parametrize("text", TEXTS + UNKNOWN_BYTES, ids=[repr(t)[:25] for t in TEXTS + UNKNOWN_BYTES])
def test_ex2_4_encode_ordinary_matches_reference(ex, smollm2, reference, text):
    ours = encode(ex, text, smollm2.vocab, smollm2.ranks, hf=reference)
    theirs = reference.encode(text).ids
    if ours != theirs and ours == dropped_after_merging(text, smollm2):
        raise AssertionError(
            f"encode_ordinary({text!r}) = {ours}: you dropped the characters missing from the vocabulary after "
            f"merging; drop them from the word before merging, as the reference does ({theirs})"
        )
    assert ours == theirs, (
        f"encode_ordinary({text!r}): " + first_difference(ours, theirs, smollm2.piece)
        + also_failing(ex, text, reference, smollm2.vocab, smollm2.ranks)
    )
    cache: dict = {}
    assert encode(ex, text, smollm2.vocab, smollm2.ranks, cache) == theirs
    assert encode(ex, text, smollm2.vocab, smollm2.ranks, cache) == theirs, "wrong result from the cache"


def test_ex2_4_decode_ordinary_round_trips(ex, smollm2):
    for text in TEXTS:
        ids = smollm2.encode(text, allow_special=False)
        got = ex.decode_ordinary(ids, smollm2.tokens)
        assert "\ufffd" not in got or "\ufffd" in text, (
            f"decode_ordinary gives {got!r} for {text!r}: U+FFFD where a character's UTF-8 bytes are split "
            "over two tokens. Join all the tokens' bytes first, then decode UTF-8 once"
        )
        assert got == text, f"decode(encode({text!r})) = {got!r}"
    assert ex.decode_ordinary([], smollm2.tokens) == ""
    with pytest.raises(ValueError, match="49152"):
        ex.decode_ordinary([49152], smollm2.tokens)


# -- train_bpe ---------------------------------------------------------------------


def trained_by(text: str, num_merges: int, *, pick=min, min_frequency: int = 2) -> list[tuple[str, str]]:
    """One word's BPE training with ``pick`` over ``(-count, pair)`` choosing the merge: for naming mistakes."""
    parts = list(encode_bytes(text.encode("utf-8")))
    merges: list[tuple[str, str]] = []
    while len(merges) < num_merges and len(parts) > 1:
        counts: dict = {}
        for pair in zip(parts, parts[1:]):
            counts[pair] = counts.get(pair, 0) + 1
        count, best = pick((-n, pair) for pair, n in counts.items())
        if -count < min_frequency:
            break
        merges.append(best)
        i = 0
        while i < len(parts) - 1:
            if (parts[i], parts[i + 1]) == best:
                parts[i : i + 2] = [best[0] + best[1]]
            i += 1
    return merges


def pretokenize_note(ex, text: str) -> str:
    """The pointer the other 2.4 tests give, for train_bpe, which pre-tokenises first: said when the learner's
    pretokenize splits ``text`` differently from the engine's (which its own test judges against the reference)."""
    from llmrs_core.tokenizer.pretokenize import pretokenize

    try:
        if list(ex.pretokenize(text)) == pretokenize(text):
            return ""
    except Exception:  # noqa: BLE001 - a stub or a crash is a failing pretokenize too
        pass
    return " (your pretokenize fails on this text too: see its own test)"


def learner_words(ex, text: str) -> list[str]:
    """The learner's pretokenize of ``text`` in byte stand-ins ([] if it raises)."""
    try:
        return [encode_bytes(w.encode("utf-8")) for w in ex.pretokenize(text)]
    except Exception:  # noqa: BLE001 - judged in its own test
        return []


OVERLAP_TEXT = "aaa aaa"  # the words 'aaa' and ' aaa'
OVERLAP_WANT = [("a", "a"), ("aa", "a")]  # a+a occurs 4 times: 'aa a' twice, so aa+a twice; Ġ+aaa once only


def overlapping_merges(ex) -> str:
    """What the learner's train_bpe learns on 'aaa aaa' when its merges overlap, else "".

    Told by a merge whose symbol is in neither word ('aa' + 'aa' = 'aaaa'): a word's symbols no longer join back to
    the word, which happens when a merge takes a symbol that another occurrence of the pair took too (`a a a` ->
    `aa aa`), or keeps the right-hand symbol beside the merged one (`a b` -> `ab b`)."""
    try:
        got = ex.train_bpe(OVERLAP_TEXT, 5)
    except Exception:  # noqa: BLE001 - judged by the worked example's own check
        return ""
    words = [encode_bytes(w.encode("utf-8")) for w in ("aaa", " aaa")]
    if not any(isinstance(m, tuple) and len(m) == 2 and not any(m[0] + m[1] in w for w in words) for m in got):
        return ""
    return (f"your merges overlap: train_bpe({OVERLAP_TEXT!r}, 5) = {got}, expected {OVERLAP_WANT}; in each word "
            "replace the occurrences of the pair left to right without overlaps, so that the symbols always join "
            "back to the word: `a a a` with (a, a) becomes `aa a`, never `aa aa`, and `a b` becomes `ab`, not `ab b`")


def check_training(ex, text: str, num_merges: int, want: list, why: str) -> None:
    got = ex.train_bpe(text, num_merges)
    if got == want:
        return
    note = pretokenize_note(ex, text)
    mistakes = [
        ("ties broken the wrong way (Counter.most_common keeps the pair seen first, max the one that sorts last): among "
         "equally frequent pairs take the one that sorts first, min over (-count, pair)",
         trained_by(text, num_merges, pick=lambda c: max(c, key=lambda x: (-x[0], x[1])))),
        ("min_frequency ignored: stop when the best pair occurs fewer than min_frequency (2) times",
         trained_by(text, num_merges, min_frequency=0)),
    ]
    for mistake, wrong in mistakes:
        if got == wrong != want:
            raise AssertionError(f"train_bpe({text!r}, {num_merges}) = {got}: {mistake}; expected {want}{note}")
    overlap = overlapping_merges(ex)
    if overlap:
        raise AssertionError(f"train_bpe({text!r}, {num_merges}) = {got}, expected {want}: {overlap}{note}")
    raise AssertionError(f"train_bpe({text!r}, {num_merges}) = {got}, expected {want}: {why}{note}")


def test_ex2_4_train_bpe_worked_example(ex):
    # "aaabdaaabac": a+a occurs 4 times; after it, (a,b) and (aa,a) tie at 2 and
    # ('a', 'b') sorts first; then (aa, ab) occurs twice; nothing else repeats.
    check_training(ex, "aaabdaaabac", 10, [("a", "a"), ("a", "b"), ("aa", "ab")],
                   "a+a occurs 4 times; then (a, b) and (aa, a) tie at 2 and (a, b) sorts first; then (aa, ab)")
    check_training(ex, "aaabdaaabac", 1, [("a", "a")], "stop after num_merges merges")
    check_training(ex, "abc", 5, [], "no pair occurs twice: nothing to learn")
    check_training(ex, OVERLAP_TEXT, 5, OVERLAP_WANT,
                   "the words are 'aaa' and ' aaa'; a+a occurs 4 times, and merging it left to right without overlaps "
                   "leaves 'aa a' in each word: aa+a occurs twice; then Ġ+aaa occurs once, below min_frequency")


def test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs(ex):
    merges = ex.train_bpe(TRAINING_TEXT, 100)
    note = pretokenize_note(ex, TRAINING_TEXT)
    assert merges, "train_bpe(TRAINING_TEXT, 100) learned no merge; its pairs repeat plenty" + note
    # count the pairs of the untouched text: the first merge must be the most frequent one
    from llmrs_core.tokenizer.pretokenize import pretokenize  # judged in its own test: not the learner's here

    words = [encode_bytes(w.encode("utf-8")) for w in pretokenize(TRAINING_TEXT)]
    counts: dict = {}
    distinct: dict = {}
    for chars in words:
        for pair in zip(chars, chars[1:]):
            counts[pair] = counts.get(pair, 0) + 1
    for chars in set(words):
        for pair in zip(chars, chars[1:]):
            distinct[pair] = distinct.get(pair, 0) + 1
    best = min(counts, key=lambda p: (-counts[p], p))
    if merges[0] != best and merges[0] == min(distinct, key=lambda p: (-distinct[p], p)):
        raise AssertionError(
            f"first merge {merges[0]}: the most frequent pair if each distinct word counts once. Weight each "
            f"word's pairs by how often the word occurs: {best} occurs {counts[best]} times" + note
        )
    assert merges[0] == best, (
        f"first merge {merges[0]} occurs {counts.get(merges[0])} times; {best} occurs {counts[best]}" + note)
    assert len(merges) == 100, f"asked for 100 merges, got {len(merges)} (this text has enough repeated pairs)" + note
    if len(set(merges)) != 100:
        overlap = overlapping_merges(ex)
        raise AssertionError("a pair was merged twice" + (f": {overlap}" if overlap else "") + note)
    # each merge combines symbols that exist by then, inside a word
    known = set(ex.bytes_to_unicode().values())
    for i, (left, right) in enumerate(merges):
        assert left in known and right in known, f"merge {i} {(left, right)} uses a symbol not yet created" + note
        if not any(left + right in w for w in words):
            made = f"merge {i} {(left, right)} makes {left + right!r}, which is in no word of the text"
            overlap = overlapping_merges(ex)
            if overlap:
                raise AssertionError(f"{made}: {overlap}" + note)
            if note and any(left + right in w for w in learner_words(ex, TRAINING_TEXT)):
                raise AssertionError(f"{made} as SmolLM2 pre-tokenises it, though in a word of your pretokenize: "
                                     "your pretokenize fails on this text (see its own test); train_bpe, which "
                                     "counts pairs within its words, may well be right")
            raise AssertionError(f"{made}: count pairs within the words of pretokenize, never across a word "
                                 "boundary" + note)
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
        ours = encode(ex, text, vocab, ranks, hf=hf)
        assert ours == hf.encode(text).ids, (
            "encode_ordinary with the merges you trained differs from the reference BPE with the same merges: "
            + first_difference(ours, hf.encode(text).ids, tokens.__getitem__) + also_failing(ex, text, hf, vocab, ranks)
        )
        assert ex.decode_ordinary(ours, tokens) == text
    n_tokens = len(ex.encode_ordinary(TRAINING_TEXT, vocab, ranks))
    assert n_tokens < len(TRAINING_TEXT.encode()) / 2, (
        f"{len(merges)} merges should at least halve the token count of their own training text; got {n_tokens} "
        f"tokens for {len(TRAINING_TEXT.encode())} bytes"
    )
