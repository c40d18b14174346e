"""OpenAI's Responses API: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A request is a chat turn: ``input`` (a string, or items: messages with text
parts, ``function_call`` and ``function_call_output``) becomes chat-template
messages, ``instructions`` a leading system message, ``max_output_tokens``,
``temperature``, ``top_p`` and ``text.format`` (``json_schema`` or
``json_object``, through the JSON-schema grammar) the request's options,
``tools`` / ``tool_choice`` (function tools, flat or nested) go through the
same path as chat completions' (:mod:`llamad.gateway.tools`).

**Streaming** (``stream: true``): OpenAI's event sequence, each an SSE
``event: <type>`` with its JSON (``type`` and ``sequence_number`` in it):
``response.created``, ``response.in_progress``, then for the reply's text
``response.output_item.added`` (a message), ``response.content_part.added``,
``response.output_text.delta`` per piece, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; for each tool
call ``response.output_item.added`` (a ``function_call``),
``response.function_call_arguments.delta`` and ``.done``,
``response.output_item.done``; last ``response.completed`` (or
``response.incomplete`` at ``max_output_tokens``) with the whole response
and its usage. With tools offered, text is held from where it may begin a
call, as in chat completions' streams (:class:`~llamad.gateway.tools.ToolStream`).
A streamed response is stored as a non-streamed one, before its last event
goes out, so ``previous_response_id`` can name it at once. An error after
the first event is an ``error`` event, then ``response.failed``.

**Continuing a conversation.** With ``store`` (the default) the response is
kept (:mod:`llamad.gateway.response_store`): the conversation so far as
messages (the reply as the model wrote it, so it renders to the tokens the
model produced), and the worker's ``finish_key``, the row the cache saved
of this turn. A request naming it as ``previous_response_id`` renders that
conversation plus its own input and sends the finish key as ``parent_key``:
the worker restores the previous turn's prompt and reply from that row (or
from its live KV) and computes only the new input, which
``usage.input_tokens_details.cached_tokens`` shows. As in OpenAI's API, the
previous turn's ``instructions`` are not carried over (give them again to
keep the prompt's prefix, and so the cache hit, identical), nor its tools.
A ``previous_response_id`` that names no stored response is a 400
``previous_response_not_found`` (OpenAI's code): the request is malformed,
the route exists; ``GET``/``DELETE`` of an unknown id is a 404.

A response is visible only to the tenant that made it (another tenant's id is
"not found"), and continues in the namespace of the tenant asking.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import secrets
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from llamad.errors import LlamadError
from llamad.gateway.errors import HttpError, param_of, status_of
from llamad.gateway.gate import Caller, Gate
from llamad.gateway.openai import json_response as _json
from llamad.gateway.openai import render_error
from llamad.gateway.response_store import (
    ResponseStore,
    StoredResponse,
    new_response_id,
    valid_id,
)
from llamad.gateway.sse import EventStream, gathered
from llamad.gateway.tools import ToolStream, ToolUse, reply_text, tool_use, with_calls
from llamad.llama_ffi.tool_calls import ParsedReply
from llamad.model.results import (
    Completion,
    DoneEvent,
    Event,
    FinishReason,
    TokenEvent,
    ToolCallEvent,
)

__all__ = [
    "STORE_DIR",
    "ResponsesCall",
    "conversation",
    "input_messages",
    "response_events",
    "response_object",
    "responses_call",
    "routes",
]

_TEXT_PARTS: Final = frozenset({"input_text", "output_text", "text"})
STORE_DIR: Final = "responses"
"""Under the daemon's ``state_dir``."""


def _bad(param: str, message: str) -> HttpError:
    return HttpError("bad_request", f"{param}: {message}", param=param)


@dataclass(frozen=True)
class ResponsesCall:
    """A ``POST /v1/responses`` body as the client's arguments."""

    model: str
    input: list[dict[str, Any]]
    instructions: str | None
    options: dict[str, Any]
    tools: ToolUse = field(default_factory=ToolUse)
    previous_id: str | None = None
    store: bool = True
    stream: bool = False
    echo: dict[str, Any] = field(default_factory=dict)
    """Request fields the response object repeats (``temperature``, ...)."""


