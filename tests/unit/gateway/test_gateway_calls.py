"""Tool calls read out of a reply, and held back from a stream until read."""

from __future__ import annotations

import pytest

from llamad.gateway.calls import Call, CallHold, split_calls

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def test_split_calls_in_every_spelling() -> None:
    hermes = 'Sure.<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    assert split_calls(hermes, [], TOOLS) == ("Sure.", [Call("f", {"x": 1})])
    llama3 = '{"name": "f", "parameters": {"x": 2}}'
    assert split_calls(llama3, [], TOOLS) == ("", [Call("f", {"x": 2})])
    event = split_calls("", ['{"name": "f", "arguments": "{\\"x\\": 3}"}'], TOOLS)
    assert event == ("", [Call("f", {"x": 3})])


def test_what_is_no_call_stays_text() -> None:
    assert split_calls("plain", [], TOOLS) == ("plain", [])
    other = '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
    assert split_calls(other, [], TOOLS) == (other, [])


def feed(hold: CallHold, pieces: list[str]) -> str:
    return "".join(hold.feed(p) for p in pieces)


@pytest.mark.parametrize(
    ("pieces", "sent", "held"),
    [
        (["Hello", " world"], "Hello world", ""),
        (["Hi <tool", "_call>{}"], "Hi ", "<tool_call>{}"),
        (["Hi <", "b>"], "Hi <b>", ""),
        (["Hi <tool_c"], "Hi ", "<tool_c"),  # could still become a marker
        # A reply opening with JSON: its leading blanks stay with it (OpenAI's rule too).
        ([" {", '"name"'], "", ' {"name"'),
        (["Hi. {x}"], "Hi. {x}", ""),  # JSON later in the text is no call
        (["a [TOOL_CALLS][]"], "a ", "[TOOL_CALLS][]"),
    ],
)
def test_a_stream_is_held_from_where_a_call_may_begin(
    pieces: list[str], sent: str, held: str
) -> None:
    hold = CallHold()
    assert feed(hold, pieces) == sent
    assert hold.held() == held
