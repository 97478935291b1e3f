"""Exercise 2.5 — Building a Prompt Assembler.

The reference for the layout is SmolLM2's own chat template from its GGUF
file, rendered by jinja2; for token ids, Hugging Face `tokenizers`.
"""

from __future__ import annotations

import pytest

from llmrs_core.tokenizer import Tokenizer
from llmrs_core.tokenizer.chat import SMOLLM2_DEFAULT_SYSTEM
from llmrs_core.tokenizer.reference import reference_tokenizer

CONVERSATIONS = {
    "one user message": [{"role": "user", "content": "What is 2+2?"}],
    "system and turns": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Name a crab 🦀."},
    ],
    "empty and spaced": [{"role": "user", "content": ""}, {"role": "assistant", "content": "  two\nlines  "}],
}


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> Tokenizer:
    return Tokenizer.from_gguf(smollm2_gguf)


def long_chat(n_turns: int) -> list[dict]:
    msgs = [{"role": "system", "content": "Be brief."}]
    for i in range(n_turns):
        msgs.append({"role": "user", "content": f"Question {i}: " + "why " * (5 + i)})
        msgs.append({"role": "assistant", "content": f"Answer {i}: " + "because " * (3 + i)})
    msgs.append({"role": "user", "content": "And finally?"})
    return msgs


GENERATION_PROMPT = "<|im_start|>assistant\n"


