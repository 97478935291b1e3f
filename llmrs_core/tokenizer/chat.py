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
The sandbox keeps it from reaching Python's internals, and bounds each
``range``; we also bound the *total* work of one rendering
(:func:`render_chat_template`): at most :data:`TEMPLATE_MAX_STEPS` loop
iterations and calls, :data:`TEMPLATE_MAX_SECONDS` seconds, and an output
of :data:`TEMPLATE_MAX_OUTPUT` characters plus four times the messages' text,
so that two nested ``range(99999)`` loops are an error, not a hang.
"""

from __future__ import annotations

import contextvars
import functools
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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


#: the most loop iterations plus calls (functions, methods, macros) one rendering may take
TEMPLATE_MAX_STEPS = 1_000_000
#: the most seconds one rendering may take (legitimate templates take milliseconds)
TEMPLATE_MAX_SECONDS = 10.0
#: characters one rendering may produce beyond four times the text of its messages
TEMPLATE_MAX_OUTPUT = 2**20
#: the largest result of ``**`` between integers, in bits
_MAX_POWER_BITS = 4096


class _RenderBudget:
    """The work one rendering may still do; ``ValueError`` once it is spent."""

    def __init__(self, max_output: int):
        self.steps = 0
        self.max_output = max_output
        self.deadline = time.monotonic() + TEMPLATE_MAX_SECONDS

    def step(self) -> None:
        self.steps += 1
        if self.steps > TEMPLATE_MAX_STEPS:
            raise ValueError(f"chat template: the rendering took more than {TEMPLATE_MAX_STEPS:,} loop iterations "
                             "and calls; the template loops without end, or there are too many messages")
        if not self.steps % 1024 and time.monotonic() > self.deadline:
            raise ValueError(f"chat template: the rendering took more than {TEMPLATE_MAX_SECONDS:g} s")

    def check_size(self, size: int, what: str) -> None:
        if size > self.max_output:
            raise ValueError(f"chat template: {what} of {size:,} characters is more than a rendering of these "
                             f"messages may produce ({self.max_output:,})")


_BUDGET: contextvars.ContextVar[_RenderBudget | None] = contextvars.ContextVar("llmrs_template_budget", default=None)


def _bounded_environment() -> Any:
    """A Jinja2 sandbox whose loops, calls and ``*``/``**`` count against the rendering's budget."""
    import jinja2.sandbox

    class BoundedSandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})  # also keeps them from being folded at compile time

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            budget = _BUDGET.get()
            if budget is not None:
                budget.step()
            return super().call(__context, __obj, *args, **kwargs)

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget = _BUDGET.get()
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
            if operator == "*" and budget is not None:
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                        budget.check_size(len(seq) * max(n, 0), "a repetition")
            if operator == "**" and ints and abs(left) > 1 and right > 0:
                if right * math.log2(abs(left)) > _MAX_POWER_BITS:
                    raise ValueError(f"chat template: {left} ** {right} has more than {_MAX_POWER_BITS} bits")
            return super().call_binop(context, operator, left, right)

        @staticmethod
        def llmrs_iterate(iterable: Iterable[Any]) -> Iterator[Any]:
            """Every ``{% for %}`` loop iterates through this (the compiled template is rewritten so)."""
            budget = _BUDGET.get()
            for item in iterable:
                if budget is not None:
                    budget.step()
                yield item

    return BoundedSandbox(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False)


@functools.lru_cache(maxsize=16)
def _compile_template(template: str) -> Any:
    """The template compiled once (it is rendered for every request, twice by ``encode_chat``),
    each ``for`` loop's iterable passed through the environment's counting ``llmrs_iterate``
    (an environment attribute: the template cannot rebind it)."""
    import jinja2
    from jinja2 import nodes

    env = _bounded_environment()
    env.globals["raise_exception"] = _raise_exception
    try:
        tree = env.parse(template)
        for loop in list(tree.find_all(nodes.For)):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("llmrs_iterate"), [loop.iter], [], None, None,
                                   lineno=loop.iter.lineno)
        return env.from_string(tree)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template failed: {e}") from None
    except RecursionError:
        raise ValueError("chat template failed: it is nested too deeply to compile") from None


def message_texts(messages: Any) -> list[str]:
    """Every string a chat template can see in ``messages``: roles, contents, names, tool calls...
    (the strings nested in its mappings and lists, in order; keys are not included). A front door
    bounds their length before anything renders or encodes them
    (:func:`llmrs_core.validation.precheck_chat`)."""
    out: list[str] = []
    stack = [messages]
    while stack:  # iterative: a deeply nested message is no recursion error
        value = stack.pop()
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, Mapping):
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed(value))
    return out


def _text_size(messages: Any) -> int:
    return sum(len(t) for t in message_texts(messages))


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **variables: Any,
) -> str:
    """Render a Hugging Face-style Jinja2 chat template, sandboxed and bounded.

    Uses the settings transformers uses (``trim_blocks``, ``lstrip_blocks``,
    a ``raise_exception`` function, a ``tojson`` filter). Template errors
    come out as ``ValueError`` with the template's own message. One rendering
    may take at most :data:`TEMPLATE_MAX_STEPS` loop iterations and calls and
    :data:`TEMPLATE_MAX_SECONDS` seconds, and produce at most
    :data:`TEMPLATE_MAX_OUTPUT` characters beyond four times the text of its
    messages (a repetition ``s * n`` counts before it is made); past any of
    them it is a ``ValueError`` saying which.
    """
    import jinja2

    check_messages(messages)
    compiled = _compile_template(template)
    budget = _RenderBudget(TEMPLATE_MAX_OUTPUT + 4 * _text_size(messages))
    token = _BUDGET.set(budget)
    try:
        chunks, size = [], 0
        for chunk in compiled.generate(
            messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables
        ):
            size += len(chunk)
            budget.check_size(size, "an output")
            chunks.append(chunk)
        return "".join(chunks)
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template failed: {e}") from None
    except RecursionError:
        raise ValueError("chat template failed: it recursed too deeply") from None
    except (ArithmeticError, TypeError, LookupError, AttributeError) as e:  # e.g. {{ 1 / 0 }} in the template
        raise ValueError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        _BUDGET.reset(token)


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
