"""Chapter 2's tests name each known mistake: proven by planting it.

As for chapter 3 (test_diagnose_ch03.py): each mistake is planted in a copy of
the solution — the engine's tokenizer function, recompiled from its source with
one edit (:func:`llmrs_core.testing.plant`), or a few lines written the wrong
way here, as a learner would — and the chapter 2 test that should catch it must
fail with the message that names the mistake.

Exercise 2.4: a pre-tokeniser that drops the spaces, skips the digit split or
splits the digits after GPT-2's pattern; merges in the wrong order (leftmost,
highest rank first) or only once; no byte fallback, the unknown byte dropped
after merging, raw text looked up; decoding token by token; training with the
ties broken the wrong way, min_frequency ignored, word counts not weighted,
pairs counted across words. Exercise 2.5: a layout without the assistant header,
the end-of-turn token or the default system message; special tokens encoded as
text, add_generation_prompt not passed on, a wrong layout blamed on
encode_chat; fit_to_budget dropping the newest turn, single messages or the
system message, or ignoring the reply's reserve.
"""

from __future__ import annotations

import pytest
import regex

from llmrs_core.testing import chapter_tests, plant, solution_with
from llmrs_core.testing import failure_message as failure
from llmrs_core.tokenizer import bpe, chat
from llmrs_core.tokenizer.pretokenize import GPT2_PATTERN
from llmrs_core.tokenizer.pretokenize import pretokenize as PRETOKENIZE

T24 = chapter_tests(2, "test_ex2_4_bpe.py")
T25 = chapter_tests(2, "test_ex2_5_prompt_assembler.py")


def ex_with(**planted):
    return solution_with(2, **planted)


# -- Exercise 2.4: pretokenize -----------------------------------------------------------


def digits_after_the_pattern(text: str) -> list[str]:
    """A learner's pretokenize: GPT-2's pattern first, then each word's digits split off."""
    words = []
    for w in GPT2_PATTERN.findall(text):
        words.extend(regex.findall(r"\p{N}|[^\p{N}]+", w))
    return words


PRETOKENIZE_MISTAKES = {
    "spaces dropped": (plant(PRETOKENIZE, ("words.extend(GPT2_PATTERN.findall(piece))", "words.extend(piece.split())")),
                       "Hello world", "loses the whitespace"),
    "no digit split": (plant(PRETOKENIZE, ("for piece in DIGIT.split(text):", "for piece in [text]:")),
                       "½ ² Ⅻ ٣٤ 12345", "GPT-2's pattern alone"),
    "digits split after the pattern": (digits_after_the_pattern, "a  1", "digits split afterwards"),
}


@pytest.mark.model
@pytest.mark.parametrize("mistake", PRETOKENIZE_MISTAKES)
def test_each_pretokenize_mistake_gets_its_own_message(mistake, ref):
    planted, text, message = PRETOKENIZE_MISTAKES[mistake]
    out = failure(T24.test_ex2_4_pretokenize_matches_smollm2, ex_with(pretokenize=planted), ref, text)
    assert message in out, out


# -- bpe_merge_word ------------------------------------------------------------------------

BEST = "if rank is not None and (best_rank is None or rank < best_rank):"
MERGE = "        parts[best_i : best_i + 2] = [parts[best_i] + parts[best_i + 1]]\n"
MERGE_MISTAKES = {
    "leftmost pair first": ((BEST, "if rank is not None and best_rank is None:"), "the leftmost pair that has a rank"),
    "highest rank first": ((BEST, BEST.replace("rank < best_rank", "rank > best_rank")), "merging the highest rank first"),
    "only one merge": ((MERGE, MERGE + "        break\n"), "stopping after one merge"),
}


@pytest.mark.parametrize("mistake", MERGE_MISTAKES)
def test_each_merge_mistake_gets_its_own_message(mistake):
    edit, message = MERGE_MISTAKES[mistake]
    out = failure(T24.test_ex2_4_bpe_merge_word_small_examples, ex_with(bpe_merge_word=plant(bpe.bpe_merge_word, edit)))
    assert message in out, out