def layout_mistakes(messages, want: str, add_generation_prompt: bool) -> list[tuple[str, str]]:
    """The template's rendering as the usual slips would change it: ``(what went wrong, text)``."""
    mistakes = [
        ("no <|im_end|> after each message: every turn ends with the end-of-turn token '<|im_end|>' and a "
         "newline, or the model never learns where a turn stops", want.replace("<|im_end|>", "")),
        ("no newline after <|im_end|>: each turn is '<|im_start|>role\\ncontent<|im_end|>\\n'",
         want.replace("<|im_end|>\n", "<|im_end|>")),
    ]
    if add_generation_prompt:
        mistakes.append(("no assistant header at the end: with add_generation_prompt=True the prompt ends with "
                         "'<|im_start|>assistant\\n', so the model writes the reply", want.removesuffix(GENERATION_PROMPT)))
    else:
        mistakes.append(("an assistant header with add_generation_prompt=False: add '<|im_start|>assistant\\n' "
                         "only when asked", want + GENERATION_PROMPT))
    if messages[0]["role"] != "system":
        default = f"<|im_start|>system\n{SMOLLM2_DEFAULT_SYSTEM}<|im_end|>\n"
        mistakes.append(("no default system message: when the first message is not a system message, SmolLM2's "
                         "template puts its default one first", want.removeprefix(default)))
    return [(why, text) for why, text in mistakes if text != want]


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_ex2_5_render_chatml_equals_the_model_template(ex, smollm2, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    ours = ex.render_chatml(messages, add_generation_prompt)
    want = smollm2.apply_chat_template(messages, add_generation_prompt)
    for why, wrong in layout_mistakes(messages, want, add_generation_prompt):
        if ours == wrong:
            pytest.fail(f"render_chatml({name}, add_generation_prompt={add_generation_prompt}): {why}")
    if ours != want:
        i = next((k for k, (a, b) in enumerate(zip(ours, want)) if a != b), min(len(ours), len(want)))
        pytest.fail(
            f"render_chatml differs from SmolLM2's template at character {i}:\n"
            f"yours:     {ours[max(0, i - 20):i + 30]!r}\ntemplate:  {want[max(0, i - 20):i + 30]!r}"
        )


def test_ex2_5_default_system_prompt(ex):
    msgs = [{"role": "user", "content": "Hi"}]
    assert ex.render_chatml(msgs, default_system="Be kind.").startswith("<|im_start|>system\nBe kind.<|im_end|>\n")
    assert ex.render_chatml(msgs, default_system=None) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


@pytest.mark.parametrize(
    "messages",
    [[], [{"role": "robot", "content": "beep"}], [{"role": "user"}], ["just a string"], "not a list"],
    ids=["empty", "unknown role", "no content", "not a dict", "a string"],
)
def test_ex2_5_malformed_messages_are_refused(ex, messages):
    with pytest.raises(ValueError):
        ex.render_chatml(messages)


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_ex2_5_encode_chat_matches_reference(ex, smollm2, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    text = smollm2.apply_chat_template(messages, add_generation_prompt)
    ids = ex.encode_chat(smollm2, messages, add_generation_prompt)
    want = reference_tokenizer(smollm2).encode(text).ids
    if ids == want:
        return
    if ex.render_chatml(messages, add_generation_prompt) != text:  # blame render_chatml, not encode_chat
        pytest.fail("encode_chat: your render_chatml differs from SmolLM2's template (see its own test); "
                    "encode_chat's ids follow from it, so fix render_chatml first")
    as_text = smollm2.encode(text, allow_special=False)
    assert ids != as_text, (
        "encode_chat: <|im_start|> and <|im_end|> were encoded as plain text, several tokens each; they must "
        "become their single control-token ids: encode with allow_special=True"
    )
    other = smollm2.apply_chat_template(messages, not add_generation_prompt)
    assert ids != reference_tokenizer(smollm2).encode(other).ids, (
        f"encode_chat ignored add_generation_prompt={add_generation_prompt}: pass it on to render_chatml"
    )
    pytest.fail(f"encode_chat({name}) gives {len(ids)} ids, the reference {len(want)}; "
                f"first difference at index {next((i for i, (a, b) in enumerate(zip(ids, want)) if a != b), min(len(ids), len(want)))}")


# -- fit_to_budget -----------------------------------------------------------------


def check_kept(msgs: list, kept: list, count, max_tokens: int, reserve: int) -> None:
    """What fit_to_budget kept, against its rules one by one, each with its own message."""
    assert kept and kept[0] == msgs[0], "fit_to_budget dropped the system message: it is always kept, first"
    assert kept[-1] == msgs[-1], (
        "fit_to_budget dropped the newest message: drop turns from the oldest, and keep the newest turn always"
    )
    assert len(kept) == 1 or kept[1]["role"] == "user", (
        f"fit_to_budget split a turn: the first message after the system message is {kept[1]['role']!r}, "
        "not 'user'. Drop whole "
        "turns (a user message with the replies after it), not single messages"
    )
    assert kept == msgs[:1] + msgs[len(msgs) - len(kept) + 1 :], (
        "fit_to_budget kept messages that are not the newest ones: drop the OLDEST turns first"
    )
    n = count(kept)
    assert n <= max_tokens - reserve or n > max_tokens, (
        f"fit_to_budget's prompt is {n} tokens: it fits max_tokens ({max_tokens}) but leaves no room for the "
        f"{reserve} tokens reserved for the reply; fit into max_tokens - reserve_for_reply"
    )


def test_ex2_5_fit_keeps_everything_that_fits(ex, smollm2):
    msgs = long_chat(3)
    n = smollm2.count_chat_tokens(msgs)
    assert ex.fit_to_budget(msgs, smollm2.count_chat_tokens, max_tokens=n) == msgs


@pytest.mark.parametrize("reserve", [0, 50])
def test_ex2_5_fit_drops_oldest_whole_turns(ex, smollm2, reserve):
    msgs = long_chat(6)
    count = smollm2.count_chat_tokens
    system, turns = msgs[:1], [msgs[i : i + 2] for i in range(1, len(msgs) - 1, 2)] + [msgs[-1:]]
    max_tokens = count(system + [m for t in turns[3:] for m in t]) + reserve + 3
    kept = ex.fit_to_budget(msgs, count, max_tokens=max_tokens, reserve_for_reply=reserve)
    want = system + [m for t in turns[3:] for m in t]
    check_kept(msgs, kept, count, max_tokens, reserve)
    assert kept == want, (
        f"kept {len(kept)} messages, expected {len(want)}: keep the system message and the newest "
        "turns that fit, dropping whole (user + assistant) turns from the oldest"
    )
    assert count(kept) <= max_tokens - reserve


def test_ex2_5_fit_never_splits_a_turn(ex, smollm2):
    msgs = long_chat(5)
    for budget in range(smollm2.count_chat_tokens(msgs[:1] + msgs[-1:]), smollm2.count_chat_tokens(msgs), 7):
        kept = ex.fit_to_budget(msgs, smollm2.count_chat_tokens, max_tokens=budget)
        check_kept(msgs, kept, smollm2.count_chat_tokens, budget, 0)
        assert kept[0] == msgs[0], "the system message is always kept"
        assert kept[-1] == msgs[-1], "the newest turn is always kept"
        assert kept[1]["role"] == "user", "a kept part of the conversation starts at a user message"
        assert smollm2.count_chat_tokens(kept) <= budget


def test_ex2_5_fit_refuses_when_the_last_turn_cannot_fit(ex, smollm2):
    msgs = long_chat(2)
    minimum = smollm2.count_chat_tokens(msgs[:1] + msgs[-1:])
    with pytest.raises(ex.PromptTooLongError, match=str(minimum)):
        ex.fit_to_budget(msgs, smollm2.count_chat_tokens, max_tokens=minimum - 1)
    with pytest.raises(ex.PromptTooLongError):
        ex.fit_to_budget(msgs, smollm2.count_chat_tokens, max_tokens=100, reserve_for_reply=100)
    assert issubclass(ex.PromptTooLongError, ValueError)
