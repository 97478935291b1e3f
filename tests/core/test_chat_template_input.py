"""What the chat-template sandbox gives templates, and what it refuses (issue 29).

The features real templates use (``strftime_now``, transformers' ``tojson``, loop controls,
``{% generation %}``, the ``ipython`` role, text parts, ``raise_exception``) and bad input from
callers: unknown roles, non-text parts, template variables that are too many, too deep,
reserved or not JSON, each a ``ValueError`` naming the problem. The renderings are checked
against transformers in ``test_chat_templates.py``; here the rules themselves.
"""

from __future__ import annotations

import datetime
import json
import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llmrs_core.tokenizer import template as template_module
from llmrs_core.tokenizer.chat import content_format, render_chat_template
from llmrs_core.tokenizer.messages import (
    MAX_DEPTH,
    MAX_TEMPLATE_ITEMS,
    MAX_TEMPLATE_KWARGS,
    MAX_TOOLS,
    RESERVED_TEMPLATE_NAMES,
    check_template_kwargs,
    check_tools,
    template_messages,
)

HI = [{"role": "user", "content": "hi"}]
ECHO = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}"


def test_strftime_now_reads_the_clock(monkeypatch):
    monkeypatch.setattr(template_module, "now", lambda: datetime.datetime(2026, 1, 2, 3, 4, 5))
    template = "{{ strftime_now('%d %b %Y') }}|{{ date_string | default('none') }}"
    assert render_chat_template(template, HI) == "02 Jan 2026|none"
    assert render_chat_template(template, HI, date_string="26 Jul 2024") == "02 Jan 2026|26 Jul 2024"


def test_tojson_is_transformers_not_jinjas():
    """json.dumps with ensure_ascii=False: no HTML escapes, no \\u escapes; indent and separators work."""
    tools = [{"name": "f", "description": "«Zürich» <b>&'", "n": [1, 2]}]
    assert render_chat_template("{{ tools[0] | tojson }}", HI, tools=tools) == json.dumps(tools[0], ensure_ascii=False)
    assert render_chat_template("{{ tools[0] | tojson(indent=4) }}", HI, tools=tools) == json.dumps(
        tools[0], ensure_ascii=False, indent=4)
    assert render_chat_template("{{ tools[0] | tojson(separators=(',', ':'), sort_keys=true) }}", HI,
                                tools=tools) == json.dumps(tools[0], ensure_ascii=False, separators=(",", ":"),
                                                           sort_keys=True)
    with pytest.raises(ValueError, match="tojson indent 1000000 is wider than 16"):
        render_chat_template("{{ tools | tojson(indent=1000000) }}", HI, tools=tools)


def test_loop_controls_and_generation_blocks():
    template = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
                "{% if loop.index > 2 %}{% break %}{% endif %}{% generation %}{{ m.content }}{% endgeneration %}"
                "{% endfor %}")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert render_chat_template(template, messages) == "a"


def test_roles_parts_and_optional_fields():
    """ipython and tool roles; None fields dropped (transformers); reasoning under both names."""
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [{"type": "function",
                                                                      "function": {"name": "f", "arguments": {}}}]},
                {"role": "ipython", "content": "42"}, {"role": "tool", "content": "43", "name": None}]
    template = "{% for m in messages %}{{ m.role }}={{ 'content' in m }},{{ 'name' in m }};{% endfor %}"
    assert render_chat_template(template, messages) == "user=True,False;assistant=False,False;" \
                                                       "ipython=True,False;tool=True,False;"
    prepared = template_messages([{"role": "assistant", "content": "a", "reasoning": "r"}], join_text_parts=True)
    assert prepared == [{"thinking": "r", "role": "assistant", "content": "a", "reasoning": "r",
                         "reasoning_content": "r"}]


def test_text_parts_are_joined_unless_the_template_reads_them():
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert content_format(ECHO) == "string"
    assert render_chat_template(ECHO, parts) == "user:a\nb;"
    reads = ("{% for m in messages %}{% for p in m['content'] | list %}[{{ p.text }}]{% endfor %}"
             "{% endfor %}")
    assert content_format(reads) == "openai"
    assert render_chat_template(reads, parts) == "[a][b]"
    # through a variable set from messages, a slice of it, and a loop variable
    indirect = ("{% set rest = messages[1:] %}{% for x in rest %}{% for p in x.content %}{{ p.text }}"
                "{% endfor %}{% endfor %}")
    assert content_format(indirect) == "openai"


def test_raise_exception_is_a_clear_value_error():
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('a system message comes first') }}{% endif %}"
    with pytest.raises(ValueError, match="chat template refused these messages: a system message comes first"):
        render_chat_template(template, HI)


