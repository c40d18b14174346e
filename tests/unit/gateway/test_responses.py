"""POST /v1/responses translation: input items, options, the response object, what is stored."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from llamad.errors import WorkerCrashed
from llamad.gateway.errors import HttpError
from llamad.gateway.response_store import new_response_id
from llamad.gateway.responses import (
    continued_prompt,
    conversation,
    input_messages,
    response_events,
    response_object,
    responses_call,
    stored,
)
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    DoneEvent,
    Event,
    FinishReason,
    Stats,
    TokenEvent,
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
        ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
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


# -- streamed ----------------------------------------------------------------------------


async def _events(items: Sequence[Event | Exception]) -> AsyncIterator[Event]:
    for item in items:
        if isinstance(item, Exception):
            raise item
        yield item


def _streamed(body: dict[str, Any], items: Sequence[Event | Exception]) -> list[dict[str, Any]]:
    call = responses_call({"model": "smol", "stream": True, **body})
    assert call.stream
    done: list[dict[str, Any]] = []

    async def run() -> list[dict[str, Any]]:
        out = []
        async for e in response_events(
            call,
            _events(items),
            response_id="resp_s",
            created=1.0,
            on_done=lambda result, answer: done.append(answer),
        ):
            # Stored before the last event goes out (a continuation may follow at once).
            assert bool(done) == (e["type"] in ("response.completed", "response.incomplete"))
            out.append(e)
        return out

    events = asyncio.run(run())
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    if done:
        assert events[-1]["response"] == done[0]
    return events


def test_a_streamed_text_reply_is_openais_event_sequence() -> None:
    result = _result("Hello there", reused=7)
    events = _streamed(
        {"input": "Hi"},
        [TokenEvent("Hel", 1), TokenEvent("", 2), TokenEvent("lo there", 3), DoneEvent(result)],
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    created, in_progress = events[0]["response"], events[1]["response"]
    assert created["status"] == in_progress["status"] == "in_progress"
    assert created["id"] == "resp_s" and created["output"] == []
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["Hel", "lo there"]
    message_id = events[2]["item"]["id"]
    assert all(e["item_id"] == message_id for e in events[3:8])
    assert events[6]["text"] == "Hello there"
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"] == [events[8]["item"]]
    assert final["output"][0]["id"] == message_id
    assert final["output"][0]["content"][0]["text"] == "Hello there"
    assert final["usage"]["input_tokens_details"] == {"cached_tokens": 7}
    # The same object as the non-streamed answer, but for its fresh message id.
    whole = response_object(
        responses_call({"model": "smol", "input": "Hi", "stream": True}),
        result,
        response_id="resp_s",
        created=1.0,
    )
    whole["output"][0]["id"] = message_id
    assert final == whole


def test_a_streamed_reply_cut_by_max_output_tokens_ends_incomplete() -> None:
    events = _streamed(
        {"input": "Hi", "max_output_tokens": 2},
        [TokenEvent("Hel", 1), DoneEvent(_result("Hel", FinishReason.LENGTH))],
    )
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_streamed_tool_call_is_a_function_call_item() -> None:
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    events = _streamed(
        {"input": "Weather?", "tools": [WEATHER], "tool_choice": "required"},
        [TokenEvent(call[:15], 1), TokenEvent(call[15:], 2), DoneEvent(_result(call))],
    )
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    item = events[-2]["item"]
    assert item["type"] == "function_call" and item["name"] == "get_weather"
    assert json.loads(events[4]["arguments"]) == {"city": "Oslo"}
    assert events[2]["item"]["id"] == item["id"] and events[2]["item"]["arguments"] == ""
    assert events[-1]["response"]["output"] == [item]


def test_an_empty_streamed_reply_still_has_its_message() -> None:
    events = _streamed({"input": "Hi"}, [DoneEvent(_result(""))])
    types = [e["type"] for e in events]
    assert types[2:-1] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == ""


def test_an_error_after_the_first_event_is_an_error_event_then_failed() -> None:
    events = _streamed({"input": "Hi"}, [TokenEvent("Hel", 1), WorkerCrashed("the worker died")])
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    error = events[-2]
    assert error["code"] == "worker_crashed" and error["message"] == "the worker died"
    failed = events[-1]["response"]
    assert failed["status"] == "failed" and failed["error"]["code"] == "worker_crashed"