def _text_of(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "refusal":
                texts.append(str(part.get("refusal", "")))
                continue
            if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
                raise _bad(f"{where}.content[{j}]", f"only text parts are served (got {kind!r})")
            texts.append(part["text"])
        return "".join(texts)
    raise _bad(f"{where}.content", "must be a string or a list of text parts")


def _output_text(output: object) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):
        return _text_of(output, "output")
    return json.dumps(output, ensure_ascii=False)


def input_messages(raw: object) -> list[dict[str, Any]]:
    """``input`` as chat-template messages.

    A string is one user message. Items: a message (``type`` ``message`` or
    absent, ``role`` user / assistant / system / developer, text content);
    ``function_call`` (joins the assistant message before it, or opens one,
    as OpenAI's ``tool_calls``); ``function_call_output`` (a ``tool``
    message); ``reasoning`` items are dropped. Others are refused (400).
    """
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise _bad("input", "give a string or a non-empty list of items")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise _bad(where, "must be an object")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise _bad(
                    f"{where}.role", f"must be user, assistant, system or developer, not {role!r}"
                )
            role = "system" if role == "developer" else role
            out.append({"role": role, "content": _text_of(item.get("content"), where)})
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments", "{}")
            call_id = item.get("call_id") or item.get("id")
            if not isinstance(name, str) or not isinstance(arguments, str):
                raise _bad(where, "a function_call needs a name and arguments (JSON text)")
            call = {
                "id": call_id if isinstance(call_id, str) else f"call_{secrets.token_hex(12)}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise _bad(f"{where}.call_id", "must name the call it answers")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": call_id,
                    "content": _output_text(item.get("output")),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise _bad(f"{where}.type", f"{kind!r} items are not served")
    if not out:
        raise _bad("input", "holds no message")
    return out


def _format(text: object) -> tuple[dict[str, Any], dict[str, Any]]:
    """``text.format``: the options it asks for, and the ``text`` to echo."""
    if text is None:
        return {}, {"format": {"type": "text"}}
    if not isinstance(text, Mapping):
        raise _bad("text", "must be an object")
    fmt = text.get("format")
    if fmt is None or (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
        return {}, {"format": {"type": "text"}}
    if not isinstance(fmt, Mapping):
        raise _bad("text.format", "must be an object with a type")
    kind = fmt.get("type")
    if kind == "json_object":
        return {"json_schema": {"type": "object"}}, {"format": dict(fmt)}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, Mapping):
            raise _bad("text.format.schema", "must be a JSON schema object")
        return {"json_schema": dict(schema)}, {"format": dict(fmt)}
    raise _bad("text.format.type", f"{kind!r} is not one of text, json_object, json_schema")


def _number(body: Mapping[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, f"must be a number, got {value!r}")
    if kind is int and not float(value).is_integer():
        raise _bad(name, f"must be an integer, got {value!r}")
    return kind(value)


def responses_call(body: Mapping[str, Any]) -> ResponsesCall:
    """A ``POST /v1/responses`` body, checked (400 naming the field)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "give the id of a model the daemon serves (GET /v1/models)")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "must be true or false")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions", "must be a string")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise _bad("previous_response_id", "must be a response id")
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise _bad("store", "must be true or false")
    options: dict[str, Any] = {}
    echo: dict[str, Any] = {}
    for name, key, kind in (
        ("max_output_tokens", "max_tokens", int),
        ("temperature", "temperature", float),
        ("top_p", "top_p", float),
    ):
        value = _number(body, name, kind)
        echo[name] = value
        if value is not None:
            options[key] = value
    fmt_options, echo["text"] = _format(body.get("text"))
    options.update(fmt_options)
    tools = tool_use(body.get("tools"), body.get("tool_choice"))
    if tools.active and tools.choice not in (None, "auto") and "json_schema" in options:
        raise _bad("tool_choice", "a required or named tool call cannot also follow text.format")
    echo["tools"] = tools.tools
    echo["tool_choice"] = tools.choice if tools.choice is not None else "auto"
    echo["instructions"] = instructions
    echo["metadata"] = body.get("metadata") or {}
    return ResponsesCall(
        model,
        input_messages(body.get("input")),
        instructions,
        options,
        tools,
        previous,
        store,
        stream,
        echo,
    )


def conversation(
    call: ResponsesCall, previous: StoredResponse | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The messages to render for ``call`` (instructions, the previous
    conversation, the new input) and the conversation to store after it
    (without instructions: they are not carried over)."""
    history = (list(previous.messages) if previous is not None else []) + call.input
    head = [] if call.instructions is None else [{"role": "system", "content": call.instructions}]
    return head + history, history


def reply_message(result: Completion) -> dict[str, Any]:
    """The reply as the next turn renders it: the text exactly as the model
    wrote it (tool calls included), so it becomes the tokens the model made
    and the finish row restores it whole."""
    return {"role": "assistant", "content": reply_text(result)}


def _usage(result: Completion) -> dict[str, Any]:
    prompt, generated = result.stats.prompt_tokens, result.stats.completion_tokens
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": result.cache_delta.sources.reused},
        "output_tokens": generated,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt + generated,
    }


def _message_item(message_id: str, text: str | None, status: str) -> dict[str, Any]:
    content = [] if text is None else [_text_part(text)]
    return {
        "type": "message",
        "id": message_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _output(parsed: ParsedReply, message_id: str | None = None) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if parsed.content or not parsed.calls:
        message_id = message_id or f"msg_{secrets.token_hex(24)}"
        items.append(_message_item(message_id, parsed.content or "", "completed"))
    for call in parsed.calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{secrets.token_hex(24)}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def _head(call: ResponsesCall, response_id: str, created: float) -> dict[str, Any]:
    """The response object's fields that do not depend on the reply."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(created),
        "error": None,
        "model": call.model,
        "parallel_tool_calls": False,
        "previous_response_id": call.previous_id,
        "store": call.store,
        **call.echo,
    }


def response_object(
    call: ResponsesCall,
    result: Completion,
    *,
    response_id: str | None = None,
    created: float | None = None,
    parsed: ParsedReply | None = None,
    message_id: str | None = None,
) -> dict[str, Any]:
    """OpenAI's ``response`` object for ``result`` (``parsed``: the reply as
    a stream sent it, its message item ``message_id``; default: read from
    ``result``)."""
    if parsed is None:
        parsed = call.tools.parse(reply_text(result))
    incomplete = result.finish_reason is FinishReason.LENGTH and not parsed.calls
    head = _head(
        call, response_id or new_response_id(), created if created is not None else time.time()
    )
    return {
        **head,
        "status": "incomplete" if incomplete else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": _output(parsed, message_id),
        "usage": _usage(result),
    }


async def response_events(
    call: ResponsesCall,
    events: AsyncIterator[Event],
    *,
    response_id: str,
    created: float,
    on_done: Callable[[Completion, dict[str, Any]], None] = lambda result, answer: None,
) -> AsyncIterator[dict[str, Any]]:
    """The streamed response's events (the module's doc) for the llamad
    ``events`` of its request. ``on_done(result, response)`` runs before the
    last event is yielded (the store's put)."""
    async for e in _gathered_events(
        call, events, response_id=response_id, created=created, on_done=on_done, ready=None
    ):
        if e is not None:
            yield e


async def _gathered_events(
    call: ResponsesCall,
    events: AsyncIterator[Event],
    *,
    response_id: str,
    created: float,
    on_done: Callable[[Completion, dict[str, Any]], None],
    ready: Callable[[], bool] | None,
) -> AsyncIterator[dict[str, Any] | None]:
    """:func:`response_events`, with a ``None`` wherever the next llamad
    event has not arrived (``ready()`` is false): the stream writes what it
    gathered there (:func:`_sse`)."""
    seq = itertools.count()

    def event(kind: str, **fields: Any) -> dict[str, Any]:
        return {"type": kind, "sequence_number": next(seq), **fields}

    head = _head(call, response_id, created)
    opening = {
        **head,
        "status": "in_progress",
        "incomplete_details": None,
        "output": [],
        "usage": None,
    }
    yield event("response.created", response=opening)
    yield event("response.in_progress", response=opening)
    if ready is not None and not ready():
        yield None  # a late first token: the stream begins while it prefills
    held = ToolStream(call.tools)
    message_id = f"msg_{secrets.token_hex(24)}"
    where = {"item_id": message_id, "output_index": 0, "content_index": 0}
    sent: list[str] = []  # the text streamed so far

    def text_events(text: str) -> list[dict[str, Any]]:
        out = []
        if not sent:  # the message opens with its first text
            item = _message_item(message_id, None, "in_progress")
            out.append(event("response.output_item.added", output_index=0, item=item))
            out.append(event("response.content_part.added", **where, part=_text_part("")))
        sent.append(text)
        out.append(event("response.output_text.delta", **where, delta=text, logprobs=[]))
        return out

    try:
        async for ev in events:
            if isinstance(ev, TokenEvent):
                text = held.feed(ev.text)
                for out in text_events(text) if text else ():
                    yield out
            elif isinstance(ev, ToolCallEvent):  # a model configured with markers
                held.feed(with_calls("", [ev.text]))
            elif isinstance(ev, DoneEvent):
                rest, parsed = held.finish()
                for out in text_events(rest) if rest else ():
                    yield out
                text = "".join(sent)
                final = ParsedReply(text or None, parsed.calls)
                answer = response_object(
                    call,
                    ev.result,
                    response_id=response_id,
                    created=created,
                    parsed=final,
                    message_id=message_id,
                )
                for index, item in enumerate(answer["output"]):
                    if item["type"] == "message":
                        if not sent:  # an empty reply: its message opens now
                            opened = _message_item(message_id, None, "in_progress")
                            yield event("response.output_item.added", output_index=0, item=opened)
                            yield event("response.content_part.added", **where, part=_text_part(""))
                        yield event("response.output_text.done", **where, text=text, logprobs=[])
                        yield event("response.content_part.done", **where, part=_text_part(text))
                    else:
                        opened = {**item, "arguments": "", "status": "in_progress"}
                        yield event("response.output_item.added", output_index=index, item=opened)
                        at = {"item_id": item["id"], "output_index": index}
                        arguments = item["arguments"]
                        yield event("response.function_call_arguments.delta", **at, delta=arguments)
                        yield event(
                            "response.function_call_arguments.done", **at, arguments=arguments
                        )
                    yield event("response.output_item.done", output_index=index, item=item)
                on_done(ev.result, answer)
                yield event(f"response.{answer['status']}", response=answer)
            if ready is not None and not isinstance(ev, DoneEvent) and not ready():
                yield None  # what is gathered leaves before the next event
    except LlamadError as exc:
        code, message = exc.code, exc.message
        yield event("error", code=code, message=message, param=param_of(exc))
        failed = {
            **opening,
            "status": "failed",
            "error": {"code": code, "message": message, "status": status_of(exc)},
        }
        yield event("response.failed", response=failed)


def _sse(events: AsyncIterator[dict[str, Any] | None], ping_s: float | None) -> EventStream:
    """``events`` as SSE frames, a ``None`` ending a write (:func:`gathered`)."""

    async def frames() -> AsyncIterator[bytes | None]:
        async for e in events:
            yield (
                None
                if e is None
                else b"event: "
                + e["type"].encode()
                + b"\ndata: "
                + msgspec.json.encode(e)
                + b"\n\n"
            )

    return EventStream(gathered(frames()), ping_s=ping_s)


def stored(
    call: ResponsesCall,
    result: Completion,
    response: Mapping[str, Any],
    history: Sequence[Mapping[str, Any]],
    *,
    cache_salt: str | None,
    tenant: str | None,
) -> StoredResponse:
    """The record a continuation of ``response`` needs."""
    return StoredResponse(
        id=str(response["id"]),
        model=call.model,
        messages=[dict(m) for m in history] + [reply_message(result)],
        finish_key=result.finish_key.hex() if result.finish_key else "",
        tokens=list(result.context_tokens),
        cache_salt=cache_salt,
        tenant=tenant,
        response=dict(response),
    )


# -- routes ------------------------------------------------------------------------------


def _not_found(response_id: str) -> HttpError:
    return HttpError("not_found", f"no stored response {response_id!r}", param="response_id")


async def continued_prompt(
    gate: Gate,
    model: str,
    before: Sequence[int],
    messages: list[dict[str, Any]],
    chat: Mapping[str, Any],
) -> list[int] | None:
    """The prompt of a continued conversation that begins with exactly the
    tokens the previous turn left (``before``: its prompt and what the model
    generated), so its finish row (or live KV) covers all of them.

    The conversation rendered anew re-tokenizes the previous reply, which a
    model may have written in other tokens than the tokenizer's (a grammar
    forces characters one at a time; BPE has many spellings of one text);
    then the new part is cut from the rendered text after the previous turn's
    own text and appended to its tokens. None (send the messages) when the
    template does not reproduce the previous turn's text, e.g. a reply
    trimmed at a stop sequence.
    """
    if not before:
        return None
    client = gate.client
    rendered = await client.apply_chat_template(model, messages, **chat)
    if rendered[: len(before)] == list(before):
        return rendered  # the same tokens: nothing to splice
    old_text, new_text = await asyncio.gather(
        client.detokenize(model, list(before)), client.detokenize(model, rendered)
    )
    if not new_text.startswith(old_text) or len(new_text) == len(old_text):
        return None
    rest = await client.tokenize(model, new_text[len(old_text) :], add_special=False)
    return [*before, *rest]


def open_store(gate: Gate) -> ResponseStore | None:
    """The gateway's stored responses (``<state_dir>/responses``; None: no state_dir)."""
    if not gate.state_dir:
        return None
    return ResponseStore(
        Path(gate.state_dir) / STORE_DIR,
        max_count=gate.http.responses_max_count,
        max_bytes=gate.http.responses_max_bytes,
    )


def routes(gate: Gate, store: ResponseStore | None = None) -> list[BaseRoute]:
    """``/v1/responses`` over ``gate`` (``store``: default :func:`open_store`)."""
    kept = store if store is not None else open_store(gate)

    def find(caller: Caller, response_id: str) -> StoredResponse | None:
        record = kept.get(response_id) if kept is not None and valid_id(response_id) else None
        # Another tenant's response is as good as absent.
        return record if record is not None and record.tenant == caller.tenant else None

    async def create(request: Request) -> Response:
        caller = gate.caller(request)
        body = await gate.json_body(request)
        call = responses_call(body)
        previous = None
        if call.previous_id is not None:
            previous = find(caller, call.previous_id)
            if previous is None:
                raise HttpError(
                    "previous_response_not_found",
                    f"previous response {call.previous_id!r} not found (never stored,"
                    " deleted, or dropped by the store's bounds)",
                    param="previous_response_id",
                )
        messages, history = conversation(call, previous)
        salt = gate.salt(caller, body.get("cache_salt"))
        response_id = new_response_id()
        kwargs: dict[str, Any] = {
            "messages": messages,
            "request_id": f"r-{response_id[5:29]}",
            **call.options,
        }
        if salt is not None:
            kwargs["cache_salt"] = salt
        chat = call.tools.chat_options()
        if chat:
            kwargs["chat"] = chat
        prompt: list[int] | None = None
        if previous is not None and previous.model == call.model:
            if previous.finish_key:
                kwargs["parent_key"] = bytes.fromhex(previous.finish_key)
            if call.tools.choice in (None, "auto", "none"):
                # (A required or named call's grammar is made from the chat.)
                prompt = await continued_prompt(gate, call.model, previous.tokens, messages, chat)
        if prompt is not None:
            del kwargs["messages"]
            kwargs.pop("chat", None)
        created = time.time()

        def keep(result: Completion, answer: Mapping[str, Any]) -> None:
            if call.store and kept is not None:
                record = stored(
                    call, result, answer, history, cache_salt=salt, tenant=caller.tenant
                )
                kept.put(record)

        if call.stream:
            opened = await gate.stream(
                request, caller, call.model, prompt, keepalive=True, **kwargs
            )
            return _sse(
                _gathered_events(
                    call,
                    opened.events(),
                    response_id=response_id,
                    created=created,
                    on_done=keep,
                    ready=opened.ready,
                ),
                opened.keepalive_s,
            )
        result = await gate.complete(request, caller, call.model, prompt, **kwargs)
        answer = response_object(call, result, response_id=response_id, created=created)
        keep(result, answer)
        return _json(answer)

    async def retrieve(request: Request) -> Response:
        caller = gate.caller(request)
        response_id = request.path_params["response_id"]
        record = find(caller, response_id)
        if record is None:
            raise _not_found(response_id)
        return _json(record.response)

    async def delete(request: Request) -> Response:
        caller = gate.caller(request)
        response_id = request.path_params["response_id"]
        if find(caller, response_id) is None or kept is None:
            raise _not_found(response_id)
        kept.delete(response_id)
        return _json({"id": response_id, "object": "response.deleted", "deleted": True})

    return [
        gate.route("/v1/responses", create, render_error, ["POST"]),
        gate.route("/v1/responses/{response_id}", retrieve, render_error, ["GET"]),
        gate.route("/v1/responses/{response_id}", delete, render_error, ["DELETE"]),
    ]
