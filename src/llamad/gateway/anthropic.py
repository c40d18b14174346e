"""Anthropic's Messages API onto llamad (no I/O): request shapes in, JSON and SSE events out.

``POST /v1/messages`` and ``POST /v1/messages/count_tokens`` (see
docs/internals/gateway.md, "Anthropic"). The route decodes a body with
:func:`parse_messages` (a :class:`MessagesRequest`, validated by msgspec; a
bad body is a :class:`~llamad.errors.BadRequest` naming the field), turns it
into the llamad call with :meth:`MessagesRequest.call`, and answers with
:func:`message_body` (``stream: false``) or a :class:`StreamEncoder` fed the
client's stream events (``stream: true``). Errors take Anthropic's shape
(:func:`error_body`) with the status of their llamad code.

Usage, from the cache's own accounting (:class:`~llamad.model.results.CacheDelta`):

- ``cache_read_input_tokens`` = ``cache_delta.read``: prompt tokens a
  restored row or live KV supplied (not prefilled by this request);
- ``cache_creation_input_tokens`` = ``cache_delta.created`` bounded by the
  rest of the prompt: prompt tokens this request computed *and* submitted to
  the cache for saving (a later request may read them);
- ``input_tokens`` = the rest of the prompt: computed and not saved.

The three add up to the rendered prompt's length, as Anthropic's do
(``input_tokens`` counts only what is after the last cache breakpoint).
llamad caches every prompt on its own (its save policy decides), so
``cache_control`` markers are accepted and ignored.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from llamad.errors import BadRequest, LlamadError
from llamad.gateway.calls import Call, CallHold, split_calls
from llamad.gateway.decode import convert_body, decode_body
from llamad.gateway.errors import status_of
from llamad.gateway.sse import EventStream
from llamad.model.results import (
    Completion,
    DoneEvent,
    Event,
    FinishReason,
    ThinkingEvent,
    TokenEvent,
    ToolCallEvent,
)

if TYPE_CHECKING:
    from llamad.gateway.gate import Gate

__all__ = [
    "CountTokensRequest",
    "MessagesRequest",
    "StreamEncoder",
    "count_tokens_body",
    "error_body",
    "error_for",
    "message_body",
    "new_message_id",
    "parse_count_tokens",
    "parse_messages",
    "render_error",
    "routes",
    "stop_reason",
    "usage",
]

SSE = tuple[str, dict[str, Any]]
"""One server-sent event: its ``event`` name and its ``data`` (JSON)."""


# -- request shapes -------------------------------------------------------------------


class TextBlock(msgspec.Struct, tag="text", tag_field="type"):
    text: str


class ImageBlock(msgspec.Struct, tag="image", tag_field="type"):
    source: dict[str, Any] = msgspec.field(default_factory=dict)


class DocumentBlock(msgspec.Struct, tag="document", tag_field="type"):
    source: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolUseBlock(msgspec.Struct, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolResultBlock(msgspec.Struct, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str | list[TextBlock | ImageBlock | DocumentBlock] | None = None
    is_error: bool = False


class ThinkingBlock(msgspec.Struct, tag="thinking", tag_field="type"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(msgspec.Struct, tag="redacted_thinking", tag_field="type"):
    data: str = ""


Block = (
    TextBlock
    | ImageBlock
    | DocumentBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | RedactedThinkingBlock
)


class MessageParam(msgspec.Struct):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolParam(msgspec.Struct):
    name: str
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    description: str | None = None


class ToolChoice(msgspec.Struct):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class ThinkingParam(msgspec.Struct):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class JsonOutputFormat(msgspec.Struct):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct):
    """Structured outputs: ``format`` is a JSON schema the reply follows
    (``effort`` is ignored)."""

    format: JsonOutputFormat | None = None


class _Prompted(msgspec.Struct, kw_only=True):
    """What the Messages and count_tokens requests share: the prompt."""

    model: str
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingParam | None = None

    def chat(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The chat messages and chat options the model's template renders."""
        if not self.messages:
            raise _bad("messages", "at least one message is required")
        messages: list[dict[str, Any]] = []
        system = _system_text(self.system)
        if system is not None:
            messages.append({"role": "system", "content": system})
        for i, message in enumerate(self.messages):
            messages.extend(_chat_messages(message, f"messages[{i}]"))
        chat: dict[str, Any] = {}
        if self.messages[-1].role == "assistant":
            # Anthropic's "prefill": the reply goes on from the last assistant turn.
            chat["add_generation_prompt"] = False
            chat["continue_final_message"] = True
        tools = self.template_tools()
        if tools is not None:
            chat["tools"] = tools
            chat["tool_choice"] = self.template_tool_choice()
        if self.thinking is not None:
            chat["enable_thinking"] = self.thinking.type != "disabled"
        return messages, chat

    def template_tools(self) -> list[dict[str, Any]] | None:
        """``tools`` as the chat templates take them (OpenAI's function shape)."""
        if not self.tools:
            return None
        out = []
        for tool in self.tools:
            function: dict[str, Any] = {"name": tool.name, "parameters": tool.input_schema}
            if tool.description is not None:
                function["description"] = tool.description
            out.append({"type": "function", "function": function})
        return out

    def template_tool_choice(self) -> str | dict[str, Any]:
        """``tool_choice`` as llamad's chat option: ``any`` is ``required`` and
        ``tool`` a named function, both forced by the worker's grammar."""
        choice = self.tool_choice
        if choice is None or choice.type == "auto":
            return "auto"
        if choice.type == "tool":
            if not choice.name:
                raise _bad("tool_choice.name", "name the tool to call")
            return {"type": "function", "function": {"name": choice.name}}
        return "required" if choice.type == "any" else "none"

    def called_tools(self) -> list[dict[str, Any]] | None:
        """The tools whose calls the reply is read for (none with ``tool_choice`` none)."""
        if self.tool_choice is not None and self.tool_choice.type == "none":
            return None
        return self.template_tools()


