"""POST /v1/responses translation: input items, options, the response object, what is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamad.gateway.errors import HttpError
from llamad.gateway.response_store import new_response_id
from llamad.gateway.responses import (
    continued_prompt,
    conversation,
    input_messages,
    response_object,
    responses_call,
    stored,
)
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    FinishReason,
    Stats,
    TokenSources,
)

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",  # the Responses API's flat shape
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _result(reply: str, reason: FinishReason = FinishReason.STOP, reused: int = 0) -> Completion:
    return Completion(
        reply=reply,
        generated=[1, 2, 3],
        context_tokens=list(range(13)),
        committed_tokens=12,
        cache_hit_kind=CacheHitKind.COLD,
        finish_reason=reason,
        stats=Stats(prompt_tokens=10, completion_tokens=3),
        cache_delta=CacheDelta(sources=TokenSources(live=reused, computed=10 - reused)),
        finish_key=bytes(range(32)),
    )


def test_input_items_become_chat_messages() -> None:
    assert input_messages("Hi") == [{"role": "user", "content": "Hi"}]
    items = [
        {"role": "developer", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Weather?"}],
        },
        {"type": "reasoning", "summary": []},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city":"Oslo"}',
        },
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": {"t": 3}},
    ]
    assert input_messages(items) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": '{"t": 3}'},
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
        ),
        ({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"model": "m", "input": "x", "stream": True}, "stream"),
        ({"model": "m", "input": "x", "max_output_tokens": 1.5}, "max_output_tokens"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
        ({"model": "m", "input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"model": "m", "input": "x", "previous_response_id": 7}, "previous_response_id"),
    ],
)
def test_bad_bodies_are_400_naming_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(HttpError) as exc:
        responses_call(body)
    assert exc.value.code == "bad_request"
    assert exc.value.param == param


def test_options_and_format() -> None:
    call = responses_call(
        {
            "model": "smol",
            "input": "Hi",
            "instructions": "Be brief.",
            "max_output_tokens": 8,
            "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
        }
    )
    assert call.options == {"max_tokens": 8, "temperature": 0.0, "json_schema": {"type": "object"}}
    messages, history = conversation(call, None)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]
    assert history == [{"role": "user", "content": "Hi"}]


def test_a_text_reply_and_its_usage() -> None:
    call = responses_call({"model": "smol", "input": "Hi", "max_output_tokens": 3})
    out = response_object(
        call, _result("Hello!", FinishReason.LENGTH, reused=7), response_id="resp_1"
    )
    assert out["id"] == "resp_1" and out["object"] == "response"
    assert out["status"] == "incomplete"
    assert out["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [i["type"] for i in out["output"]] == ["message"]
    assert out["output"][0]["content"][0] == {
        "type": "output_text",
        "text": "Hello!",
        "annotations": [],
    }
    assert out["usage"] == {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 7},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 13,
    }
    assert out["max_output_tokens"] == 3 and out["previous_response_id"] is None


def test_a_call_becomes_a_function_call_item() -> None:
    call = responses_call(
        {"model": "smol", "input": "Weather?", "tools": [WEATHER], "tool_choice": "required"}
    )
    reply = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    out = response_object(call, _result(reply))
    assert out["status"] == "completed"
    [item] = out["output"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert json.loads(item["arguments"]) == {"city": "Oslo"}
    assert item["call_id"].startswith("call_")


def test_the_stored_record_continues_the_conversation() -> None:
    first = responses_call({"model": "smol", "input": "Hi", "instructions": "Be brief."})
    result = _result("Hello!")
    _, history = conversation(first, None)
    out = response_object(first, result, response_id=new_response_id())
    record = stored(first, result, out, history, cache_salt="t/a", tenant="a")
    assert record.finish_key == bytes(range(32)).hex()
    assert record.messages == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
    ]
    second = responses_call(
        {
            "model": "smol",
            "input": "And?",
            "instructions": "Be brief.",
            "previous_response_id": out["id"],
        }
    )
    messages, history2 = conversation(second, record)
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "And?"},
    ]
    assert history2 == messages[1:]


class _Text:
    """A tokenizer of one token per character, plus token 1000 for ``<x>``
    (which the renderer never produces: the model's own spelling)."""

    async def apply_chat_template(self, model: str, messages: Any, **chat: Any) -> list[int]:
        return [ord(c) for c in "".join(m["content"] for m in messages)]

    async def detokenize(self, model: str, tokens: list[int]) -> str:
        return "".join("<x>" if t == 1000 else chr(t) for t in tokens)

    async def tokenize(self, model: str, text: str, *, add_special: bool = True) -> list[int]:
        assert not add_special
        return [ord(c) for c in text]


class _Gate:
    client = _Text()


def test_a_continuation_begins_with_the_previous_turns_own_tokens() -> None:
    import asyncio  # noqa: PLC0415 - only this test runs a loop

    gate: Any = _Gate()
    messages = [{"content": "ab<x>"}, {"content": "cd"}]
    # The rendered tokens begin with the stored ones: they are the prompt.
    same = asyncio.run(continued_prompt(gate, "m", [97, 98], messages, {}))
    assert same == [ord(c) for c in "ab<x>cd"]
    # The model wrote <x> as one token the renderer spells in three: the new
    # part is cut after the previous turn's text and appended to its tokens.
    spliced = asyncio.run(continued_prompt(gate, "m", [97, 98, 1000], messages, {}))
    assert spliced == [97, 98, 1000, ord("c"), ord("d")]
    # A rendering that does not reproduce the previous turn: the messages go.
    assert asyncio.run(continued_prompt(gate, "m", [97, 1000], messages, {})) is None
    assert asyncio.run(continued_prompt(gate, "m", [], messages, {})) is None
