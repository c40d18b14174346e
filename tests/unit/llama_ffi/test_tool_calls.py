"""Tool calls: template families, the no-tools fallback, tool_choice grammars, parsing."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamad.errors import BadRequest, SchemaError
from llamad.llama_ffi.chat_template import ChatFormatter
from llamad.llama_ffi.tool_calls import (
    ToolFamily,
    family_of_template,
    parse_tool_calls,
    renders_tools,
    tool_call_grammar,
    tools_in_messages,
)

WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME: dict[str, Any] = {"type": "function", "function": {"name": "get_time"}}
TOOLS = [WEATHER, TIME]

#: SmolLM2-135M-Instruct's template (the default model): ChatML, no tools.
SMOL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging"
    " Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' +"
    " message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HERMES_NATIVE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>"
    "{% endfor %}{% endfor %}"
)
LLAMA3_NATIVE = "<|start_header_id|>{{ tools }}{{ messages[0].tool_calls }}<|eot_id|>"
MISTRAL_NATIVE = "[AVAILABLE_TOOLS]{{ tools }}[TOOL_CALLS]{{ messages[0].tool_calls }}"

HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "noon"},
]


# ---------------------------------------------------------------- families


def test_families_are_read_from_the_template() -> None:
    assert not renders_tools(SMOL)
    assert not renders_tools(None)
    assert family_of_template(SMOL) is ToolFamily.HERMES  # the fallback's format
    assert family_of_template(HERMES_NATIVE) is ToolFamily.HERMES
    assert family_of_template(LLAMA3_NATIVE) is ToolFamily.LLAMA3
    assert family_of_template(MISTRAL_NATIVE) is ToolFamily.MISTRAL
    assert family_of_template("{{ tools }}{{ m.tool_calls }}") is ToolFamily.GENERIC
    assert ChatFormatter(SMOL).tool_family is ToolFamily.HERMES
    assert ChatFormatter(MISTRAL_NATIVE).tool_family is ToolFamily.MISTRAL


# ---------------------------------------------------------------- rendering


def test_a_template_without_tools_gets_them_in_the_system_message() -> None:
    text = ChatFormatter(SMOL).render(HISTORY, tools=TOOLS)
    # The tools and the Hermes instructions in a system turn (replacing the default one).
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert "SmolLM" not in text
    assert json.dumps(WEATHER) in text
    assert "<tool_call></tool_call> XML tags" in text
    # The earlier calls as <tool_call> text, both results in one user turn.
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":'
        ' "Paris"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
        "</tool_call><|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\nnoon\n"
        "</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in text
    # Without the rewrite the template fails on content None.
    with pytest.raises(Exception, match="chat template failed"):
        ChatFormatter(SMOL).jinja.render(HISTORY)  # type: ignore[union-attr]


def test_the_tool_block_joins_an_existing_system_message() -> None:
    out = tools_in_messages(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], [TIME]
    )
    assert out[0]["role"] == "system"
    assert out[0]["content"].startswith("Be brief.\n\n# Tools")
    assert out[1] == {"role": "user", "content": "Hi"}
    # The system= argument is the same system message.
    text = ChatFormatter(SMOL).render([{"role": "user", "content": "Hi"}], tools=[TIME], system="S")
    assert text.startswith("<|im_start|>system\nS\n\n# Tools")


def test_a_tool_aware_template_renders_tools_itself() -> None:
    text = ChatFormatter(HERMES_NATIVE).render(HISTORY[:2], tools=[TIME])
    assert text == (
        '<tools>{"type": "function", "function": {"name": "get_time"}}</tools>'
        "<user>Weather in Paris?<assistant><tool_call>get_weather</tool_call>"
        "<tool_call>get_time</tool_call>"
    )


def test_a_chat_without_tools_renders_as_before() -> None:
    chat = [{"role": "user", "content": "Hi"}]
    assert ChatFormatter(SMOL).render(chat) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging"
        " Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_bad_tools_are_bad_requests() -> None:
    for tools, field in [
        ([{"type": "retrieval"}], "tools[0].type"),
        ([{"type": "function", "function": {"description": "no name"}}], "tools[0].function.name"),
        ([{"type": "function", "function": {"name": "f", "parameters": 3}}], "tools[0].function"),
    ]:
        with pytest.raises(BadRequest) as exc:
            ChatFormatter(SMOL).render([{"role": "user", "content": "Hi"}], tools=tools)
        assert exc.value.details["field"].startswith(field)


# ---------------------------------------------------------------- grammars


def test_tool_choice_none_or_auto_constrains_nothing() -> None:
    for choice in (None, "none", "auto"):
        assert tool_call_grammar(TOOLS, choice, ToolFamily.HERMES) is None


def test_required_grammar_admits_a_call_of_any_tool_in_the_family_format() -> None:
    hermes = tool_call_grammar(TOOLS, "required", ToolFamily.HERMES)
    assert hermes is not None
    assert hermes.startswith('root ::= "<tool_call>\\n" value "\\n</tool_call>"')
    assert '"\\"get_weather\\""' in hermes and '"\\"get_time\\""' in hermes
    assert '"\\"city\\":"' in hermes  # the parameters' schema is in the grammar
    llama3 = tool_call_grammar(TOOLS, "required", ToolFamily.LLAMA3)
    assert llama3 is not None and '"\\"parameters\\":"' in llama3 and "<tool_call>" not in llama3
    mistral = tool_call_grammar(TOOLS, "required", ToolFamily.MISTRAL)
    assert mistral is not None and mistral.startswith('root ::= "[TOOL_CALLS][" value "]"')


def test_named_grammar_admits_that_function_only() -> None:
    for choice in (
        {"type": "function", "function": {"name": "get_weather"}},
        {"type": "function", "name": "get_weather"},  # the Responses API's flat shape
    ):
        grammar = tool_call_grammar(TOOLS, choice, ToolFamily.HERMES)
        assert grammar is not None
        assert "get_weather" in grammar and "get_time" not in grammar


def test_parameters_with_local_refs_keep_resolving() -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "move",
            "parameters": {
                "type": "object",
                "properties": {"to": {"$ref": "#/$defs/point"}},
                "required": ["to"],
                "$defs": {
                    "point": {
                        "type": "object",
                        "properties": {"x": {"type": "integer"}},
                        "required": ["x"],
                    }
                },
            },
        },
    }
    grammar = tool_call_grammar([tool], "required", ToolFamily.HERMES)
    assert grammar is not None and '"\\"x\\":"' in grammar


def test_bad_tool_choices_are_refused() -> None:
    with pytest.raises(BadRequest, match="not among the tools"):
        tool_call_grammar(TOOLS, {"type": "function", "function": {"name": "nope"}}, "hermes")  # type: ignore[arg-type]
    with pytest.raises(BadRequest, match="needs tools"):
        tool_call_grammar([], "required", ToolFamily.HERMES)
    with pytest.raises(BadRequest) as exc:
        tool_call_grammar(TOOLS, "sometimes", ToolFamily.HERMES)
    assert exc.value.details["field"] == "tool_choice"
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}
    with pytest.raises(SchemaError):
        tool_call_grammar([bad], "required", ToolFamily.HERMES)


# ---------------------------------------------------------------- parsing


def test_hermes_calls_are_parsed_with_ids_and_json_arguments() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '</tool_call>\n<tool_call>{"name": "get_time", "arguments": "{}"}</tool_call>'
    )
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_time", {}),
    ]
    ids = [c.id for c in parsed.calls]
    assert all(i.startswith("call_") for i in ids) and len(set(ids)) == 2
    assert parsed.calls[0].to_openai() == {
        "id": ids[0],
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }


def test_an_unclosed_last_hermes_call_still_counts() -> None:
    parsed = parse_tool_calls('<tool_call>\n{"name": "get_time", "arguments": {}}')
    assert parsed.content is None
    assert [c.name for c in parsed.calls] == ["get_time"]


def test_llama3_json_and_python_tag_calls() -> None:
    parsed = parse_tool_calls('{"name": "get_weather", "parameters": {"city": "Oslo"}}', TOOLS)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("get_weather", '{"city": "Oslo"}')]
    tagged = parse_tool_calls('<|python_tag|>{"name": "get_time", "parameters": {}}', TOOLS)
    assert [c.name for c in tagged.calls] == ["get_time"]
    assert tagged.content is None


def test_mistral_calls_both_spellings() -> None:
    listed = parse_tool_calls(
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}},'
        ' {"name": "get_time", "arguments": {}}]',
        TOOLS,
    )
    assert [c.name for c in listed.calls] == ["get_weather", "get_time"]
    v11 = parse_tool_calls('[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}', TOOLS)
    assert [(c.name, c.arguments) for c in v11.calls] == [("get_weather", '{"city": "Rome"}')]


def test_text_that_is_not_a_call_stays_content() -> None:
    for text in [
        "Hello there.",
        '{"answer": 42}',  # JSON, but no call
        '{"name": "unknown_tool", "arguments": {}}',  # not one of the tools
        "<tool_call>not json</tool_call>",
        '<tool_call>{"name": "get_time", "arguments": "not json"}</tool_call>',
        "[TOOL_CALLS] nothing",
    ]:
        parsed = parse_tool_calls(text, TOOLS)
        assert parsed.calls == [] and parsed.content == text, text