# -- encode_ordinary / decode_ordinary -------------------------------------------------------

FALLBACK = "if any(p not in vocab for p in pieces):"
CHARS = 'chars = encode_bytes(word.encode("utf-8"))'
ENCODE_MISTAKES = {
    "no byte fallback": ([(FALLBACK, "if False:")], "x\x04y", "raised KeyError"),
    "unknown byte dropped after merging": (
        [('pieces = bpe_merge_word("".join(c for c in chars if c in vocab), ranks)', "pieces = bpe_merge_word(chars, ranks)")],
        "!\x04!", "dropped the characters missing from the vocabulary after merging"),
    "raw text, no byte map": ([(FALLBACK, "if False:"), (CHARS, "chars = word")], "Hello world",
                              "raw text, in the vocabulary: map each word's UTF-8 bytes through bytes_to_unicode"),
}


@pytest.mark.model
@pytest.mark.parametrize("mistake", ENCODE_MISTAKES)
def test_each_encode_mistake_gets_its_own_message(mistake, tok, ref):
    edits, text, message = ENCODE_MISTAKES[mistake]
    ex = ex_with(encode_ordinary=plant(bpe.encode_ordinary, *edits))
    out = failure(T24.test_ex2_4_encode_ordinary_matches_reference, ex, tok, ref, text)
    assert message in out, out


@pytest.mark.model
def test_a_wrong_merge_is_pointed_out_beside_the_encoding(tok, ref):
    """encode_ordinary built on the learner's broken bpe_merge_word says so, beside its own diagnosis."""
    once = plant(bpe.bpe_merge_word, MERGE_MISTAKES["only one merge"][0])
    ex = ex_with(bpe_merge_word=once, encode_ordinary=plant(bpe.encode_ordinary, bpe_merge_word=once))
    out = failure(T24.test_ex2_4_encode_ordinary_matches_reference, ex, tok, ref, "Hello world")
    assert "(your bpe_merge_word fails on this text too: see its own test)" in out, out
    assert "pretokenize fails" not in out, out


@pytest.mark.model
def test_decoding_token_by_token_is_named(tok):
    per_token = plant(bpe.decode_ordinary, ('return decode_chars(chars).decode("utf-8", errors="replace")',
                                            'return "".join(decode_chars(tokens[i]).decode("utf-8", errors="replace") for i in ids)'))
    out = failure(T24.test_ex2_4_decode_ordinary_round_trips, ex_with(decode_ordinary=per_token), tok)
    assert "Join all the tokens' bytes first, then decode UTF-8 once" in out, out


# -- train_bpe --------------------------------------------------------------------------------

BEST_PAIR = "best = min(pairs, key=lambda p: (-pairs[p], p))"
TRAIN_MISTAKES = {
    "ties broken by most_common": ((BEST_PAIR, "best = pairs.most_common(1)[0][0]"),
                                   T24.test_ex2_4_train_bpe_worked_example, "ties broken the wrong way"),
    "min_frequency ignored": (("if pairs[best] < min_frequency:", "if False:"),
                              T24.test_ex2_4_train_bpe_worked_example, "min_frequency ignored"),
    "word counts not weighted": (("pairs[pair] += n", "pairs[pair] += 1"),
                                 T24.test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs,
                                 "Weight each word's pairs by how often the word occurs"),
    "pairs across words": (('words = Counter(encode_bytes(w.encode("utf-8")) for w in pretokenize(text))',
                            'words = Counter([encode_bytes(text.encode("utf-8"))])'),
                           T24.test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs,
                           "never across a word boundary"),
}


@pytest.mark.parametrize("mistake", TRAIN_MISTAKES)
def test_each_training_mistake_gets_its_own_message(mistake):
    edit, test, message = TRAIN_MISTAKES[mistake]
    out = failure(test, ex_with(train_bpe=plant(bpe.train_bpe, edit)))
    assert message in out, out
    assert "overlap" not in out and "your pretokenize fails" not in out, out


