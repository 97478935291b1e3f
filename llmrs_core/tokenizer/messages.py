"""What a chat template may be given (chapter 2): messages, tools and template variables, checked.

A chat request carries more than ``{"role", "content"}`` pairs. OpenAI's API,
vLLM and Hugging Face ``transformers`` also pass:

- ``content`` as a list of parts, ``[{"type": "text", "text": "..."}]``;
- assistant messages with ``tool_calls`` (and no content), ``tool`` (or
  Llama 3.1's ``ipython``) messages with a tool's answer, ``name``,
  ``tool_call_id``, and a thinking model's ``reasoning_content``;
- ``tools`` (JSON schemas of the functions the model may call) and other
  template variables (``enable_thinking`` for Qwen3, ``date_string`` for
  Llama 3.1, ``documents`` for RAG templates): vLLM's ``chat_template_kwargs``.

All of it comes from clients, so it is checked here, each mistake a
``ValueError`` naming the message or field, before a template sees it: only
plain JSON data (strings, numbers, booleans, null, lists, objects with string
keys), nested at most :data:`MAX_DEPTH` deep. :func:`template_messages` then
gives the template what ``transformers.apply_chat_template`` would: keys whose
value is ``None`` dropped, ``reasoning_content`` also under ``thinking``, and
(for templates that print ``content`` as a string, as vLLM does) text parts
joined by newlines.
"""

from __future__ import annotations

import keyword
from collections.abc import Mapping, Sequence
from typing import Any

#: the roles a message may have (``ipython`` is Llama 3.1's name for a tool's answer)
ROLES = ("system", "user", "assistant", "tool", "ipython")
#: the one kind of content part this engine reads (no images or audio)
PART_TYPES = ("text",)
#: the deepest nesting of lists and objects in messages, tools and template variables
MAX_DEPTH = 32
#: the most values (strings, numbers, lists, objects...) in the tools, or in the template variables
MAX_TEMPLATE_ITEMS = 65_536
#: the most template variables (``chat_template_kwargs``) one request may set
MAX_TEMPLATE_KWARGS = 64
#: the most tools one request may describe
MAX_TOOLS = 128
#: variables a caller may not set through ``chat_template_kwargs``: they have their own parameters,
#: come from the tokenizer (its special tokens), or are the sandbox's functions
RESERVED_TEMPLATE_NAMES = frozenset({
    "messages", "add_generation_prompt", "tools", "continue_final_message", "chat_template", "tokenize",
    "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token",
    "additional_special_tokens", "raise_exception", "strftime_now", "namespace", "dict", "range", "lipsum",
    "cycler", "joiner",
})
#: the values of ``role`` and ``type`` that templates compare against (``item.type == 'text'``,
#: ``value['type'] | upper == 'STRING'``): :meth:`Tokenizer.encode_rendered_chat` leaves them in place
#: instead of hiding them behind placeholders
LAYOUT_WORDS = frozenset({*ROLES, *PART_TYPES, "function", "string", "number", "integer", "boolean", "object",
                          "array", "null"})
# names a message's reasoning goes under; templates read the first (transformers fills both)
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def check_json_data(value: Any, what: str, max_items: int | None = None) -> int:
    """``ValueError`` naming ``what`` unless ``value`` is plain JSON data (str, int, float, bool,
    None, lists/tuples, mappings with str keys) nested at most :data:`MAX_DEPTH` deep, with at most
    ``max_items`` values; returns the number of values. Iterative: deep nesting is no recursion error."""
    count, stack = 0, [(value, what, 0)]
    while stack:
        item, where, depth = stack.pop()
        count += 1
        if max_items is not None and count > max_items:
            raise ValueError(f"{what} holds more than {max_items:,} values")
        if item is None or isinstance(item, (str, bool, int, float)):
            continue
        if depth >= MAX_DEPTH:
            raise ValueError(f"{where} is nested more than {MAX_DEPTH} levels deep")
        if isinstance(item, Mapping):
            for key, sub in item.items():
                if not isinstance(key, str):
                    raise ValueError(f"{where} has a key {key!r} that is not a string")
                stack.append((sub, f"{where}.{key}", depth + 1))
        elif isinstance(item, (list, tuple)):
            stack.extend((sub, f"{where}[{i}]", depth + 1) for i, sub in enumerate(item))
        else:
            raise ValueError(f"{where} is a {type(item).__name__}; only JSON data (strings, numbers, "
                             "booleans, null, lists and objects) may be given to a chat template")
    return count


def _check_content(i: int, m: Mapping[str, Any]) -> None:
    content = m.get("content")
    if isinstance(content, str):
        return
    role = m["role"]
    if content is None:
        if role == "assistant" and m.get("tool_calls"):
            return  # OpenAI's tool-calling turn: content null, the calls in tool_calls
        raise ValueError(f"message {i} ({role}) has no text 'content'")
    if isinstance(content, (list, tuple)):
        for j, part in enumerate(content):
            if not isinstance(part, Mapping) or part.get("type") not in PART_TYPES:
                got = part.get("type") if isinstance(part, Mapping) else _kind(part)
                raise ValueError(f"message {i} ({role}): content part {j} is {got!r}; only "
                                 "{'type': 'text', 'text': '...'} parts are supported")
            if not isinstance(part.get("text"), str):
                raise ValueError(f"message {i} ({role}): content part {j} has no string 'text' "
                                 f"(got {_kind(part.get('text'))})")
        return
    raise ValueError(f"message {i} ({role}) has {_kind(content)} 'content'; expected a string or a list "
                     "of {'type': 'text', 'text': '...'} parts")


