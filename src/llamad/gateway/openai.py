"""OpenAI's API over llamad: ``/v1/models`` (and ``/v1/models/{id}``), ``/v1/chat/completions``,
``/v1/completions``, ``/v1/embeddings``.

The translation (request JSON to the client's keyword arguments, a
:class:`~llamad.model.results.Completion` or a stream of events to OpenAI's
JSON) is made of plain functions, unit-tested without a daemon
(``tests/unit/gateway/``); the route functions only chain them through the
:class:`~llamad.gateway.gate.Gate`.

What is honoured: ``max_tokens`` / ``max_completion_tokens``, ``temperature``,
``top_p``, ``seed``, ``stop``, ``frequency_penalty``, ``presence_penalty``,
``logprobs`` / ``top_logprobs``, ``response_format`` (``json_object``,
``json_schema`` through llamad's JSON-schema grammar), ``stream`` with
``stream_options.include_usage``, and llamad's own ``top_k``, ``min_p``,
``repetition_penalty`` and ``cache_salt`` (vLLM's name). ``n`` > 1 is refused.
Any other field is ignored, as OpenAI-compatible servers do: clients send
fields of their own (``user``, ``metadata``, ``store``).
``usage.prompt_tokens_details.cached_tokens`` is every prompt token whose KV
this request did not compute: restored from a tier or kept live.
"""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from array import array
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from llamad.errors import LlamadError
from llamad.front.wire import ModelInfo
from llamad.gateway.errors import HttpError, param_of, status_of
from llamad.gateway.gate import Gate
from llamad.gateway.sse import EventStream, gathered
from llamad.gateway.tools import (
    ToolStream,
    ToolUse,
    call_deltas,
    finish_reason,
    openai_calls,
    reply_text,
    tool_use,
    with_calls,
)
from llamad.model.results import (
    Completion,
    DoneEvent,
    FinishReason,
    ThinkingEvent,
    TokenEvent,
    TokenLogprob,
    ToolCallEvent,
)

__all__ = [
    "ChatCall",
    "TextCall",
    "chat_call",
    "chat_chunk",
    "chat_response",
    "completion_call",
    "embedding_inputs",
    "error_response",
    "render_error",
    "routes",
    "text_response",
    "usage",
]

MAX_TOP_LOGPROBS: Final = 20
_SAMPLING: Final = {
    "temperature": float,
    "top_p": float,
    "frequency_penalty": float,
    "presence_penalty": float,
    # llamad's (and vLLM's) own
    "top_k": int,
    "min_p": float,
    "repetition_penalty": float,
}
_FINISH: Final = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.CANCELLED: "stop",
}
_CODES: Final = {"context_overflow": "context_length_exceeded"}
"""llamad codes OpenAI's clients know under another name."""


# -- errors ------------------------------------------------------------------------------


def _error_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 429:
        return "rate_limit_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def error_body(status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    """OpenAI's error object."""
    return {
        "error": {
            "message": message,
            "type": _error_type(status),
            "param": param,
            "code": _CODES.get(code, code),
        }
    }


def render_error(status: int, code: str, message: str, param: str | None) -> Response:
    """An error in OpenAI's shape (:data:`llamad.gateway.gate.ErrorRender`)."""
    return _json(error_body(status, code, message, param), status)


error_response = render_error


def json_response(body: Any, status: int = 200) -> Response:
    """``body`` as a JSON response (for the OpenAI routes of other modules)."""
    return _json(body, status)


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status, media_type="application/json")


def _bad(param: str, message: str) -> HttpError:
    return HttpError("bad_request", f"{param}: {message}", param=param)


# -- requests ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ChatCall:
    """A chat request as the client's arguments."""

    model: str
    messages: list[dict[str, Any]]
    options: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    chat: dict[str, Any] = field(default_factory=dict)
    tools: ToolUse = field(default_factory=ToolUse)