BAD_MESSAGES = {
    "unknown role": ([{"role": "robot", "content": "beep"}], "role 'robot'; expected one of system, user"),
    "an image part": ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                      "content part 0 is 'image_url'; only {'type': 'text'"),
    "a part that is not an object": ([{"role": "user", "content": ["hi"]}], "content part 0 is 'str'"),
    "a part with a number": ([{"role": "user", "content": [{"type": "text", "text": 5}]}],
                             "content part 0 has no string 'text' \\(got int\\)"),
    "content a number": ([{"role": "user", "content": 5}], "has int 'content'; expected a string or a list"),
    "no content": ([{"role": "user"}], "message 0 \\(user\\) has no text 'content'"),
    "a set in a field": ([{"role": "user", "content": "hi", "name": {1, 2}}], "message 0.name is a set"),
    "deep nesting": ([{"role": "user", "content": "hi", "x": json.loads("[" * 40 + "]" * 40)}],
                     f"nested more than {MAX_DEPTH} levels deep"),
    "tool_calls not a list": ([{"role": "assistant", "content": "", "tool_calls": "f()"}],
                              "tool_calls must be a list of objects"),
}


@pytest.mark.parametrize("messages, match", BAD_MESSAGES.values(), ids=BAD_MESSAGES)
def test_bad_messages_are_refused_naming_the_problem(messages, match):
    with pytest.raises(ValueError, match=match):
        render_chat_template(ECHO, messages)


BAD_KWARGS = {
    "not an object": (["enable_thinking"], "must be an object of template variables, got list"),
    "too many": ({f"v{i}": i for i in range(MAX_TEMPLATE_KWARGS + 1)}, f"the limit is {MAX_TEMPLATE_KWARGS}"),
    "reserved: messages": ({"messages": []}, "'messages' cannot be set here \\(it has its own parameter\\)"),
    "reserved: add_generation_prompt": ({"add_generation_prompt": False}, "its own parameter"),
    "reserved: a special token": ({"bos_token": "<|im_start|>"}, "the tokenizer's or the template sandbox's"),
    "reserved: a sandbox function": ({"raise_exception": 1}, "the tokenizer's or the template sandbox's"),
    "not a name": ({"enable-thinking": True}, "'enable-thinking' is not a template variable name"),
    "private": ({"_x": 1}, "'_x' is not a template variable name"),
    "not JSON": ({"when": datetime.date(2026, 1, 1)}, "chat_template_kwargs.when is a date"),
    "too deep": ({"x": json.loads("[" * 40 + "]" * 40)}, "nested more than"),
    "too big": ({"x": list(range(MAX_TEMPLATE_ITEMS))}, f"more than {MAX_TEMPLATE_ITEMS:,} values"),
}


@pytest.mark.parametrize("kwargs, match", BAD_KWARGS.values(), ids=BAD_KWARGS)
def test_bad_template_kwargs_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        check_template_kwargs(kwargs)


def test_bad_tools_are_refused():
    with pytest.raises(ValueError, match="tools must be a list of objects"):
        check_tools({"type": "function"})
    with pytest.raises(ValueError, match=f"the limit is {MAX_TOOLS}"):
        check_tools([{}] * (MAX_TOOLS + 1))
    with pytest.raises(ValueError, match="tools is empty"):
        check_tools([])
    assert check_tools(None) is None
    assert check_tools(({"type": "function"},)) == [{"type": "function"}]


def test_namespace_refuses_private_attributes():
    with pytest.raises(ValueError, match="may not start with '_'"):
        render_chat_template("{% set ns = namespace(_x=1) %}", HI)
    with pytest.raises(ValueError, match="may not start with '_'"):
        render_chat_template("{% set ns = namespace(a=1) %}{% set ns._x = 2 %}", HI)
    assert render_chat_template("{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a }}", HI) == "2"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=12)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True), json_values, max_size=5))
def test_json_kwargs_reach_the_template_unchanged(kwargs):
    """Any JSON object of allowed names is accepted and seen by the template as given."""
    # names the check refuses, and Jinja's own words (``true``, ``none``, ``in``...) a template cannot name
    kwargs = {k: v for k, v in kwargs.items() if k not in RESERVED_TEMPLATE_NAMES and not keyword.iskeyword(k)
              and k not in ("true", "false", "none", "and", "or", "not", "in", "is", "if", "else")}
    checked = check_template_kwargs(kwargs)
    assert checked == kwargs
    template = "{{ {" + ", ".join(f"'{k}': {k}" for k in checked) + "} | tojson }}"
    assert json.loads(render_chat_template(template, HI, **checked)) == kwargs