class MessagesRequest(_Prompted, kw_only=True):
    """``POST /v1/messages``; fields llamad does not use (``metadata``,
    ``service_tier``, ...) are ignored."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool = False
    output_config: OutputConfig | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None

    def call(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """``messages`` and the keyword options of ``AsyncClient.infer``/``complete``
        (request parameters and chat options together)."""
        messages, options = self.chat()
        options["max_tokens"] = self.max_tokens
        if self.stop_sequences:
            options["stop"] = tuple(self.stop_sequences)
        if self.output_config is not None and self.output_config.format is not None:
            options["json_schema"] = self.output_config.format.schema
        # Absent sampling fields keep the model's defaults (llamad's request defaults).
        for name in ("temperature", "top_p", "top_k"):
            value = getattr(self, name)
            if value is not None:
                options[name] = value
        return messages, options


class CountTokensRequest(_Prompted, kw_only=True):
    """``POST /v1/messages/count_tokens``: a Messages request's prompt."""


def parse_messages(body: bytes) -> MessagesRequest:
    """``body`` as a :class:`MessagesRequest`; a bad one is a ``BadRequest``."""
    request = decode_body(body, MessagesRequest)
    if request.max_tokens < 1:
        raise _bad("max_tokens", f"must be at least 1, got {request.max_tokens}")
    return request


def parse_count_tokens(body: bytes) -> CountTokensRequest:
    return decode_body(body, CountTokensRequest)


def count_tokens_body(n_tokens: int) -> dict[str, Any]:
    return {"input_tokens": n_tokens}


def _bad(field_name: str, message: str) -> BadRequest:
    return BadRequest(f"{field_name}: {message}", details={"field": field_name})


def _system_text(system: str | list[TextBlock] | None) -> str | None:
    if system is None or isinstance(system, str):
        return system
    return "\n".join(block.text for block in system) if system else None