@dataclass(frozen=True)
class TextCall:
    """A legacy completion request as the client's arguments."""

    model: str
    prompt: str | list[int]
    options: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "give the id of a model the daemon serves (GET /v1/models)")
    return model


def _number(body: Mapping[str, Any], name: str, kind: type) -> Any:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, f"must be a number, got {value!r}")
    if kind is int and not float(value).is_integer():
        raise _bad(name, f"must be an integer, got {value!r}")
    return kind(value)


def _flag(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _bad(name, f"must be true or false, got {value!r}")
    return value


def _common(body: Mapping[str, Any], *, max_tokens_names: Sequence[str]) -> dict[str, Any]:
    """The options chat and text completions share."""
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad(
            "n",
            f"{n!r} choices asked; llamad returns one choice per request (send n requests: "
            "they share the prompt's cache)",
        )
    options: dict[str, Any] = {}
    for name, kind in _SAMPLING.items():
        value = _number(body, name, kind)
        if value is not None:
            options[name] = value
    for name in max_tokens_names:
        value = _number(body, name, int)
        if value is not None:
            options["max_tokens"] = value
            break
    seed = _number(body, "seed", int)
    if seed is not None:
        options["seed"] = seed & 0xFFFFFFFF  # OpenAI takes any int64; llamad a u32
    stop = body.get("stop")
    if isinstance(stop, str):
        options["stop"] = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if stop:
            options["stop"] = tuple(stop)
    elif stop is not None:
        raise _bad("stop", "must be a string or a list of strings")
    options.update(_response_format(body.get("response_format")))
    salt = body.get("cache_salt")
    if salt is not None:
        options["cache_salt"] = salt
    return options


def _response_format(fmt: object) -> dict[str, Any]:
    if fmt is None:
        return {}
    if not isinstance(fmt, dict):
        raise _bad("response_format", "must be an object with a type")
    kind = fmt.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"json_schema": {"type": "object"}}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise _bad("response_format", "json_schema must be an object with a schema")
        schema = spec.get("schema", {"type": "object"})
        if not isinstance(schema, dict):
            raise _bad("response_format", "json_schema.schema must be a JSON schema object")
        return {"json_schema": schema}
    raise _bad("response_format", f"type {kind!r} is not one of text, json_object, json_schema")