def check_messages(messages: Sequence[Mapping[str, Any]]) -> None:
    """``ValueError`` naming the first malformed message: not a dict, a role not in :data:`ROLES`,
    content neither a string nor a list of text parts (``None`` only beside ``tool_calls``), or a
    field that is not plain JSON data."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    if not messages:
        raise ValueError("messages is empty")
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"message {i} is a {type(m).__name__}, not a dict with 'role' and 'content'")
        if m.get("role") not in ROLES:
            raise ValueError(f"message {i} has role {m.get('role')!r}; expected one of {', '.join(ROLES)}")
        _check_content(i, m)
        check_json_data(m, f"message {i}")
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, (list, tuple)) and all(isinstance(c, Mapping) for c in calls)):
            raise ValueError(f"message {i} ({m['role']}): tool_calls must be a list of objects")


def check_tools(tools: Any) -> list[dict[str, Any]] | None:
    """``tools`` as a list of JSON objects (``None`` stays ``None``): at least one, at most
    :data:`MAX_TOOLS`, plain JSON data; ``ValueError`` naming ``tools`` otherwise."""
    if tools is None:
        return None
    if not isinstance(tools, (list, tuple)) or not all(isinstance(t, Mapping) for t in tools):
        raise ValueError(f"tools must be a list of objects (JSON schemas of functions), got {_kind(tools)}")
    if not tools:  # as OpenAI's API: a template tests `{% if tools %}`, and [] would read as "no tools" anyway
        raise ValueError("tools is empty: leave it out (or null) when there are no tools")
    if len(tools) > MAX_TOOLS:
        raise ValueError(f"tools lists {len(tools):,} tools; the limit is {MAX_TOOLS}")
    check_json_data(tools, "tools", MAX_TEMPLATE_ITEMS)
    return [_plain(t) for t in tools]


def check_template_kwargs(kwargs: Any) -> dict[str, Any]:
    """``chat_template_kwargs`` as a dict of template variables; ``ValueError`` naming the field
    unless it is an object of at most :data:`MAX_TEMPLATE_KWARGS` names, each a Python identifier
    not starting with ``_`` and not in :data:`RESERVED_TEMPLATE_NAMES`, with plain JSON values.

    A name the template does not use has no effect (as in vLLM and transformers)."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"chat_template_kwargs must be an object of template variables, got {_kind(kwargs)}")
    if len(kwargs) > MAX_TEMPLATE_KWARGS:
        raise ValueError(f"chat_template_kwargs sets {len(kwargs):,} variables; the limit is {MAX_TEMPLATE_KWARGS}")
    for name in kwargs:
        if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise ValueError(f"chat_template_kwargs: {name!r} is not a template variable name (letters, digits "
                             "and '_', not starting with '_' or a digit)")
        if name in RESERVED_TEMPLATE_NAMES:
            raise ValueError(f"chat_template_kwargs: {name!r} cannot be set here ("
                             + ("it has its own parameter" if name in ("messages", "add_generation_prompt", "tools")
                                else "it is the tokenizer's or the template sandbox's") + ")")
    check_json_data(dict(kwargs), "chat_template_kwargs", MAX_TEMPLATE_ITEMS)
    return {name: _plain(value) for name, value in kwargs.items()}


def template_data(tools: Any = None, chat_template_kwargs: Any = None) -> dict[str, Any]:
    """The caller's data for a template, checked: ``{"tools": ..., **chat_template_kwargs}``."""
    return {"tools": check_tools(tools), **check_template_kwargs(chat_template_kwargs)}


def _plain(value: Any) -> Any:
    """A copy of checked JSON data as dicts and lists (tuples become lists): the template gets
    fresh objects, never the caller's."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def template_messages(messages: Sequence[Mapping[str, Any]], join_text_parts: bool) -> list[dict[str, Any]]:
    """The messages as a template sees them, as ``transformers.apply_chat_template`` prepares them:
    fresh dicts, keys whose value is ``None`` dropped (a template tests ``message.content is
    defined``, not ``is none``), and a reasoning field copied to ``reasoning_content`` and
    ``thinking``. With ``join_text_parts`` (a template that prints ``content`` as a string, see
    :func:`.template.content_format`) a list of text parts becomes their texts joined by ``"\\n"``,
    as vLLM does. ``messages`` must have passed :func:`check_messages`."""
    out = []
    for m in messages:
        msg = {k: _plain(v) for k, v in m.items() if v is not None}
        reasoning = next((msg[k] for k in _REASONING_FIELDS if k in msg), None)
        if reasoning is not None:
            msg = {"thinking": reasoning, **msg, "reasoning_content": reasoning}
        if join_text_parts and isinstance(msg.get("content"), list):
            msg["content"] = "\n".join(part["text"] for part in msg["content"])
        out.append(msg)
    return out


def message_texts(messages: Any) -> list[str]:
    """Every string a chat template can see in ``messages`` (or tools, or template variables):
    roles, contents, names, tool calls... (the strings nested in its mappings and lists, in order;
    keys are not included). A front door bounds their length before anything renders or encodes
    them (:func:`llmrs_core.validation.precheck_chat`)."""
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