REPLACE = """            i = 0
            while i < len(parts) - 1:
                if parts[i] == best[0] and parts[i + 1] == best[1]:
                    parts[i : i + 2] = [merged]
                i += 1
"""
OVERLAPPING = {
    # every occurrence merged, overlapping ones too: `a a a` -> `aa aa`
    "overlapping occurrences merged": """            hits = {i for i in range(len(parts) - 1) if (parts[i], parts[i + 1]) == best}
            parts[:] = [merged if i in hits else p for i, p in enumerate(parts) if i in hits or i - 1 not in hits]
""",
    # a comprehension over the pairs that keeps the right-hand symbol too: `a b` -> `ab b`
    "the right-hand symbol kept": """            parts[:] = [merged if (a, b) == best else a for a, b in zip(parts, parts[1:])] + parts[-1:]
""",
}


@pytest.mark.parametrize("mistake", OVERLAPPING)
def test_overlapping_merges_are_named(mistake):
    ex = ex_with(train_bpe=plant(bpe.train_bpe, (REPLACE, OVERLAPPING[mistake])))
    out = failure(T24.test_ex2_4_train_bpe_worked_example, ex)
    assert "your merges overlap" in out and "never `aa aa`" in out, out
    try:  # where the 100 merges fail, they say so too, and do not blame the word boundaries
        out = failure(T24.test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs, ex)
    except pytest.fail.Exception:
        return
    assert "your merges overlap" in out and "never across a word boundary" not in out, out


def test_the_right_hand_symbol_kept_is_not_blamed_on_word_boundaries():
    """The mistake the issue saw blamed on word boundaries: its 100 merges make 'Ġtt', in no word."""
    ex = ex_with(train_bpe=plant(bpe.train_bpe, (REPLACE, OVERLAPPING["the right-hand symbol kept"])))
    out = failure(T24.test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs, ex)
    assert "which is in no word of the text: your merges overlap" in out, out


@pytest.mark.parametrize("mistake", ["spaces dropped", "no digit split"])
def test_train_bpe_on_a_wrong_pretokenize_points_at_it(mistake):
    """A learner's train_bpe calls their pretokenize: its failure says that pretokenize fails on the text too.
    (Digits split after the pattern learns the right 100 merges: the training text has no digit after spaces.)"""
    wrong = PRETOKENIZE_MISTAKES[mistake][0]
    ex = ex_with(pretokenize=wrong, train_bpe=plant(bpe.train_bpe, pretokenize=wrong))
    out = failure(T24.test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs, ex)
    assert "your pretokenize fails on this text" in out and "never across a word boundary" not in out, out


def test_a_right_pretokenize_is_not_pointed_at():
    out = failure(T24.test_ex2_4_train_bpe_first_merges_are_the_most_frequent_pairs,
                  ex_with(train_bpe=plant(bpe.train_bpe, TRAIN_MISTAKES["pairs across words"][0])))
    assert "pretokenize fails" not in out, out


# -- Exercise 2.5: render_chatml ------------------------------------------------------------

TURN = "parts.append(f\"<|im_start|>{m['role']}\\n{m['content']}<|im_end|>\\n\")"
LAYOUT_MISTAKES = {
    "no assistant header": (("    if add_generation_prompt:\n", "    if False:\n"), "one user message", True,
                            "no assistant header at the end"),
    "assistant header always": (("    if add_generation_prompt:\n", "    if True:\n"), "one user message", False,
                                "an assistant header with add_generation_prompt=False"),
    "no end-of-turn token": ((TURN, TURN.replace("<|im_end|>", "")), "system and turns", True,
                             "no <|im_end|> after each message"),
    "no newline after the end-of-turn token": ((TURN, TURN.replace("<|im_end|>\\n", "<|im_end|>")), "system and turns",
                                               True, "no newline after <|im_end|>"),
    "no default system message": (('if messages[0]["role"] != "system" and default_system is not None:', "if False:"),
                                  "one user message", True, "no default system message"),
}


def render_with(edit):
    return plant(chat.render_chatml, edit)


