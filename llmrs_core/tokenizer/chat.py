"""Prompt assembly (chapter 2): chat templates, a hand-written ChatML assembler, token budgets.

A chat model is trained on conversations laid out in one fixed text format;
SmolLM2's is ChatML::

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    Hi!<|im_end|>
    <|im_start|>assistant

The format ships with the model as a Jinja2 template
(``tokenizer.chat_template``). We render it in a *sandboxed* Jinja2
environment, because a template is code that came with a downloaded file.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

ROLES = ("system", "user", "assistant", "tool")
SMOLLM2_DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class ChatMessage(TypedDict):
    role: str
    content: str


class PromptTooLongError(ValueError):
    """Even the smallest allowed prompt does not fit the token budget."""


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """``ValueError`` naming the first malformed message (not a dict, bad role, non-str content)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"message {i} is a {type(m).__name__}, not a dict with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise ValueError(f"message {i} has role {m.get('role')!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} ({m['role']}) has no text 'content'")


def _raise_exception(message: str) -> None:
    raise ValueError(f"chat template: {message}")


@functools.lru_cache(maxsize=16)
def _compile_template(template: str) -> Any:
    """The template compiled once (it is rendered for every request, twice by ``encode_chat``)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template failed: {e}") from None


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """Render a Hugging Face-style Jinja2 chat template, sandboxed.

    Uses the settings transformers uses (``trim_blocks``, ``lstrip_blocks``,
    a ``raise_exception`` function, a ``tojson`` filter). Template errors
    come out as ``ValueError`` with the template's own message.
    """
    import jinja2

    check_messages(messages)
    compiled = _compile_template(template)
    try:
        return compiled.render(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables
        )
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template failed: {e}") from None


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
    return tokenizer.encode_rendered_chat(messages, lambda m: render_chatml(m, add_generation_prompt))


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
