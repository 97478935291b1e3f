"""Exercise 2.5 — Building a Prompt Assembler.

The reference for the layout is SmolLM2's own chat template from its GGUF
file, rendered by jinja2; for token ids, Hugging Face `tokenizers`.
"""

from __future__ import annotations

import pytest

from llmrs_core.tokenizer import Tokenizer
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


@pytest.mark.parametrize("name", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_ex2_5_render_chatml_equals_the_model_template(ex, smollm2, name, add_generation_prompt):
    messages = CONVERSATIONS[name]
    ours = ex.render_chatml(messages, add_generation_prompt)
    want = smollm2.apply_chat_template(messages, add_generation_prompt)
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
def test_ex2_5_encode_chat_matches_reference(ex, smollm2, name):
    messages = CONVERSATIONS[name]
    ids = ex.encode_chat(smollm2, messages)
    want = reference_tokenizer(smollm2).encode(smollm2.apply_chat_template(messages)).ids
    assert ids == want, "encode_chat: the special tokens must become single ids (allow_special=True)"
    assert ids[0] == smollm2.special_tokens["<|im_start|>"]


# -- fit_to_budget -----------------------------------------------------------------


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
    assert kept == want, (
        f"kept {len(kept)} messages, expected {len(want)}: keep the system message and the newest "
        "turns that fit, dropping whole (user + assistant) turns from the oldest"
    )
    assert count(kept) <= max_tokens - reserve


def test_ex2_5_fit_never_splits_a_turn(ex, smollm2):
    msgs = long_chat(5)
    for budget in range(smollm2.count_chat_tokens(msgs[:1] + msgs[-1:]), smollm2.count_chat_tokens(msgs), 7):
        kept = ex.fit_to_budget(msgs, smollm2.count_chat_tokens, max_tokens=budget)
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
