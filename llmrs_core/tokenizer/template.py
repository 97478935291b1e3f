"""Rendering a model's Jinja2 chat template, sandboxed and bounded (chapter 2).

A chat model's file carries the layout of its conversations as a Jinja2
template (``tokenizer.chat_template``). A template is code that came with a
downloaded file, so it runs in Jinja2's *immutable sandbox* (no reaching
Python's internals, no mutating what it is given), and the *total* work of one
rendering is bounded: at most :data:`TEMPLATE_MAX_STEPS` loop iterations and
calls, :data:`TEMPLATE_MAX_SECONDS` seconds, and an output of
:data:`TEMPLATE_MAX_OUTPUT` characters plus four times the text it was given,
so that two nested ``range(99999)`` loops are an error, not a hang.

Inside the sandbox a template finds what ``transformers.apply_chat_template``
gives it (real templates use all of it):

- ``raise_exception(msg)``: Gemma's refusal of non-alternating roles, a ``ValueError`` here;
- ``strftime_now(fmt)``: Llama 3.1/3.2 print today's date (``date_string`` overrides it);
- the ``tojson`` filter of transformers: ``json.dumps`` with ``ensure_ascii=False``
  and its ``indent``/``separators``/``sort_keys`` (Jinja's own escapes ``<>&'``
  as HTML and writes ASCII, which changes every tool schema);
- ``{% break %}``/``{% continue %}`` (``jinja2.ext.loopcontrols``), ``{% generation %}``
  blocks (rendered as their body), ``namespace`` refusing ``_`` attributes;
- ``messages``, ``add_generation_prompt``, ``tools`` and ``documents`` (``None``
  when not given, as transformers passes them) and the caller's variables.

Content given as text parts is joined into a string first for a template that
prints ``content`` as a string (:func:`content_format`, vLLM's rule); a template
that loops over ``message.content`` gets the parts.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import math
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .messages import check_messages, message_texts, template_messages

#: the most loop iterations plus calls (functions, methods, macros) one rendering may take
TEMPLATE_MAX_STEPS = 1_000_000
#: the most seconds one rendering may take (legitimate templates take milliseconds)
TEMPLATE_MAX_SECONDS = 10.0
#: characters one rendering may produce beyond four times the text it was given
TEMPLATE_MAX_OUTPUT = 2**20
#: the largest result of ``**`` between integers, in bits
_MAX_POWER_BITS = 4096
#: the widest ``tojson`` indent (templates use 2 or 4; a huge one would multiply the output at once)
_MAX_JSON_INDENT = 16


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


def now() -> datetime.datetime:
    """The clock ``strftime_now`` reads (local time, as transformers'); tests set a fixed one."""
    return datetime.datetime.now()


def _strftime_now(fmt: str) -> str:
    if not isinstance(fmt, str) or len(fmt) > 256:
        raise ValueError("chat template: strftime_now takes a format string of at most 256 characters")
    return now().strftime(fmt)


def _raise_exception(message: Any) -> None:
    raise ValueError(f"chat template refused these messages: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    """transformers' ``tojson``: ``json.dumps`` as written, not Jinja's HTML-safe ASCII version."""
    if isinstance(indent, int) and indent > _MAX_JSON_INDENT or isinstance(indent, str) and len(indent) > 16:
        raise ValueError(f"chat template: tojson indent {indent!r} is wider than {_MAX_JSON_INDENT}")
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    budget = _BUDGET.get()
    if budget is not None:
        budget.check_size(len(text), "a tojson result")
    return text


def _bounded_environment() -> Any:
    """A Jinja2 sandbox whose loops, calls and ``*``/``**`` count against the rendering's budget."""
    import jinja2.ext
    import jinja2.sandbox
    import jinja2.utils
    from jinja2 import nodes

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

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it): the body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    class Namespace(jinja2.utils.Namespace):
        """``namespace()`` that refuses ``_`` attributes (as transformers', against sandbox escapes)."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 -- Jinja's own signature trick
            self, rest = args[0], args[1:]
            attrs = dict(*rest, **kwargs)
            for name in attrs:
                Namespace.check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            Namespace.check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def check_name(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise ValueError(f"chat template: a namespace attribute may not start with '_' ({name!r})")

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False,
                         extensions=[jinja2.ext.loopcontrols, Generation])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=Namespace,
                       dict=lambda *a, **k: dict(*a, **k))
    return env


@functools.lru_cache(maxsize=16)
def _compile_template(template: str) -> tuple[Any, bool]:
    """The template compiled once (it is rendered for every request, twice by ``encode_chat``),
    each ``for`` loop's iterable passed through the environment's counting ``llmrs_iterate``
    (an environment attribute: the template cannot rebind it); and whether it loops over
    ``message.content`` (:func:`content_format`)."""
    import jinja2
    from jinja2 import nodes

    if not isinstance(template, str):
        raise ValueError(f"chat template must be text, got {type(template).__name__}")
    env = _bounded_environment()
    try:
        tree = env.parse(template)
        reads_parts = _loops_over_content(tree)
        for loop in list(tree.find_all(nodes.For)):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("llmrs_iterate"), [loop.iter], [], None, None,
                                   lineno=loop.iter.lineno)
        return env.from_string(tree), reads_parts
    except jinja2.TemplateError as e:
        raise ValueError(f"chat template failed: {e}") from None
    except RecursionError:
        raise ValueError("chat template failed: it is nested too deeply to compile") from None


# -- content format: does the template read text parts, or print content as a string? ----------


def _derived_from(node: Any, names: set[str], key: str | None = None) -> bool:
    """``node`` reads one of ``names`` (through filters, tests and slices), or its ``key`` item."""
    from jinja2 import nodes

    while isinstance(node, (nodes.Filter, nodes.Test)) or (
            isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)):
        node = node.node
        if node is None:
            return False
    if key is not None:
        if isinstance(node, nodes.Getattr) and node.attr == key:
            node = node.node
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const) and node.arg.value == key:
            node = node.node
        else:
            return False
    return isinstance(node, nodes.Name) and node.name in names


def _loops_over_content(tree: Any) -> bool:
    """vLLM's test of a template's content format: some ``for`` loop runs over ``m.content`` or
    ``m['content']`` where ``m`` runs over ``messages`` (or a variable set from it, a slice...)."""
    from jinja2 import nodes

    lists = {"messages"}
    grew = True
    while grew:  # `{% set loop_messages = messages[1:] %}` and chains of such
        grew = False
        for assign in tree.find_all(nodes.Assign):
            if isinstance(assign.target, nodes.Name) and assign.target.name not in lists \
                    and _derived_from(assign.node, lists):
                lists.add(assign.target.name)
                grew = True
    loops = list(tree.find_all(nodes.For))
    items = {loop.target.name for loop in loops
             if isinstance(loop.target, nodes.Name) and _derived_from(loop.iter, lists)}
    return any(_derived_from(loop.iter, items, "content") for loop in loops)


def content_format(template: str) -> str:
    """``"openai"`` if the template loops over a message's content (it reads text parts itself),
    else ``"string"`` (text parts are joined with ``"\\n"`` before it sees them); vLLM's rule."""
    return "openai" if _compile_template(template)[1] else "string"


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    documents: Any = None,
    **variables: Any,
) -> str:
    """Render a Hugging Face-style Jinja2 chat template, sandboxed and bounded.

    ``messages`` are checked (:func:`.messages.check_messages`) and prepared as
    transformers prepares them (:func:`.messages.template_messages`); ``tools``,
    ``documents`` and ``variables`` (special tokens, ``enable_thinking``,
    ``date_string``...) are passed as they are, ``tools`` and ``documents`` as
    ``None`` when not given. Template errors, ``raise_exception`` among them, come
    out as ``ValueError`` with the template's own message. One rendering may take
    at most :data:`TEMPLATE_MAX_STEPS` loop iterations and calls and
    :data:`TEMPLATE_MAX_SECONDS` seconds, and produce at most
    :data:`TEMPLATE_MAX_OUTPUT` characters beyond four times the text it was
    given (a repetition ``s * n`` counts before it is made); past any of them it
    is a ``ValueError`` saying which.
    """
    import jinja2

    check_messages(messages)
    compiled, reads_parts = _compile_template(template)
    prepared = template_messages(messages, join_text_parts=not reads_parts)
    given = [prepared, tools, documents, variables]
    budget = _RenderBudget(TEMPLATE_MAX_OUTPUT + 4 * sum(len(t) for t in message_texts(given)))
    token = _BUDGET.set(budget)
    try:
        chunks, size = [], 0
        for chunk in compiled.generate(messages=prepared, tools=tools, documents=documents,
                                       add_generation_prompt=add_generation_prompt, **variables):
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
