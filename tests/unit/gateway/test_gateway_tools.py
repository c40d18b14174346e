"""tools / tool_choice over HTTP: checking them, reading calls out of replies and streams."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamad.gateway.errors import HttpError
from llamad.gateway.openai import chat_response
from llamad.gateway.tools import ToolStream, ToolUse, call_deltas, finish_reason, tool_use
from llamad.model.results import CacheHitKind, Completion, FinishReason, Stats

TIME: dict[str, Any] = {"type": "function", "function": {"name": "get_time"}}
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'


def test_tools_and_choices_are_checked_naming_the_field() -> None:
    assert tool_use(None, None) == ToolUse()
    assert tool_use([TIME], "required").chat_options() == {
        "tools": [TIME],
        "tool_choice": "required",
    }
    assert tool_use(None, None).chat_options() == {}
    for tools, choice, param in [
        (None, "required", "tool_choice"),
        ({"not": "a list"}, None, "tools"),
        ([TIME], "often", "tool_choice"),
        ([TIME], {"type": "function", "function": {"name": "other"}}, "tool_choice"),
        ([{"type": "code_interpreter"}], None, "tools"),
        ([TIME], 3, "tool_choice"),
    ]:
        with pytest.raises(HttpError) as exc:
            tool_use(tools, choice)
        assert exc.value.code == "bad_request"
        assert exc.value.param == param, (tools, choice)


def test_choice_none_reads_no_calls() -> None:
    assert not tool_use([WEATHER], "none").active
    assert tool_use([WEATHER], "none").parse(CALL).calls == []
    assert [c.name for c in tool_use([WEATHER], "auto").parse(CALL).calls] == ["get_weather"]


def _stream(use: ToolUse, pieces: list[str]) -> tuple[str, str, list[str]]:
    s = ToolStream(use)
    sent = "".join(s.feed(p) for p in pieces)
    rest, parsed = s.finish()
    return sent, rest, [c.name for c in parsed.calls]


def test_plain_text_streams_as_it_comes() -> None:
    use = tool_use([WEATHER], "auto")
    s = ToolStream(use)
    assert s.feed("Hello") == "Hello"
    assert s.feed(" there") == " there"
    assert s.finish()[0] == ""


def test_a_call_is_held_and_read_at_the_end() -> None:
    use = tool_use([WEATHER], "auto")
    pieces = [
        "Let me check. <to",
        "ol_call>\n",
        '{"name": "get_weather", ',
        '"arguments": {"city": "Oslo"}}',
        "\n</tool_call>",
    ]
    sent, rest, names = _stream(use, pieces)
    assert sent == "Let me check. "
    assert names == ["get_weather"] and rest == ""


def test_a_reply_opening_with_json_is_held() -> None:
    use = tool_use([WEATHER], "auto")
    sent, rest, names = _stream(use, ["  ", '{"name": "get_weather",', ' "parameters": {}}'])
    assert sent == "" and names == ["get_weather"]
    # JSON that is no call comes out whole at the end.
    sent, rest, names = _stream(use, ['{"answer":', " 42}"])
    assert sent == "" and rest == '{"answer": 42}' and names == []


def test_a_partial_marker_that_is_not_one_is_released() -> None:
    use = tool_use([WEATHER], "auto")
    s = ToolStream(use)
    assert s.feed("a <to") == "a "
    assert s.feed("ast") == "<toast"
    assert s.finish()[0] == ""
    # A bracket in running text is no JSON reply.
    s = ToolStream(use)
    assert s.feed("Hello [") == "Hello "
    assert s.feed("x]") == "[x]"


def test_without_active_tools_everything_streams() -> None:
    s = ToolStream(tool_use([WEATHER], "none"))
    assert s.feed(CALL) == CALL


def test_deltas_and_finish_reason() -> None:
    parsed = tool_use([WEATHER], "auto").parse(CALL)
    deltas = call_deltas(parsed)
    assert [(d["index"], d["type"], d["function"]["name"]) for d in deltas] == [
        (0, "function", "get_weather")
    ]
    assert json.loads(deltas[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert deltas[0]["id"].startswith("call_")
    assert finish_reason(parsed, "stop") == "tool_calls"
    assert finish_reason(tool_use(None, None).parse("hi"), "length") == "length"


def _completion(reply: str, marked: list[str] | None = None) -> Completion:
    return Completion(
        reply=reply,
        generated=[1],
        context_tokens=[1],
        committed_tokens=0,
        cache_hit_kind=CacheHitKind.COLD,
        finish_reason=FinishReason.STOP,
        stats=Stats(prompt_tokens=5, completion_tokens=1),
        tool_calls=marked or [],
    )


def test_a_chat_completion_answers_calls_as_tool_calls() -> None:
    use = tool_use([WEATHER], "auto")
    body = chat_response("id", "m", _completion("Checking.\n" + CALL), 0, tools=use)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "Checking."
    [call] = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    # Calls a marker-configured worker took out of the reply count the same.
    marked = _completion("", ['{"name": "get_weather", "arguments": {"city": "Oslo"}}'])
    body = chat_response("id", "m", marked, 0, tools=use)
    assert body["choices"][0]["message"]["content"] is None
    assert body["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    # Without tools the reply is text, whatever it looks like.
    plain = chat_response("id", "m", _completion(CALL), 0)
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": CALL}
    assert plain["choices"][0]["finish_reason"] == "stop"