def _chat_messages(message: MessageParam, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as the chat template's messages: tool results
    become ``tool`` messages (before the user's own text), tool uses an
    assistant's ``tool_calls``; thinking blocks of earlier turns are dropped
    (templates render them, if at all, from the model's own output)."""
    if isinstance(message.content, str):
        return [{"role": message.role, "content": message.content}]
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for j, block in enumerate(message.content):
        at = f"{where}.content[{j}]"
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ImageBlock | DocumentBlock):
            raise _bad(at, "image and document blocks are not supported (text models)")
        elif isinstance(block, ToolUseBlock):
            if message.role != "assistant":
                raise _bad(at, "tool_use blocks belong to assistant messages")
            calls.append(
                {
                    "id": block.id,
                    "type": "function",
                    "function": {"name": block.name, "arguments": block.input},
                }
            )
        elif isinstance(block, ToolResultBlock):
            if message.role != "user":
                raise _bad(at, "tool_result blocks belong to user messages")
            results.append(
                {
                    "role": "tool",
                    "tool_call_id": block.tool_use_id,
                    "content": _result_text(block, at),
                }
            )
    out = list(results)
    if calls:
        out.append({"role": "assistant", "content": "\n".join(texts) or None, "tool_calls": calls})
    elif texts or not results:
        out.append({"role": message.role, "content": "\n".join(texts)})
    return out


def _result_text(block: ToolResultBlock, where: str) -> str:
    if block.content is None or isinstance(block.content, str):
        return block.content or ""
    parts = []
    for part in block.content:
        if not isinstance(part, TextBlock):
            raise _bad(where, "tool results may hold text only")
        parts.append(part.text)
    return "\n".join(parts)


# -- results --------------------------------------------------------------------------


Tools = list[dict[str, Any]]
"""The tools offered (the chat template's function shape), whose calls a reply is read for."""


def _tool_use(call: Call) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_tool_use_id(), "name": call.name, "input": call.arguments}


def new_message_id() -> str:
    return "msg_" + os.urandom(12).hex()


def new_tool_use_id() -> str:
    return "toolu_" + os.urandom(12).hex()


def usage(completion: Completion) -> dict[str, int]:
    """Anthropic's usage from the cache's accounting (the module doc says how)."""
    prompt = completion.stats.prompt_tokens
    read = min(completion.cache_delta.read, prompt)
    created = min(completion.cache_delta.created, prompt - read)
    return {
        "input_tokens": prompt - read - created,
        "cache_creation_input_tokens": created,
        "cache_read_input_tokens": read,
        "output_tokens": completion.stats.completion_tokens,
    }


def stop_reason(completion: Completion, max_tokens: int | None, *, tool_use: bool) -> str:
    """Anthropic's ``stop_reason`` for ``completion``."""
    if tool_use:
        return "tool_use"
    if completion.stop_sequence is not None:
        return "stop_sequence"
    if completion.finish_reason is FinishReason.LENGTH:
        within = max_tokens is None or completion.stats.completion_tokens >= max_tokens
        return "max_tokens" if within else "model_context_window_exceeded"
    # STOP (end of generation), or CANCELLED (nobody is left to read it).
    return "end_turn"


def message_body(
    completion: Completion,
    *,
    message_id: str,
    model: str,
    max_tokens: int | None,
    tools: Tools | None = None,
) -> dict[str, Any]:
    """The ``stream: false`` answer: a Message object. ``tools``: the tools
    whose calls the reply is read for (``None``: calls stay text)."""
    content: list[dict[str, Any]] = []
    if completion.thinking:
        content.append({"type": "thinking", "thinking": completion.thinking, "signature": ""})
    if tools:
        text, found = split_calls(completion.reply, completion.tool_calls, tools)
    else:
        text, found = completion.reply + "".join(completion.tool_calls), []
    calls = [_tool_use(c) for c in found]
    if text:
        content.append({"type": "text", "text": text})
    content.extend(calls)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(completion, max_tokens, tool_use=bool(calls)),
        "stop_sequence": completion.stop_sequence,
        "usage": usage(completion),
    }


