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

:class:`CallHold` is the streaming half: text goes out as it comes until it
may begin a call (a marker anywhere, or a reply opening with ``{`` or ``[``);
from there it is held and read at the end.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from llamad.llama_ffi.tool_calls import parse_tool_calls

__all__ = ["Call", "CallHold", "split_calls"]

MARKERS: Final = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
_OPENERS: Final = ("{", "[")


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
    text = reply + "".join(f"<tool_call>{t}</tool_call>" for t in event_calls)
    parsed = parse_tool_calls(text, list(tools))
    calls = []
    for call in parsed.calls:
        arguments = json.loads(call.arguments)
        if not isinstance(arguments, dict):
            return text, []  # not a call after all: the whole reply stays text
        calls.append(Call(call.name, arguments))
    return (parsed.content or "") if calls else text, calls


class CallHold:
    """A streamed reply's text, held from where it may begin a call."""

    def __init__(self) -> None:
        self._sent_any = False
        self._pending = ""
        self._holding = False
        self._held = ""

    def feed(self, text: str) -> str:
        """``text`` arrived: what may be sent now (possibly ``""``)."""
        if self._holding:
            self._held += text
            return ""
        buf = self._pending + text
        if not self._sent_any and buf.lstrip()[:1] in _OPENERS:
            return self._hold(buf, len(buf) - len(buf.lstrip()))
        starts = [at for at in (buf.find(m) for m in MARKERS) if at >= 0]
        if starts:
            return self._hold(buf, min(starts))
        # Keep back a tail that could be the start of a marker.
        keep = max((n for m in MARKERS for n in range(1, len(m)) if buf.endswith(m[:n])), default=0)
        out, self._pending = buf[: len(buf) - keep], buf[len(buf) - keep :]
        if out.strip():
            self._sent_any = True
        return out

    def held(self) -> str:
        """At the end: the text not sent (a call, or text that only looked like one)."""
        return self._pending + self._held

    def _hold(self, buf: str, at: int) -> str:
        self._holding = True
        self._held = buf[at:]
        self._pending = ""
        return buf[:at]