def _stream_flags(body: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = _flag(body, "stream")
    opts = body.get("stream_options")
    include = False
    if opts is not None:
        if not isinstance(opts, dict):
            raise _bad("stream_options", "must be an object")
        include = bool(opts.get("include_usage", False))
    return stream, include


def _content(content: object, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(where, f"only text content is served (got a {kind!r} part)")
            text = part.get("text")
            if not isinstance(text, str):
                raise _bad(where, "a text part needs its text")
            parts.append(text)
        return "".join(parts)
    raise _bad(where, "content must be a string or a list of text parts")


def chat_messages(raw: object) -> list[dict[str, Any]]:
    """OpenAI's messages as the chat template's: text content, ``developer`` as
    ``system``."""
    if not isinstance(raw, list) or not raw:
        raise _bad("messages", "give a non-empty list of messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _bad("messages", f"message {i} needs a role")
        role = "system" if m["role"] == "developer" else m["role"]
        message = {k: v for k, v in m.items() if k not in ("role", "content", "name")}
        message["role"] = role
        message["content"] = _content(m.get("content"), "messages")
        out.append(message)
    return out


def chat_call(body: Mapping[str, Any]) -> ChatCall:
    """A ``/v1/chat/completions`` body as the client's arguments (400 naming
    the field for anything llamad cannot do as asked)."""
    model = _model(body)
    messages = chat_messages(body.get("messages"))
    options = _common(body, max_tokens_names=("max_completion_tokens", "max_tokens"))
    logprobs = _flag(body, "logprobs")
    top = _number(body, "top_logprobs", int)
    if top is not None:
        if not logprobs:
            raise _bad("top_logprobs", "needs logprobs: true")
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _bad("top_logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}")
    if logprobs:
        options["logprobs"] = top or 0
    stream, include = _stream_flags(body)
    tools = tool_use(body.get("tools"), body.get("tool_choice"))
    if tools.active and tools.choice not in (None, "auto") and "json_schema" in options:
        raise _bad(
            "tool_choice", "a required or named tool call cannot also follow response_format"
        )
    return ChatCall(
        model, messages, options, stream, include, logprobs, tools.chat_options(), tools
    )


def completion_call(body: Mapping[str, Any]) -> TextCall:
    """A ``/v1/completions`` body as the client's arguments."""
    model = _model(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        # Exactly int: no bool (an int subclass; JSON gives no other). In C:
        # isinstance twice per id took ~0.1 ms of a 2,048-id prompt's first token.
        if set(map(type, prompt)) != {int}:
            raise _bad("prompt", "one prompt per request: a string or a list of token ids")
    elif not isinstance(prompt, str):
        raise _bad("prompt", "give a string or a list of token ids")
    for unsupported in ("suffix",):
        if body.get(unsupported) is not None:
            raise _bad(unsupported, "is not supported")
    if _flag(body, "echo"):
        raise _bad("echo", "is not supported")
    best_of = body.get("best_of")
    if best_of is not None and best_of != 1:
        raise _bad("best_of", "llamad returns one choice per request")
    options = _common(body, max_tokens_names=("max_tokens",))
    if "max_tokens" not in options:
        options["max_tokens"] = 16  # OpenAI's default for this endpoint
    logprobs = _number(body, "logprobs", int)
    if logprobs is not None:
        if not 0 <= logprobs <= MAX_TOP_LOGPROBS:
            raise _bad("logprobs", f"must be between 0 and {MAX_TOP_LOGPROBS}")
        options["logprobs"] = logprobs
    stream, include = _stream_flags(body)
    return TextCall(model, prompt, options, stream, include, logprobs)


def embedding_inputs(body: Mapping[str, Any]) -> list[str | list[int]]:
    """``input`` of ``/v1/embeddings``: one or several texts or token lists."""
    raw = body.get("input")
    if isinstance(raw, str):
        return [raw]
    if isinstance(raw, list) and raw:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
            return [list(raw)]
        items: list[str | list[int]] = []
        for item in raw:
            if isinstance(item, str):
                items.append(item)
            elif isinstance(item, list) and item and all(isinstance(t, int) for t in item):
                items.append(list(item))
            else:
                raise _bad("input", "each input is a string or a list of token ids")
        return items
    raise _bad("input", "give a string, a list of strings, or token ids")


# -- answers -----------------------------------------------------------------------------


def usage(result: Completion) -> dict[str, Any]:
    """OpenAI's usage of ``result``: ``cached_tokens`` are the prompt tokens
    this request did not compute (restored from a tier or kept live)."""
    prompt = result.stats.prompt_tokens
    completion = result.stats.completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": result.cache_delta.sources.reused},
    }


def _finish(result: Completion) -> str:
    return _FINISH.get(result.finish_reason, "stop")


TokenTexts = Mapping[int, str]


def _token_entry(token: int, logprob: float, texts: TokenTexts) -> dict[str, Any]:
    text = texts.get(token, "")
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def chat_logprobs(entries: Sequence[TokenLogprob], texts: TokenTexts) -> dict[str, Any]:
    """OpenAI's ``logprobs`` of a chat choice."""
    return {
        "content": [
            {
                **_token_entry(e.token, e.logprob, texts),
                "top_logprobs": [_token_entry(t.token, t.logprob, texts) for t in e.top],
            }
            for e in entries
        ]
    }


def text_logprobs(entries: Sequence[TokenLogprob], texts: TokenTexts) -> dict[str, Any]:
    """The legacy completions' ``logprobs``."""
    offsets: list[int] = []
    at = 0
    for e in entries:
        offsets.append(at)
        at += len(texts.get(e.token, ""))
    return {
        "tokens": [texts.get(e.token, "") for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{texts.get(t.token, ""): t.logprob for t in e.top} for e in entries],
        "text_offset": offsets,
    }


def chat_response(
    call_id: str,
    model: str,
    result: Completion,
    created: int,
    texts: TokenTexts | None = None,
    *,
    tools: ToolUse | None = None,
) -> dict[str, Any]:
    """A non-streamed chat completion; with ``tools`` active, the calls the
    reply makes as ``tool_calls`` (``finish_reason`` ``tool_calls``)."""
    message: dict[str, Any] = {"role": "assistant", "content": result.reply}
    finish = _finish(result)
    if tools is not None and tools.active:
        parsed = tools.parse(reply_text(result))
        if parsed.calls:
            message["content"] = parsed.content
            message["tool_calls"] = openai_calls(parsed)
            finish = finish_reason(parsed, finish)
    if result.thinking:
        message["reasoning_content"] = result.thinking
    logprobs = None
    if texts is not None and result.logprobs is not None:
        logprobs = chat_logprobs(result.logprobs, texts)
    return {
        "id": call_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        ],
        "usage": usage(result),
        "system_fingerprint": None,
    }


def text_response(
    call_id: str, model: str, result: Completion, created: int, texts: TokenTexts | None = None
) -> dict[str, Any]:
    """A non-streamed legacy completion."""
    logprobs = None
    if texts is not None and result.logprobs is not None:
        logprobs = text_logprobs(result.logprobs, texts)
    return {
        "id": call_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "text": result.reply,
                "logprobs": logprobs,
                "finish_reason": _finish(result),
            }
        ],
        "usage": usage(result),
        "system_fingerprint": None,
    }


