"""Anthropic's Messages API onto llamad, without a server: request bodies to the
llamad call, hand-made completions and events to Anthropic's JSON and SSE."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llamad.errors import (
    BadRequest,
    ContextOverflow,
    LlamadError,
    ModelNotFound,
    Overloaded,
    RequestTimeout,
)
from llamad.gateway import anthropic
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    FinishReason,
    Stats,
    ThinkingEvent,
    TokenEvent,
)


def completion(
    reply: str = "Hello there",
    *,
    prompt: int = 40,
    generated: int = 3,
    read: int = 0,
    created: int = 0,
    finish: FinishReason = FinishReason.STOP,
    stop_sequence: str | None = None,
    thinking: str = "",
    tool_calls: list[str] | None = None,
) -> Completion:
    return Completion(
        reply=reply,
        generated=list(range(generated)),
        context_tokens=list(range(prompt + generated)),
        committed_tokens=prompt + generated - 1,
        cache_hit_kind=CacheHitKind.PARTIAL if read else CacheHitKind.COLD,
        finish_reason=finish,
        stats=Stats(
            prompt_tokens=prompt, completion_tokens=generated, prefill_tokens=prompt - read
        ),
        cache_delta=CacheDelta(read=read, created=created),
        stop_sequence=stop_sequence,
        thinking=thinking,
        tool_calls=tool_calls or [],
    )


PARIS = {"city": "Paris"}


def body(**fields: Any) -> bytes:
    base: dict[str, Any] = {
        "model": "smol",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hi"}],
    }
    base.update(fields)
    return json.dumps(base).encode()


# -- requests -------------------------------------------------------------------------


def test_a_plain_request_becomes_messages_and_options() -> None:
    request = anthropic.parse_messages(body(temperature=0.0, top_p=0.5, top_k=7))
    messages, options = request.call()
    assert messages == [{"role": "user", "content": "hi"}]
    assert options == {"max_tokens": 16, "temperature": 0.0, "top_p": 0.5, "top_k": 7}
    assert request.stream is False


def test_absent_sampling_fields_keep_llamads_defaults() -> None:
    _, options = anthropic.parse_messages(body()).call()
    assert options == {"max_tokens": 16}


def test_system_as_text_or_blocks_leads_the_chat() -> None:
    blocks = [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer in French."},
    ]
    for system, text in (("Be brief.", "Be brief."), (blocks, "Be brief.\nAnswer in French.")):
        messages, _ = anthropic.parse_messages(body(system=system)).call()
        assert messages[0] == {"role": "system", "content": text}
        assert messages[1] == {"role": "user", "content": "hi"}


def test_stop_sequences_are_llamads_stop_strings() -> None:
    _, options = anthropic.parse_messages(body(stop_sequences=["\n\n", "END"])).call()
    assert options["stop"] == ("\n\n", "END")


def test_text_blocks_join_and_unknown_fields_are_ignored() -> None:
    content = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    raw = body(messages=[{"role": "user", "content": content}], metadata={"user_id": "u1"})
    messages, _ = anthropic.parse_messages(raw).call()
    assert messages == [{"role": "user", "content": "one\ntwo"}]


def test_a_final_assistant_message_is_continued() -> None:
    turns = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    messages, options = anthropic.parse_messages(body(messages=turns)).call()
    assert messages[-1] == {"role": "assistant", "content": "1, 2,"}
    assert options["add_generation_prompt"] is False
    assert options["continue_final_message"] is True


def test_tools_render_in_the_function_shape_and_turns_carry_calls_and_results() -> None:
    tools = [
        {
            "name": "weather",
            "description": "Weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        }
    ]
    turns = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                {"type": "text", "text": "And tomorrow?"},
            ],
        },
    ]
    messages, options = anthropic.parse_messages(body(messages=turns, tools=tools)).call()
    assert options["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "parameters": tools[0]["input_schema"],
                "description": "Weather in a city",
            },
        }
    ]
    assert messages[1] == {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    assert messages[3] == {"role": "user", "content": "And tomorrow?"}


@pytest.mark.parametrize(
    ("choice", "option"),
    [
        (None, "auto"),
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "tool", "name": "t"}, {"type": "function", "function": {"name": "t"}}),
        ({"type": "none"}, "none"),
    ],
)
def test_tool_choice_is_llamads(choice: dict[str, Any] | None, option: Any) -> None:
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    extra = {} if choice is None else {"tool_choice": choice}
    request = anthropic.parse_messages(body(tools=tools, **extra))
    _, options = request.call()
    assert options["tool_choice"] == option
    read = request.called_tools()
    assert (read is None) == (option == "none")


def test_a_named_tool_choice_needs_a_name() -> None:
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    with pytest.raises(BadRequest, match=r"tool_choice\.name"):
        anthropic.parse_messages(body(tools=tools, tool_choice={"type": "tool"})).call()


def test_thinking_switches_the_templates_thinking() -> None:
    on = body(thinking={"type": "enabled", "budget_tokens": 1024})
    off = body(thinking={"type": "disabled"})
    assert anthropic.parse_messages(on).call()[1]["enable_thinking"] is True
    assert anthropic.parse_messages(off).call()[1]["enable_thinking"] is False
    assert "enable_thinking" not in anthropic.parse_messages(body()).call()[1]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (json.dumps({"model": "m", "messages": [{"role": "user", "content": "x"}]}), "max_tokens"),
        (body(max_tokens=0).decode(), "max_tokens"),
        (body(messages=[]).decode(), "messages"),
        (body(messages=[{"role": "robot", "content": "x"}]).decode(), "messages[0].role"),
        (body(temperature="hot").decode(), "temperature"),
        ("{not json", ""),
    ],
)
def test_bad_bodies_are_bad_requests_naming_the_field(raw: str, field: str) -> None:
    with pytest.raises(BadRequest) as caught:
        anthropic.parse_messages(raw.encode()).call()
    assert caught.value.details["field"] == field


def test_images_are_refused_with_a_clear_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    raw = body(messages=[{"role": "user", "content": [image]}])
    with pytest.raises(BadRequest, match="image") as caught:
        anthropic.parse_messages(raw).call()
    assert caught.value.details["field"] == "messages[0].content[0]"


def test_count_tokens_takes_the_prompt_without_max_tokens() -> None:
    raw = json.dumps(
        {"model": "smol", "system": "S", "messages": [{"role": "user", "content": "hi"}]}
    ).encode()
    messages, chat = anthropic.parse_count_tokens(raw).chat()
    assert messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    assert chat == {}
    assert anthropic.count_tokens_body(12) == {"input_tokens": 12}


# -- results --------------------------------------------------------------------------


def test_usage_splits_the_prompt_by_what_the_cache_did() -> None:
    # 40-token prompt: 24 restored, 12 computed and saved, 4 computed and not saved.
    used = anthropic.usage(completion(prompt=40, read=24, created=12, generated=5))
    assert used == {
        "input_tokens": 4,
        "cache_creation_input_tokens": 12,
        "cache_read_input_tokens": 24,
        "output_tokens": 5,
    }


def test_usage_bounds_created_by_the_prompt() -> None:
    # The finish save also holds generated tokens: they are not input tokens.
    used = anthropic.usage(completion(prompt=40, read=0, created=45))
    assert used["cache_creation_input_tokens"] == 40
    assert used["input_tokens"] == 0
    cold = anthropic.usage(completion(prompt=40))
    assert (cold["input_tokens"], cold["cache_read_input_tokens"]) == (40, 0)


def test_a_message_body() -> None:
    done = completion("Hi!", prompt=30, read=16, created=8, generated=2)
    msg = anthropic.message_body(done, message_id="msg_1", model="smol", max_tokens=16)
    assert msg == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "smol",
        "content": [{"type": "text", "text": "Hi!"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 6,
            "cache_creation_input_tokens": 8,
            "cache_read_input_tokens": 16,
            "output_tokens": 2,
        },
    }


@pytest.mark.parametrize(
    ("done", "reason"),
    [
        (completion(finish=FinishReason.STOP, stop_sequence="END"), "stop_sequence"),
        (completion(finish=FinishReason.STOP), "end_turn"),
        (completion(finish=FinishReason.LENGTH, generated=16), "max_tokens"),
        (completion(finish=FinishReason.LENGTH, generated=5), "model_context_window_exceeded"),
        (completion(finish=FinishReason.CANCELLED), "end_turn"),
    ],
)
def test_stop_reasons(done: Completion, reason: str) -> None:
    msg = anthropic.message_body(done, message_id="m", model="smol", max_tokens=16)
    assert msg["stop_reason"] == reason
    assert msg["stop_sequence"] == done.stop_sequence


TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def test_thinking_and_tool_calls_become_blocks() -> None:
    done = completion(
        'Let me check.<tool_call>{"name": "weather", "arguments": {"city": "Paris"}}</tool_call>',
        thinking="The user wants weather.",
    )
    msg = anthropic.message_body(done, message_id="m", model="smol", max_tokens=16, tools=TOOLS)
    kinds = [b["type"] for b in msg["content"]]
    assert kinds == ["thinking", "text", "tool_use"]
    assert msg["content"][1]["text"] == "Let me check."
    use = msg["content"][2]
    assert (use["name"], use["input"]) == ("weather", {"city": "Paris"})
    assert use["id"].startswith("toolu_")
    assert msg["stop_reason"] == "tool_use"


def test_tool_call_events_are_read_as_calls_too() -> None:
    done = completion("", tool_calls=['{"name": "weather", "arguments": {}}'])
    msg = anthropic.message_body(done, message_id="m", model="smol", max_tokens=16, tools=TOOLS)
    assert [b["type"] for b in msg["content"]] == ["tool_use"]


def test_a_call_of_no_offered_tool_stays_text() -> None:
    text = '<tool_call>{"name": "other", "arguments": {}}</tool_call>'
    msg = anthropic.message_body(
        completion(text), message_id="m", model="smol", max_tokens=16, tools=TOOLS
    )
    assert msg["content"] == [{"type": "text", "text": text}]
    assert msg["stop_reason"] == "end_turn"


def test_without_tools_offered_a_call_stays_text() -> None:
    done = completion("", tool_calls=['{"name": "x", "arguments": {}}'])
    msg = anthropic.message_body(done, message_id="m", model="smol", max_tokens=16)
    assert msg["content"] == [{"type": "text", "text": '{"name": "x", "arguments": {}}'}]
    assert msg["stop_reason"] == "end_turn"


# -- streams --------------------------------------------------------------------------


def names(events: list[anthropic.SSE]) -> list[str]:
    return [name for name, _ in events]


def test_a_stream_in_anthropics_event_order() -> None:
    enc = anthropic.StreamEncoder("msg_1", "smol", 16)
    out = enc.start()
    for ev in (TokenEvent("Hel", 1), TokenEvent("", 2), TokenEvent("lo", 3)):
        out += enc.event(ev)
    out += enc.done(completion("Hello", prompt=30, read=16, created=8, generated=3))
    assert names(out) == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    for name, data in out:
        assert data["type"] == name  # Anthropic repeats the event's name as its type
    start = out[0][1]["message"]
    assert (start["id"], start["model"], start["content"]) == ("msg_1", "smol", [])
    assert out[2][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    texts = [d["delta"]["text"] for n, d in out if n == "content_block_delta"]
    assert texts == ["Hel", "lo"]
    delta = out[6][1]
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert delta["usage"] == {
        "input_tokens": 6,
        "cache_creation_input_tokens": 8,
        "cache_read_input_tokens": 16,
        "output_tokens": 3,
    }


def test_a_stream_that_ends_at_a_stop_sequence() -> None:
    enc = anthropic.StreamEncoder("m", "smol", 16)
    out = enc.start() + enc.event(TokenEvent("a", 1))
    out += enc.done(completion("a", stop_sequence="END"))
    delta = dict(out)["message_delta"]["delta"]
    assert delta == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_a_stream_with_no_text_opens_no_block() -> None:
    enc = anthropic.StreamEncoder("m", "smol", 16)
    out = enc.start() + enc.event(TokenEvent("", 1)) + enc.done(completion(""))
    assert names(out) == ["message_start", "ping", "message_delta", "message_stop"]


def test_thinking_then_text_then_a_tool_call_are_three_blocks() -> None:
    enc = anthropic.StreamEncoder("m", "smol", 16, tools=TOOLS)
    out = enc.start()
    out += enc.event(ThinkingEvent("hmm"))
    out += enc.event(ThinkingEvent(" ok"))
    for piece in (
        "Checking.",
        "<tool",
        '_call>{"name": "weather", ',
        '"arguments": {"city": "Oslo"}}',
    ):
        out += enc.event(TokenEvent(piece, 1))
    out += enc.event(TokenEvent("</tool_call>", 2))
    out += enc.done(completion("..."))
    blocks = [(n, d) for n, d in out if n.startswith("content_block")]
    starts = [d["content_block"]["type"] for n, d in blocks if n == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use"]
    indexes = [d["index"] for _, d in blocks]
    assert indexes == sorted(indexes)  # each block closed before the next opens
    assert [n for n, _ in blocks].count("content_block_stop") == 3
    deltas = [d["delta"] for n, d in blocks if n == "content_block_delta"]
    texts = [d["text"] for d in deltas if d["type"] == "text_delta"]
    assert "".join(texts) == "Checking."  # the call's text was held, never sent as text
    json_delta = [d for d in deltas if d["type"] == "input_json_delta"]
    assert json.loads(json_delta[0]["partial_json"]) == {"city": "Oslo"}
    assert dict(out)["message_delta"]["delta"]["stop_reason"] == "tool_use"


def test_held_text_that_was_no_call_is_sent_at_the_end() -> None:
    enc = anthropic.StreamEncoder("m", "smol", 16, tools=TOOLS)
    out = enc.start()
    for piece in ("a <tool_c", "all> is a tag"):
        out += enc.event(TokenEvent(piece, 1))
    out += enc.done(completion("a <tool_call> is a tag"))
    texts = [d["delta"]["text"] for n, d in out if n == "content_block_delta"]
    assert "".join(texts) == "a <tool_call> is a tag"
    assert dict(out)["message_delta"]["delta"]["stop_reason"] == "end_turn"


def test_a_stream_error_is_an_error_event_in_anthropics_shape() -> None:
    enc = anthropic.StreamEncoder("m", "smol", 16)
    [(name, data)] = enc.error(ContextOverflow("too long"))
    assert name == "error"
    assert data == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "too long"},
    }


# -- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (BadRequest("bad"), 400, "invalid_request_error"),
        (ContextOverflow("long"), 400, "invalid_request_error"),
        (ModelNotFound("no model"), 404, "not_found_error"),
        (Overloaded("full"), 529, "overloaded_error"),
        (RequestTimeout("slow"), 504, "timeout_error"),
    ],
)
def test_errors_take_anthropics_shape_and_status(error: Exception, status: int, kind: str) -> None:
    assert isinstance(
        error, BadRequest | ContextOverflow | ModelNotFound | Overloaded | RequestTimeout
    )
    got_status, got = anthropic.error_for(error)
    assert got_status == status
    assert got == {"type": "error", "error": {"type": kind, "message": error.message}}


def test_an_unknown_fault_is_a_500_api_error() -> None:
    status, got = anthropic.error_for(LlamadError("boom"))
    assert (status, got["error"]["type"]) == (500, "api_error")


def test_output_config_format_is_a_json_schema() -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}}
    raw = body(output_config={"format": {"type": "json_schema", "schema": schema}, "effort": "low"})
    assert anthropic.parse_messages(raw).call()[1]["json_schema"] == schema
