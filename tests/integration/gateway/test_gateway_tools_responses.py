"""Tools and the Responses API through the official ``openai`` package, against a real daemon.

One daemon per module (the default model, SmolLM2-135M, one thread) with its
gateway on a free loopback port. The model's template knows no tools, so
these run the fallback (tools in the system message) and the Hermes-format
grammar of ``tool_choice`` required / named. Generations are short: a call
is at most 48 tokens (the city is at most 12 characters), replies 4-12.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import openai
import psutil
import pytest

from daemon_proc import DaemonProc
from llamad.paths import http_address
from served import EVENTUALLY, wait_until

pytestmark = [pytest.mark.model, pytest.mark.timeout(600)]

MODEL = "smol"
WEATHER: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}
TIME: dict[str, Any] = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time now", "parameters": {}},
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL_TOKENS = 48


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProc]:
    d = DaemonProc()
    try:
        d.start()
        yield d
    finally:
        d.close()


@pytest.fixture(scope="module")
def url(daemon: DaemonProc) -> str:
    return daemon.http_url()


@pytest.fixture(scope="module")
def oai(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=EVENTUALLY)


# -- chat completions with tools ---------------------------------------------------------


def test_tool_choice_required_gives_a_parseable_call(oai: openai.OpenAI) -> None:
    done = oai.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER, TIME],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=CALL_TOKENS,
        temperature=0,
    )
    choice = done.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "get_time")  # type: ignore[union-attr]
    arguments = json.loads(call.function.arguments)  # type: ignore[union-attr]
    assert isinstance(arguments, dict)
    if call.function.name == "get_weather":  # type: ignore[union-attr]
        assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 12


def test_a_named_tool_choice_calls_that_function_streamed_and_not(oai: openai.OpenAI) -> None:
    named: Any = {"type": "function", "function": {"name": "get_weather"}}
    whole = oai.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=[TIME, WEATHER],  # type: ignore[list-item]
        tool_choice=named,
        max_tokens=CALL_TOKENS,
        temperature=0,
    )
    [call] = whole.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather"  # type: ignore[union-attr]
    assert set(json.loads(call.function.arguments)) == {"city"}  # type: ignore[union-attr]
    assert whole.choices[0].message.content is None
    stream = oai.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=[TIME, WEATHER],  # type: ignore[list-item]
        tool_choice=named,
        max_tokens=CALL_TOKENS,
        temperature=0,
        stream=True,
    )
    chunks = list(stream)
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.index for d in deltas] == [0]
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert deltas[0].function.arguments == call.function.arguments  # type: ignore[union-attr]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "<tool_call>" not in text
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["tool_calls"]


def test_a_tool_result_turn_continues(oai: openai.OpenAI) -> None:
    first = oai.chat.completions.create(
        model=MODEL,
        messages=ASK,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_tokens=CALL_TOKENS,
        temperature=0,
    )
    [call] = first.choices[0].message.tool_calls or []
    history: list[Any] = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees."},
    ]
    after = oai.chat.completions.create(
        model=MODEL,
        messages=history,
        tools=[WEATHER],
        max_tokens=12,
        temperature=0,  # type: ignore[list-item]
    )
    choice = after.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    # The prompt held the whole exchange: more than the question and the call.
    assert after.usage is not None and first.usage is not None
    assert after.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens


def test_bad_tools_are_400_in_openai_shape(oai: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        oai.chat.completions.create(
            model=MODEL,
            messages=ASK,  # type: ignore[arg-type]
            tools=[WEATHER],  # type: ignore[list-item]
            tool_choice={"type": "function", "function": {"name": "nope"}},
            max_tokens=4,
        )
    assert exc.value.status_code == 400
    assert exc.value.body["param"] == "tool_choice"  # type: ignore[index]


# -- /v1/responses ----------------------------------------------------------------------


def test_a_stateless_response(oai: openai.OpenAI) -> None:
    r = oai.responses.create(
        model=MODEL,
        input="Say hello.",
        instructions="You are terse.",
        max_output_tokens=6,
        temperature=0,
        store=False,
    )
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.output_text
    assert r.usage is not None and r.usage.output_tokens <= 6
    assert r.status in ("completed", "incomplete")
    # Not stored: it cannot be continued or fetched.
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as exc:
        oai.responses.create(
            model=MODEL, input="More.", previous_response_id=r.id, max_output_tokens=4
        )
    assert exc.value.body["code"] == "previous_response_not_found"  # type: ignore[index]
    assert exc.value.body["param"] == "previous_response_id"  # type: ignore[index]


def test_a_response_in_json(oai: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
        "required": ["colour"],
    }
    r = oai.responses.create(
        model=MODEL,
        input="Pick a colour.",
        max_output_tokens=16,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema}},
    )
    assert json.loads(r.output_text)["colour"] in ("red", "green", "blue")


def test_previous_response_id_restores_the_previous_turn(oai: openai.OpenAI) -> None:
    instructions = "You are terse."
    stamp = time.time_ns()
    first = oai.responses.create(
        model=MODEL,
        input=f"Tell me about the sea in one sentence ({stamp}).",
        instructions=instructions,
        max_output_tokens=12,
        temperature=0,
    )
    assert first.usage is not None
    second = oai.responses.create(
        model=MODEL,
        input="And the sky?",
        instructions=instructions,
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.usage is not None
    # Everything the first turn held came back, not computed: its prompt and
    # its reply (less the reply's last token, sampled but never decoded).
    covered = first.usage.input_tokens + first.usage.output_tokens - 1
    assert second.usage.input_tokens > covered
    assert second.usage.input_tokens_details.cached_tokens >= covered
    # The same answer as the whole history sent again as a chat.
    again = oai.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": instructions},
            {"role": "user", "content": f"Tell me about the sea in one sentence ({stamp})."},
            {"role": "assistant", "content": first.output_text},
            {"role": "user", "content": "And the sky?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert again.choices[0].message.content == second.output_text
    assert again.usage is not None and again.usage.prompt_tokens == second.usage.input_tokens
    # GET answers the stored response; DELETE forgets it.
    assert oai.responses.retrieve(second.id).output_text == second.output_text
    oai.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(second.id)


def test_a_response_tool_call_and_its_output_continue(oai: openai.OpenAI) -> None:
    flat = {"type": "function", **WEATHER["function"]}
    first = oai.responses.create(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[flat],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=CALL_TOKENS,
        temperature=0,
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments), dict)
    # Tools are not carried over (OpenAI's rule): a client sends them again,
    # and the prompt then begins with the whole first turn.
    second = oai.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny."}],
        tools=[flat],  # type: ignore[list-item]
        max_output_tokens=8,
        temperature=0,
    )
    assert second.usage is not None and first.usage is not None
    covered = first.usage.input_tokens + first.usage.output_tokens - 1
    assert second.usage.input_tokens_details.cached_tokens >= covered


def test_a_streamed_response_is_stored_and_continued(oai: openai.OpenAI) -> None:
    instructions = "You are terse."
    stamp = time.time_ns()
    stream = oai.responses.create(
        model=MODEL,
        input=f"Tell me about the moon in one sentence ({stamp}).",
        instructions=instructions,
        max_output_tokens=8,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    first = last.response  # type: ignore[union-attr]
    assert last.type == f"response.{first.status}"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == first.output_text
    assert first.usage is not None and first.usage.output_tokens <= 8
    assert first.usage.input_tokens_details.cached_tokens >= 0
    # Stored as a non-streamed response is: fetched, and continued with the
    # whole first turn restored rather than computed.
    assert oai.responses.retrieve(first.id).output_text == first.output_text
    second = oai.responses.create(
        model=MODEL,
        input="And the sun?",
        instructions=instructions,
        previous_response_id=first.id,
        max_output_tokens=4,
        temperature=0,
        stream=True,
    )
    done = [e for e in second if e.type in ("response.completed", "response.incomplete")]
    [end] = done
    usage = end.response.usage  # type: ignore[union-attr]
    assert usage is not None and end.response.previous_response_id == first.id  # type: ignore[union-attr]
    covered = first.usage.input_tokens + first.usage.output_tokens - 1
    assert usage.input_tokens > covered
    assert usage.input_tokens_details.cached_tokens >= covered


def test_a_streamed_response_tool_call_through_the_sdks_accumulator(oai: openai.OpenAI) -> None:
    flat = {"type": "function", **WEATHER["function"]}
    # The SDK's responses.stream() rebuilds the response from the events
    # (items by output_index, parts by content_index) and checks their ids.
    with oai.responses.stream(
        model=MODEL,
        input="What is the weather in Paris?",
        tools=[flat],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=CALL_TOKENS,
        temperature=0,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert isinstance(json.loads(calls[0].arguments), dict)
    streamed = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in streamed] == [calls[0].arguments]


def _gateway(daemon: DaemonProc) -> psutil.Process:
    root = psutil.Process(daemon.pid)
    found = [p for p in root.children(recursive=True) if any("gateway" in a for a in p.cmdline())]
    assert len(found) == 1, [p.cmdline() for p in root.children(recursive=True)]
    return found[0]


def test_a_stored_response_survives_a_gateway_restart(daemon: DaemonProc, url: str) -> None:
    oai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=EVENTUALLY)
    kept = oai.responses.create(model=MODEL, input="Say yes.", max_output_tokens=4, temperature=0)
    old = _gateway(daemon)
    os.kill(old.pid, signal.SIGKILL)
    old.wait(EVENTUALLY)

    def restarted() -> psutil.Process | None:
        try:
            new = _gateway(daemon)
        except AssertionError:
            return None
        return new if new.pid != old.pid else None

    new = wait_until(restarted, "the root restarted the gateway", EVENTUALLY)

    # The killed gateway's address file stays (SIGKILL: no clean-up) until the
    # new one serves and publishes its own. Reading it as soon as the process
    # exists gave the dead port: "connection refused" on a loaded machine
    # (a `make test -n 2` run at load ~15), where the new gateway's start-up
    # outlasted the client's retries.
    def new_address() -> str | None:
        found = http_address(daemon.launcher.runtime)
        return str(found["url"]) if found is not None and found.get("pid") == new.pid else None

    fresh_url = wait_until(new_address, "the new gateway to publish its address", EVENTUALLY)
    fresh = openai.OpenAI(
        base_url=fresh_url + "/v1", api_key="none", max_retries=3, timeout=EVENTUALLY
    )
    assert fresh.responses.retrieve(kept.id).output_text == kept.output_text
    more = fresh.responses.create(
        model=MODEL,
        input="Again.",
        previous_response_id=kept.id,
        max_output_tokens=4,
        temperature=0,
    )
    assert more.usage is not None and kept.usage is not None
    assert more.usage.input_tokens_details.cached_tokens >= kept.usage.input_tokens
