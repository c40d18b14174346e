"""OpenAI ``tools`` and ``tool_choice`` over llamad's chat requests.

The worker does the model-specific part (:mod:`llamad.llama_ffi.tool_calls`):
it renders the tools through the model's chat template (or, for a template
that knows none, into the system message), and for ``tool_choice``
``required`` or a named function it constrains generation by a grammar of one
call in the template's format. The gateway passes ``tools`` and
``tool_choice`` on as chat options and reads the calls back out of the reply
(:func:`~llamad.llama_ffi.tool_calls.parse_tool_calls`, which knows every
family's spelling), answering OpenAI's ``tool_calls`` with
``finish_reason: "tool_calls"``.

Streaming: text is streamed as it comes until it may begin a call (a
``<tool_call>``, ``[TOOL_CALLS]`` or ``<|python_tag|>`` marker anywhere, or a
reply that opens with ``{`` or ``[``, Llama 3's bare JSON); from there on it
is held, and at the end it is sent as ``tool_calls`` deltas (one chunk per
call: index, id, name and the whole arguments) or, when it was no call after
all, as content.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from llamad.errors import BadRequest
from llamad.gateway.errors import HttpError
from llamad.llama_ffi.tool_calls import (
    ParsedReply,
    check_tool_choice,
    function_of,
    parse_tool_calls,
)
from llamad.model.results import Completion

__all__ = [
    "CallHold",
    "ToolStream",
    "ToolUse",
    "call_deltas",
    "finish_reason",
    "openai_calls",
    "reply_text",
    "tool_use",
    "with_calls",
]

_MARKERS: Final = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")
_JSON_OPENERS: Final = ("{", "[")


@dataclass(frozen=True, slots=True)
class ToolUse:
    """The tools of one request: what goes to the worker (:meth:`chat_options`)
    and whether the reply is read for calls (:attr:`active`)."""

    tools: list[dict[str, Any]] = field(default_factory=list)
    choice: str | dict[str, Any] | None = None

    @property
    def active(self) -> bool:
        """Calls are looked for in the reply (tools given, choice not ``none``)."""
        return bool(self.tools) and self.choice != "none"

    def chat_options(self) -> dict[str, Any]:
        """The ``ChatOptions`` fields for the client (empty without tools)."""
        if not self.tools:
            return {}
        out: dict[str, Any] = {"tools": self.tools}
        if self.choice is not None:
            out["tool_choice"] = self.choice
        return out

    def parse(self, reply: str) -> ParsedReply:
        """``reply`` split into content and calls (no calls unless :attr:`active`)."""
        if not self.active:
            return ParsedReply(reply, [])
        return parse_tool_calls(reply, self.tools)


def tool_use(tools: object, tool_choice: object) -> ToolUse:
    """``tools`` and ``tool_choice`` of a request body, checked (400 naming the
    field): function tools only; the choice ``none``, ``auto``, ``required`` or
    a function among the tools."""
    if tools is None:
        if tool_choice not in (None, "none", "auto"):
            raise HttpError("bad_request", "tool_choice: needs tools", param="tool_choice")
        return ToolUse()
    if not isinstance(tools, list):
        raise HttpError("bad_request", "tools: must be a list of tools", param="tools")
    if tool_choice is not None and not isinstance(tool_choice, str | dict):
        raise HttpError(
            "bad_request",
            "tool_choice: must be none, auto, required or a named function",
            param="tool_choice",
        )
    try:
        for i, tool in enumerate(tools):
            function_of(tool, f"tools[{i}]")
        check_tool_choice(tool_choice, tools)
    except BadRequest as exc:
        field_ = exc.details.get("field")
        param = "tool_choice" if field_ == "tool_choice" else "tools"
        raise HttpError("bad_request", exc.message, param=param) from None
    return ToolUse(list(tools), tool_choice)


def openai_calls(parsed: ParsedReply) -> list[dict[str, Any]]:
    """The ``tool_calls`` of an assistant message."""
    return [c.to_openai() for c in parsed.calls]


def call_deltas(parsed: ParsedReply) -> list[dict[str, Any]]:
    """One streamed ``tool_calls`` delta per call (index, id, name, arguments)."""
    return [{"index": i, **c.to_openai()} for i, c in enumerate(parsed.calls)]


def _held_from(text: str, start_of_reply: bool) -> int:
    """Where in ``text`` a call may begin (``len(text)``: nowhere yet).

    A marker found, or a partial one at the end, holds from its start; a
    reply whose first non-blank character opens JSON holds from there."""
    if start_of_reply:
        stripped = text.lstrip()
        if stripped[:1] in _JSON_OPENERS:
            return len(text) - len(stripped)
    at = len(text)
    for marker in _MARKERS:
        found = text.find(marker)
        if found >= 0:
            at = min(at, found)
            continue
        # A marker cut by the chunk boundary: its beginning ends the text.
        for n in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:n]):
                at = min(at, len(text) - n)
                break
    return at


@dataclass(slots=True)
class CallHold:
    """A streamed reply's text, held from where it may begin a call (the
    module's docstring); the one rule every protocol's stream uses."""

    sent: bool = False
    """Some text was sent already (a reply that began as text)."""
    pending: str = ""
    holding: bool = False

    def feed(self, text: str) -> str:
        """The part of the reply so far that can go out now."""
        self.pending += text
        if self.holding:
            return ""
        if not self.sent and not self.pending.strip():
            return ""  # leading blanks: wait to see what they lead to
        at = _held_from(self.pending, start_of_reply=not self.sent)
        out, rest = self.pending[:at], self.pending[at:]
        blank_start = not self.sent and not out.strip()
        # A complete marker (or a reply opening with JSON) holds the rest for
        # good; a partial marker at the end only until the next text says.
        if any(rest.startswith(m) for m in _MARKERS) or (blank_start and rest[:1] in _JSON_OPENERS):
            self.holding = True
        if blank_start:
            return ""  # only blanks before what may be a call: they stay with it
        self.pending = rest
        self.sent = True
        return out

    def held(self) -> str:
        """At the end: the text not sent (a call, or text that only looked like
        one), taken out of the hold."""
        held, self.pending = self.pending, ""
        return held


@dataclass(slots=True)
class ToolStream:
    """OpenAI's streamed reply: text through a :class:`CallHold` while the
    request's tools are active, the held tail read for calls at the end."""

    use: ToolUse
    hold: CallHold = field(default_factory=CallHold)

    def feed(self, text: str) -> str:
        """The part of the reply so far that can go out now."""
        return self.hold.feed(text) if self.use.active else text

    def finish(self) -> tuple[str, ParsedReply]:
        """At the end: the held text read for calls; returns the content
        still to send and the calls."""
        held = self.hold.held()
        if not self.use.active or not held:
            return held, ParsedReply(held, [])
        parsed = self.use.parse(held)
        if not parsed.calls:
            return held, parsed
        return parsed.content or "", parsed


def with_calls(reply: str, calls: Sequence[str]) -> str:
    """``reply`` with ``calls`` (the ``tool_call`` events' texts: the calls a
    model configured with tool-call markers had taken out of it) put back in
    Hermes' spelling, which :func:`parse_tool_calls` reads."""
    return reply + "".join(f"<tool_call>{t}</tool_call>" for t in calls)


def reply_text(result: Completion) -> str:
    """The reply as the model wrote it: the text, and its calls put back
    (:func:`with_calls`)."""
    return with_calls(result.reply, result.tool_calls)


def finish_reason(parsed: ParsedReply, base: str) -> str:
    """``tool_calls`` when the reply made calls, else the completion's own."""
    return "tool_calls" if parsed.calls else base