@pytest.mark.model
@pytest.mark.parametrize("mistake", LAYOUT_MISTAKES)
def test_each_layout_mistake_gets_its_own_message(mistake, tok):
    edit, name, gen, message = LAYOUT_MISTAKES[mistake]
    out = failure(T25.test_ex2_5_render_chatml_equals_the_model_template, ex_with(render_chatml=render_with(edit)),
                  tok, name, gen)
    assert message in out, out


# -- encode_chat -------------------------------------------------------------------------------


def learner_encode_chat(render, allow_special=True, pass_generation_prompt=True):
    """A learner's encode_chat on their own render_chatml, as the exercise text suggests."""
    def encode_chat(tokenizer, messages, add_generation_prompt=True):
        text = render(messages, add_generation_prompt) if pass_generation_prompt else render(messages)
        return tokenizer.encode(text, allow_special=allow_special)
    return encode_chat


@pytest.mark.model
def test_special_tokens_encoded_as_text_are_named(tok):
    ex = ex_with(encode_chat=learner_encode_chat(chat.render_chatml, allow_special=False))
    out = failure(T25.test_ex2_5_encode_chat_matches_reference, ex, tok, "one user message", True)
    assert "were encoded as plain text" in out and "allow_special=True" in out, out


@pytest.mark.model
def test_add_generation_prompt_not_passed_on_is_named(tok):
    ex = ex_with(encode_chat=learner_encode_chat(chat.render_chatml, pass_generation_prompt=False))
    out = failure(T25.test_ex2_5_encode_chat_matches_reference, ex, tok, "system and turns", False)
    assert "encode_chat ignored add_generation_prompt=False" in out, out


@pytest.mark.model
def test_a_wrong_layout_is_blamed_on_render_chatml(tok):
    """encode_chat is right; the render_chatml it calls is not: the message says which."""
    wrong = render_with(LAYOUT_MISTAKES["no end-of-turn token"][0])
    ex = ex_with(render_chatml=wrong, encode_chat=learner_encode_chat(wrong))
    out = failure(T25.test_ex2_5_encode_chat_matches_reference, ex, tok, "system and turns", True)
    assert "your render_chatml differs from SmolLM2's template" in out, out


@pytest.mark.model
def test_the_learner_style_encode_chat_passes(tok):
    ex = ex_with(encode_chat=learner_encode_chat(chat.render_chatml))
    for gen in (True, False):
        T25.test_ex2_5_encode_chat_matches_reference(ex, tok, "system and turns", gen)


# -- fit_to_budget ----------------------------------------------------------------------------

TURNS_FROM = "        kept = system + [m for turn in turns[start:] for m in turn]"
FIT_MISTAKES = {
    "reserve for the reply ignored": (("budget = max_tokens - reserve_for_reply", "budget = max_tokens"),
                                      "drops", "leaves no room for the 50 tokens reserved"),
    "newest turn dropped": (("    for start in range(len(turns)):\n" + TURNS_FROM,
                             "    for start in range(len(turns), 0, -1):\n"
                             "        kept = system + [m for turn in turns[:start] for m in turn]"),
                            "drops", "dropped the newest message"),
    "single messages dropped": (("system, turns = split_turns(messages)",
                                 "system, turns = list(messages[:1]), [[m] for m in messages[1:]]"),
                                "never splits", "split a turn"),
    "system message dropped": ((TURNS_FROM, "        kept = [m for turn in turns[start:] for m in turn]"),
                               "drops", "dropped the system message"),
}


@pytest.mark.model
@pytest.mark.parametrize("mistake", FIT_MISTAKES)
def test_each_fit_mistake_gets_its_own_message(mistake, tok):
    edit, test, message = FIT_MISTAKES[mistake]
    ex = ex_with(fit_to_budget=plant(chat.fit_to_budget, edit))
    if test == "drops":
        out = failure(T25.test_ex2_5_fit_drops_oldest_whole_turns, ex, tok, 50)
    else:
        out = failure(T25.test_ex2_5_fit_never_splits_a_turn, ex, tok)
    assert message in out, out