@dataclass(slots=True)
class StreamEncoder:
    """A stream's events as Anthropic's server-sent events.

    :meth:`start` before the first event (``message_start``), :meth:`event`
    for each llamad event, :meth:`done` with the completion (closing the open
    block, ``message_delta`` with the stop reason and the usage, which is
    known only then, and ``message_stop``), or :meth:`error` if the request
    failed. Blocks open as their first text arrives, so empty text never
    makes a block, and the streamed blocks are :func:`message_body`'s.
    """

    message_id: str
    model: str
    max_tokens: int | None
    tools: Tools | None = None
    _index: int = -1
    _open: str | None = None
    _tool_uses: int = 0
    _hold: CallHold = field(default_factory=CallHold)
    _event_calls: list[str] = field(default_factory=list)

    def start(self) -> list[SSE]:
        message: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Counted once the prompt is resolved: message_delta carries the totals.
            "usage": {
                "input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
                "output_tokens": 0,
            },
        }
        return [("message_start", {"type": "message_start", "message": message}), _PING]

    def event(self, event: Event) -> list[SSE]:
        if isinstance(event, TokenEvent):
            text = self._hold.feed(event.text) if self.tools else event.text
            return self._text(text) if text else []
        if isinstance(event, ThinkingEvent):
            return self._thinking(event.text) if event.text else []
        if isinstance(event, ToolCallEvent):
            if self.tools:
                self._event_calls.append(event.text)  # read with the held text at the end
                return []
            return self._text(event.text) if event.text else []
        return []

    def done(self, completion: Completion) -> list[SSE]:
        out: list[SSE] = []
        if self.tools:
            # What was held from where a call may have begun: calls, or text after all.
            text, calls = split_calls(self._hold.held(), self._event_calls, self.tools)
            if text:
                out += self._text(text)
            for call in calls:
                out += self._tool_call(call)
        out += self._close()
        reason = stop_reason(completion, self.max_tokens, tool_use=self._tool_uses > 0)
        delta = {"stop_reason": reason, "stop_sequence": completion.stop_sequence}
        out.append(
            ("message_delta", {"type": "message_delta", "delta": delta, "usage": usage(completion)})
        )
        out.append(("message_stop", {"type": "message_stop"}))
        return out

    def error(self, error: LlamadError) -> list[SSE]:
        _, body = error_for(error)
        return [("error", body)]

    def _text(self, text: str) -> list[SSE]:
        out = self._open_block("text", {"type": "text", "text": ""})
        delta = {"type": "text_delta", "text": text}
        out.append(_delta(self._index, delta))
        return out

    def _thinking(self, text: str) -> list[SSE]:
        out = self._open_block("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        out.append(_delta(self._index, {"type": "thinking_delta", "thinking": text}))
        return out

    def _tool_call(self, call: Call) -> list[SSE]:
        self._tool_uses += 1
        out = self._close()
        self._index += 1
        block = _tool_use(call)
        start = {**block, "input": {}}
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self._index, "content_block": start},
            )
        )
        partial = json.dumps(call.arguments, ensure_ascii=False)
        out.append(_delta(self._index, {"type": "input_json_delta", "partial_json": partial}))
        out.append(_stop(self._index))
        return out

    def _open_block(self, kind: str, block: dict[str, Any]) -> list[SSE]:
        if self._open == kind:
            return []
        out = self._close()
        self._index += 1
        self._open = kind
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self._index, "content_block": block},
            )
        )
        return out

    def _close(self) -> list[SSE]:
        if self._open is None:
            return []
        self._open = None
        return [_stop(self._index)]


_PING: Final[SSE] = ("ping", {"type": "ping"})


def _delta(index: int, delta: Mapping[str, Any]) -> SSE:
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": index, "delta": dict(delta)},
    )