def chat_chunk(
    call_id: str,
    model: str,
    created: int,
    delta: dict[str, Any] | None,
    *,
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
    include_usage: bool = False,
    usage_of: Completion | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta=None``: the usage chunk (no choice)."""
    chunk: dict[str, Any] = {
        "id": call_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
    }
    if include_usage:
        chunk["usage"] = None if usage_of is None else usage(usage_of)
    return chunk


def text_chunk(
    call_id: str,
    model: str,
    created: int,
    text: str | None,
    *,
    finish: str | None = None,
    logprobs: dict[str, Any] | None = None,
    include_usage: bool = False,
    usage_of: Completion | None = None,
) -> dict[str, Any]:
    """One streamed ``text_completion``; ``text=None``: the usage chunk."""
    chunk: dict[str, Any] = {
        "id": call_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "system_fingerprint": None,
        "choices": []
        if text is None
        else [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}],
    }
    if include_usage:
        chunk["usage"] = None if usage_of is None else usage(usage_of)
    return chunk


# -- routes ------------------------------------------------------------------------------


def _ids(prefix: str) -> tuple[str, str]:
    """(the response's id, the llamad request id: the same hex, so a log line
    of either names the other)."""
    hexa = uuid.uuid4().hex[:24]
    return f"{prefix}-{hexa}", f"r-{hexa}"


async def _token_texts(gate: Gate, model: str, entries: Sequence[TokenLogprob]) -> dict[int, str]:
    """Each token's own text (one detokenize per distinct token, at once)."""
    ids = sorted({e.token for e in entries} | {t.token for e in entries for t in e.top})
    texts = await asyncio.gather(*(gate.detokenize(model, [t]) for t in ids))
    return dict(zip(ids, texts, strict=True))


def _sse(events: AsyncIterator[dict[str, Any] | None], ping_s: float | None) -> EventStream:
    """``events``' chunks as ``data:`` lines, gathered up to each ``None`` (the
    next event has not arrived: write now) into one write, ``[DONE]`` with the
    last ones. So what arrived together leaves together (a chat's role chunk
    with its first token's; a last token with the finish and usage chunks),
    and no chunk waits for an event still to come (a completion's first token
    once waited for the second, or for the finish save the worker runs after
    it: HTTP's cost to the first token, ``docs/internals/gateway.md``)."""

    async def data() -> AsyncIterator[bytes | None]:
        async for chunk in events:
            yield None if chunk is None else b"data: " + msgspec.json.encode(chunk) + b"\n\n"

    return EventStream(gathered(data(), last=b"data: [DONE]\n\n"), ping_s=ping_s)


def routes(gate: Gate) -> list[BaseRoute]:
    """The OpenAI routes, over ``gate``."""

    async def models(request: Request) -> Response:
        gate.caller(request)
        found = await gate.list_models(request)
        return _json({"object": "list", "data": [_model_entry(m) for m in found]})

    async def model(request: Request) -> Response:
        gate.caller(request)
        wanted = request.path_params["model"]
        for m in await gate.list_models(request):
            if m.model_id == wanted:
                return _json(_model_entry(m))
        raise HttpError("model_not_found", f"no model {wanted!r}", param="model")

    async def chat(request: Request) -> Response:
        caller = gate.caller(request)
        call = chat_call(await gate.json_body(request))
        options = call.options
        response_id, request_id = _ids("chatcmpl")
        created = int(time.time())
        kwargs = {"messages": call.messages, "request_id": request_id, **options}
        if call.chat:
            kwargs["chat"] = call.chat
        if not call.stream:
            result = await gate.complete(request, caller, call.model, **kwargs)
            texts = await _texts_of(gate, call.model, result) if call.logprobs else None
            return _json(
                chat_response(response_id, call.model, result, created, texts, tools=call.tools)
            )
        opened = await gate.stream(request, caller, call.model, keepalive=True, **kwargs)
        held = ToolStream(call.tools)

        async def chunks() -> AsyncIterator[dict[str, Any] | None]:
            def chunk(delta: dict[str, Any] | None, **kw: Any) -> dict[str, Any]:
                return chat_chunk(
                    response_id,
                    call.model,
                    created,
                    delta,
                    include_usage=call.include_usage,
                    **kw,
                )

            yield chunk({"role": "assistant", "content": ""})
            if not opened.ready():
                yield None  # a late first token: the stream begins while it prefills
            async for event in _guarded_events(opened.events(), render_stream_error):
                if isinstance(event, dict):  # an error after the first event
                    yield event
                    return
                if isinstance(event, TokenEvent):
                    logprobs = None
                    if call.logprobs and event.logprob is not None:
                        yield None  # what is gathered leaves before the round trip
                        texts = await _token_texts(gate, call.model, [event.logprob])
                        logprobs = chat_logprobs([event.logprob], texts)
                    text = held.feed(event.text)
                    if text or logprobs is not None:
                        yield chunk({"content": text}, logprobs=logprobs)
                elif isinstance(event, ThinkingEvent):
                    yield chunk({"reasoning_content": event.text})
                elif isinstance(event, ToolCallEvent):  # a model configured with markers
                    held.feed(with_calls("", [event.text]))
                elif isinstance(event, DoneEvent):
                    rest, parsed = held.finish()
                    if rest:
                        yield chunk({"content": rest})
                    if parsed.calls:
                        yield chunk({"tool_calls": call_deltas(parsed)})
                    yield chunk({}, finish=finish_reason(parsed, _finish(event.result)))
                    if call.include_usage:
                        yield chunk(None, usage_of=event.result)
                if not isinstance(event, DoneEvent) and not opened.ready():
                    yield None

        return _sse(chunks(), opened.keepalive_s)

    async def completions(request: Request) -> Response:
        caller = gate.caller(request)
        call = completion_call(await gate.json_body(request))
        options = call.options
        response_id, request_id = _ids("cmpl")
        created = int(time.time())
        kwargs = {"request_id": request_id, **options}
        if not call.stream:
            result = await gate.complete(request, caller, call.model, call.prompt, **kwargs)
            texts = None
            if call.logprobs is not None:
                texts = await _texts_of(gate, call.model, result)
            return _json(text_response(response_id, call.model, result, created, texts))
        opened = await gate.stream(
            request, caller, call.model, call.prompt, keepalive=True, **kwargs
        )

        async def chunks() -> AsyncIterator[dict[str, Any] | None]:
            def chunk(text: str | None, **kw: Any) -> dict[str, Any]:
                return text_chunk(
                    response_id, call.model, created, text, include_usage=call.include_usage, **kw
                )

            async for event in _guarded_events(opened.events(), render_stream_error):
                if isinstance(event, dict):
                    yield event
                    return
                if isinstance(event, TokenEvent):
                    logprobs = None
                    if call.logprobs is not None and event.logprob is not None:
                        yield None  # what is gathered leaves before the round trip
                        texts = await _token_texts(gate, call.model, [event.logprob])
                        logprobs = text_logprobs([event.logprob], texts)
                    if event.text or logprobs is not None:
                        yield chunk(event.text, logprobs=logprobs)
                elif isinstance(event, DoneEvent):
                    yield chunk("", finish=_finish(event.result))
                    if call.include_usage:
                        yield chunk(None, usage_of=event.result)
                if not isinstance(event, DoneEvent) and not opened.ready():
                    yield None

        return _sse(chunks(), opened.keepalive_s)

    async def embeddings(request: Request) -> Response:
        caller = gate.caller(request)
        body = await gate.json_body(request)
        model = _model(body)
        inputs = embedding_inputs(body)
        fmt = body.get("encoding_format") or "float"
        if fmt not in ("float", "base64"):
            raise _bad("encoding_format", "must be float or base64")
        if body.get("dimensions") is not None:
            raise _bad("dimensions", "is not supported (the model's own size is returned)")
        tokens = await asyncio.gather(
            *(
                gate.tokenize(model, item) if isinstance(item, str) else _same(item)
                for item in inputs
            )
        )
        vectors = await gate.embed(request, caller, model, tokens)
        data = [
            {"object": "embedding", "index": i, "embedding": _vector(v, fmt)}
            for i, v in enumerate(vectors)
        ]
        n = sum(len(t) for t in tokens)
        return _json(
            {
                "object": "list",
                "data": data,
                "model": model,
                "usage": {"prompt_tokens": n, "total_tokens": n},
            }
        )

    return [
        gate.route("/v1/models", models, render_error, ["GET"]),
        gate.route("/v1/models/{model:path}", model, render_error, ["GET"]),
        gate.route("/v1/chat/completions", chat, render_error, ["POST"]),
        gate.route("/v1/completions", completions, render_error, ["POST"]),
        gate.route("/v1/embeddings", embeddings, render_error, ["POST"]),
    ]


def _model_entry(m: ModelInfo) -> dict[str, Any]:
    return {
        "id": m.model_id,
        "object": "model",
        "created": int(m.loaded_at or 0),
        "owned_by": "llamad",
    }


async def _same(tokens: list[int]) -> list[int]:
    return tokens


def _vector(values: list[float], fmt: str) -> list[float] | str:
    if fmt == "float":
        return values
    return base64.b64encode(array("f", values).tobytes()).decode()


async def _texts_of(gate: Gate, model: str, result: Completion) -> dict[int, str] | None:
    if result.logprobs is None:
        return None
    return await _token_texts(gate, model, result.logprobs)


def render_stream_error(status: int, code: str, message: str, param: str | None) -> dict[str, Any]:
    """An error after the stream began: its status is sent already, so the
    error object is the last ``data:`` line (what OpenAI's clients raise)."""
    return error_body(status, code, message, param)


async def _guarded_events(
    events: AsyncIterator[Any],
    render: Callable[[int, str, str, str | None], dict[str, Any]],
) -> AsyncIterator[Any]:
    try:
        async for event in events:
            yield event
    except LlamadError as exc:
        yield render(status_of(exc), exc.code, exc.message, param_of(exc))
