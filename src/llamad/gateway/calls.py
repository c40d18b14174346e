"""Tool calls in a reply, for the protocols that return calls (no I/O).

The worker renders the tools through the model's template and, for a forced
choice, constrains generation to one call
(:mod:`llamad.llama_ffi.tool_calls`); the model writes its calls as text in
its family's spelling (Hermes ``<tool_call>{...}</tool_call>``, Mistral's
``[TOOL_CALLS]``, Llama 3's bare ``{"name", "parameters"}``), or, with
tool-call markers configured, the worker releases them as ``tool_call``
events. :func:`split_calls` reads both back with
:func:`~llamad.llama_ffi.tool_calls.parse_tool_calls`; text that is no call
stays text.

:class:`~llamad.gateway.tools.CallHold` (re-exported here) is the streaming
half, the same rule OpenAI's stream uses: text goes out as it comes until it
may begin a call (a marker anywhere, or a reply opening with ``{`` or ``[``);
from there it is held and read at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llamad.gateway.tools import CallHold, with_calls
from llamad.llama_ffi.tool_calls import parse_tool_calls

__all__ = ["Call", "CallHold", "split_calls"]


@dataclass(frozen=True, slots=True)
class Call:
    """One call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


def split_calls(
    reply: str, event_calls: Sequence[str], tools: Sequence[dict[str, Any]]
) -> tuple[str, list[Call]]:
    """``reply`` and the ``tool_call`` events' texts as (text, calls): a call
    names one of ``tools`` and has an object for arguments."""
    text = with_calls(reply, event_calls)
    parsed = parse_tool_calls(text, list(tools))
    calls = []
    for call in parsed.calls:
        arguments = json.loads(call.arguments)
        if not isinstance(arguments, dict):
            return text, []  # not a call after all: the whole reply stays text
        calls.append(Call(call.name, arguments))
    return (parsed.content or "") if calls else text, calls