def _stop(index: int) -> SSE:
    return ("content_block_stop", {"type": "content_block_stop", "index": index})


# -- errors ---------------------------------------------------------------------------

_TYPE_BY_STATUS: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error shape for an HTTP ``status``."""
    kind = _TYPE_BY_STATUS.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_for(error: LlamadError) -> tuple[int, dict[str, Any]]:
    """The status and body answering ``error``. A full worker queue is
    Anthropic's 529 ``overloaded_error`` (which its clients retry), not a
    per-key rate limit."""
    status = 529 if error.code == "overloaded" else status_of(error)
    return status, error_body(status, error.message)


def render_error(status: int, code: str, message: str, param: str | None) -> Response:
    """An error in Anthropic's shape (:data:`llamad.gateway.gate.ErrorRender`).
    A full worker queue (``overloaded``) is Anthropic's 529, which its clients retry."""
    if code == "overloaded":
        status = 529
    return _json(error_body(status, message), status)


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status, media_type="application/json")


# -- routes ---------------------------------------------------------------------------


def routes(gate: Gate) -> list[BaseRoute]:
    """``POST /v1/messages`` and ``POST /v1/messages/count_tokens``, over ``gate``."""

    async def messages(request: Request) -> Response:
        caller = gate.caller(request)
        call = convert_body(await gate.json_body(request), MessagesRequest)
        if call.max_tokens < 1:
            raise _bad("max_tokens", f"must be at least 1, got {call.max_tokens}")
        chat, options = call.call()
        message_id = new_message_id()
        tools = call.called_tools()
        kwargs = {"messages": chat, "request_id": "r-" + message_id[4:], **options}
        if not call.stream:
            result = await gate.complete(request, caller, call.model, **kwargs)
            body = message_body(
                result,
                message_id=message_id,
                model=call.model,
                max_tokens=call.max_tokens,
                tools=tools,
            )
            return _json(body)
        # The first event is there before the response starts (unless later
        # than http.keepalive_s), so a refusal (an unknown model, a prompt
        # past the context) keeps its HTTP status.
        opened = await gate.stream(request, caller, call.model, keepalive=True, **kwargs)
        encoder = StreamEncoder(message_id, call.model, call.max_tokens, tools)

        async def events() -> AsyncIterator[bytes]:
            # The frames of what is here leave in one write (message_start
            # with the first token's block, a last token with message_stop),
            # none waiting for an event still to come (openai._sse says more).
            frames = [_sse(name, data) for name, data in encoder.start()]
            try:
                if not opened.ready():  # a late first token: begin while it prefills
                    out, frames = b"".join(frames), []
                    yield out
                async for event in opened.events():
                    if isinstance(event, DoneEvent):
                        sse = encoder.done(event.result)
                    else:
                        sse = encoder.event(event)
                    frames += [_sse(name, data) for name, data in sse]
                    if frames and not isinstance(event, DoneEvent) and not opened.ready():
                        out, frames = b"".join(frames), []
                        yield out
            except LlamadError as exc:
                frames += [_sse(name, data) for name, data in encoder.error(exc)]
            if frames:
                yield b"".join(frames)

        return EventStream(events(), ping_s=opened.keepalive_s)

    async def count_tokens(request: Request) -> Response:
        gate.caller(request)
        call = convert_body(await gate.json_body(request), CountTokensRequest)
        chat, options = call.chat()
        tokens = await gate.apply_chat_template(request, call.model, chat, **options)
        return _json(count_tokens_body(len(tokens)))

    return [
        gate.route("/v1/messages", messages, render_error, ["POST"]),
        gate.route("/v1/messages/count_tokens", count_tokens, render_error, ["POST"]),
    ]


def _sse(name: str, data: dict[str, Any]) -> bytes:
    """One event as Anthropic frames it: its name, then its data."""
    return b"event: " + name.encode() + b"\ndata: " + msgspec.json.encode(data) + b"\n\n"
