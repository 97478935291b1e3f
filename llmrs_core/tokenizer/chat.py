"""Prompt assembly (chapter 2): chat templates, a hand-written ChatML assembler, token budgets.

A chat model is trained on conversations laid out in one fixed text format;
SmolLM2's is ChatML::

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    Hi!<|im_end|>
    <|im_start|>assistant

The format ships with the model as a Jinja2 template
(``tokenizer.chat_template``), rendered sandboxed and bounded by
:func:`render_chat_template` (:mod:`.template`); what it may be given is
checked in :mod:`.messages`. This module lays out ChatML by hand (the
exercise) and fits a conversation into a token budget.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from .messages import (
    ROLES,
    check_messages,
    check_template_kwargs,
    check_tools,
    message_texts,
)
from .template import (
    TEMPLATE_MAX_OUTPUT,
    TEMPLATE_MAX_SECONDS,
    TEMPLATE_MAX_STEPS,
    content_format,
    render_chat_template,
)

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

__all__ = [
    "ROLES", "SMOLLM2_DEFAULT_SYSTEM", "TEMPLATE_MAX_OUTPUT", "TEMPLATE_MAX_SECONDS", "TEMPLATE_MAX_STEPS",
    "ChatMessage", "PromptTooLongError", "check_messages", "check_template_kwargs", "check_tools", "content_format",
    "encode_chat", "fit_to_budget", "message_texts", "render_chat_template", "render_chatml", "split_turns",
]


class ChatMessage(TypedDict):
    role: str
    content: str


class PromptTooLongError(ValueError):
    """Even the smallest allowed prompt does not fit the token budget."""


def render_chatml(
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    default_system: str | None = SMOLLM2_DEFAULT_SYSTEM,
) -> str:
    """Assemble a ChatML prompt by hand; for SmolLM2 equal to its template's rendering.

    When the first message is not a system message and ``default_system`` is
    given, a system turn with that text comes first (as SmolLM2's template does).
    """
    check_messages(messages)
    if any(not isinstance(m.get("content"), str) for m in messages):
        raise ValueError("render_chatml lays out text content only; give parts and tool calls to a chat template")
    parts = []
    if messages[0]["role"] != "system" and default_system is not None:
        parts.append(f"<|im_start|>system\n{default_system}<|im_end|>\n")
    for m in messages:
        parts.append(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def encode_chat(
    tokenizer: Tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True
) -> list[int]:
    """Messages -> ChatML layout (:func:`render_chatml`) -> token ids.

    The layout's markers become control tokens; the messages' text is encoded
    as plain text, so a ``<|im_end|>`` typed in a message cannot end its turn
    (:meth:`Tokenizer.encode_rendered_chat <llmrs_core.tokenizer.Tokenizer.encode_rendered_chat>`).
    For messages without special-token text this is exactly
    ``tokenizer.encode(render_chatml(messages), allow_special=True)``, the
    exercise's version.
    """
    return tokenizer.encode_rendered_chat(messages, lambda m, _: render_chatml(m, add_generation_prompt))


def split_turns(messages: Sequence[Mapping[str, Any]]) -> tuple[list, list[list]]:
    """``(system_messages, turns)``: a leading system message, then turns that each start at a user message."""
    system = [messages[0]] if messages and messages[0]["role"] == "system" else []
    turns: list[list] = []
    for m in messages[len(system) :]:
        if m["role"] == "user" or not turns:
            turns.append([m])
        else:
            turns[-1].append(m)
    return system, turns


def fit_to_budget(
    messages: Sequence[Mapping[str, Any]],
    count_tokens: Callable[[list], int],
    max_tokens: int,
    reserve_for_reply: int = 0,
) -> list:
    """Drop the oldest whole turns until the prompt fits ``max_tokens - reserve_for_reply``.

    ``count_tokens(messages)`` gives the token count of the rendered prompt
    (e.g. ``tokenizer.count_chat_tokens``). The system message and the newest
    turn are always kept; a turn is a user message with the replies after it.
    Raises ``PromptTooLongError`` with the numbers when even the system
    message plus the last turn do not fit.
    """
    check_messages(messages)
    budget = max_tokens - reserve_for_reply
    if budget <= 0:
        raise PromptTooLongError(
            f"no room for a prompt: max_tokens {max_tokens} minus {reserve_for_reply} reserved for the reply"
        )
    system, turns = split_turns(messages)
    for start in range(len(turns)):
        kept = system + [m for turn in turns[start:] for m in turn]
        n = count_tokens(kept)
        if n <= budget:
            return kept
    raise PromptTooLongError(
        f"the last turn does not fit: {n} tokens with the system prompt, but only {budget} are available "
        f"({max_tokens} max, {reserve_for_reply} reserved for the reply)"
    )
