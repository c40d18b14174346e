"""Ollama's API onto llamad (no I/O): request shapes in, JSON objects and NDJSON lines out.

``/api/chat``, ``/api/generate``, ``/api/embed`` (and the older
``/api/embeddings``), ``/api/tags``, ``/api/show``, ``/api/ps``,
``/api/version``; see docs/internals/gateway.md, "Ollama", for the mapping
and for what does not map (``pull``, ``push``, ``create``, ``copy``,
``delete``: :data:`UNSUPPORTED`, answered 501 with Ollama's error shape).

Model names: Ollama's ``name:tag``; llamad's model ids have no tag, so
``id:latest`` names ``id`` (:func:`model_id`) and listings say ``id:latest``
(what Ollama clients expect to match).

Streaming is the default (``stream`` absent is ``true``): one JSON object a
line (``application/x-ndjson``), the last with ``done: true`` and the
counts. An error after the first line is a line ``{"error": ...}``, which
the ``ollama`` client raises.

``keep_alive`` (:func:`keep_alive_seconds`): ``0`` unloads the model once
the request is answered, a duration becomes the model's ``keep_alive``
(the front unloads it after that long idle), a negative one keeps it loaded.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import math
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, Literal, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute

from llamad._pins import LLAMAD_VERSION
from llamad.errors import BadRequest, LlamadError, ModelNotFound
from llamad.front.wire import ModelInfo, ModelState
from llamad.gateway.calls import Call, CallHold, split_calls
from llamad.gateway.decode import convert_body, decode_body
from llamad.gateway.errors import HttpError, status_of
from llamad.gateway.gguf_meta import GGUFMeta, read_gguf_meta
from llamad.gateway.sse import EventStream, gathered
from llamad.gateway.tools import tool_use
from llamad.model.requests import MAX_TOKENS_LIMIT
from llamad.model.results import (
    Completion,
    DoneEvent,
    FinishReason,
    ThinkingEvent,
    TokenEvent,
    ToolCallEvent,
)

if TYPE_CHECKING:
    from llamad.gateway.gate import Caller, Gate

__all__ = [
    "FOREVER",
    "JSON_OBJECT_SCHEMA",
    "UNSUPPORTED",
    "Call",
    "ChatRequest",
    "EmbedRequest",
    "EmbeddingsRequest",
    "GenerateRequest",
    "Options",
    "ShowRequest",
    "chat_chunk",
    "chat_done",
    "embed_body",
    "error_body",
    "error_for",
    "generate_chunk",
    "generate_done",
    "keep_alive_seconds",
    "model_id",
    "model_name",
    "parse",
    "ps_body",
    "render_error",
    "routes",
    "show_body",
    "tags_body",
    "truncate_embedding",
    "version_body",
]

T = TypeVar("T")

FOREVER: Final = math.inf
"""A negative ``keep_alive``: the model stays loaded (llamad's ``keep_alive`` unset)."""

JSON_OBJECT_SCHEMA: Final[dict[str, Any]] = {"type": "object"}
"""``format: "json"``: any JSON object (Ollama's JSON mode answers objects)."""

UNSUPPORTED: Final[dict[str, str]] = {
    "/api/pull": "llamad does not download models: put the GGUF file in an allowed model "
    "directory and name it in the config or load it (llamad models load)",
    "/api/push": "llamad does not publish models",
    "/api/create": "llamad does not build models from Modelfiles: configure the model "
    "in a [models.<id>] table",
    "/api/copy": "llamad does not copy models: add a [models.<id>] table with the same path",
    "/api/delete": "llamad does not delete model files: unload the model (llamad models "
    "unload) and remove the file yourself",
}
"""The Ollama routes that do not map onto llamad, and what to do instead."""


# -- request shapes -------------------------------------------------------------------


class Options(msgspec.Struct):
    """The ``options`` that map onto llamad's request parameters; any other
    (``num_gpu``, ``num_thread``, ``mirostat``, ...) is ignored, as Ollama
    ignores options a runner does not know. ``num_ctx``: the context is the
    model's configured ``n_ctx``; a request cannot change it (ignored).
    ``tool_choice`` is llamad's (Ollama's API has none; the ``ollama``
    client passes ``options`` through): ``"none"``, ``"auto"``,
    ``"required"`` or a tool's name, as OpenAI's ``tool_choice``."""

    num_predict: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_ctx: int | None = None
    tool_choice: str | None = None

    def params(self) -> dict[str, Any]:
        """The llamad request parameters these options set."""
        out: dict[str, Any] = {}
        if self.num_predict is not None and self.num_predict >= 0:
            # -1 (until the end) and -2 (fill the context): no bound, llamad's None.
            # 0 generates nothing in Ollama; llamad needs at least one token.
            out["max_tokens"] = min(max(self.num_predict, 1), MAX_TOKENS_LIMIT)
        same = ("temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty")
        for name in same:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.seed is not None and self.seed >= 0:
            out["seed"] = self.seed  # Ollama's -1 is "random": llamad's None
        if self.stop:
            out["stop"] = tuple(self.stop)
        if self.repeat_penalty is not None:
            out["repetition_penalty"] = self.repeat_penalty
        if self.repeat_last_n is not None:
            out["penalty_last_n"] = self.repeat_last_n
        return out


Duration = str | float | int | None


class ToolCallFunction(msgspec.Struct):
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)


class ToolCall(msgspec.Struct):
    function: ToolCallFunction


class Message(msgspec.Struct):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    thinking: str | None = None
    tool_name: str | None = None

    def chat(self, where: str) -> dict[str, Any]:
        """This message as the chat template takes it."""
        if self.images:
            raise _bad(f"{where}.images", "images are not supported (text models)")
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in self.tool_calls
            ]
        if self.tool_name is not None:
            out["name"] = self.tool_name
        return out


class _Generating(msgspec.Struct, kw_only=True):
    model: str
    format: str | dict[str, Any] | None = None
    options: Options = msgspec.field(default_factory=Options)
    stream: bool = True
    keep_alive: Duration = None
    think: bool | str | None = None

    def params(self) -> dict[str, Any]:
        """Request parameters and chat options for ``AsyncClient.infer``."""
        out = self.options.params()
        if self.format == "json":
            out["json_schema"] = JSON_OBJECT_SCHEMA
        elif isinstance(self.format, dict):
            out["json_schema"] = self.format
        elif self.format not in (None, ""):
            raise _bad("format", f'must be "json" or a JSON schema, got {self.format!r}')
        if self.think is not None:
            # true, or a level ("high", "medium", "low"): templates know on or off.
            out["enable_thinking"] = self.think is not False
        return out


class ChatRequest(_Generating, kw_only=True):
    messages: list[Message] = msgspec.field(default_factory=list)
    tools: list[dict[str, Any]] | None = None

    def call(self) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """``messages`` and the options of the llamad call."""
        if not self.messages:
            raise _bad("messages", "at least one message is required")
        options = self.params()
        choice: str | dict[str, Any] | None = self.options.tool_choice
        if choice is not None and choice not in ("none", "auto", "required"):
            choice = {"type": "function", "function": {"name": choice}}
        try:
            use = tool_use(self.tools, choice)
        except HttpError as exc:
            where = "options.tool_choice" if exc.param == "tool_choice" else "tools"
            raise _bad(where, exc.message.partition(": ")[2] or exc.message) from None
        options.update(use.chat_options())
        if self.messages[-1].role == "assistant":
            # Ollama continues a final assistant message rather than answer it.
            options["add_generation_prompt"] = False
            options["continue_final_message"] = True
        messages = [m.chat(f"messages[{i}]") for i, m in enumerate(self.messages)]
        return messages, options


class GenerateRequest(_Generating, kw_only=True):
    """``/api/generate``: ``prompt`` rendered as a user turn by the model's
    template (with ``system``), or given as is with ``raw``. ``context``: the
    previous answer's ``context`` (token ids), the prompt's tokens appended
    (the route tokenizes them). ``suffix``, ``template`` and ``images`` do
    not map and are refused."""

    prompt: str = ""
    system: str | None = None
    raw: bool = False
    context: list[int] | None = None
    suffix: str | None = None
    template: str | None = None
    images: list[str] | None = None

    def call(self) -> tuple[list[dict[str, Any]] | None, dict[str, Any]]:
        """``(messages, options)``; messages ``None`` when the prompt goes as
        is (``raw``, or with ``context``: the route builds the token prompt)."""
        if self.images:
            raise _bad("images", "images are not supported (text models)")
        if self.suffix:
            raise _bad("suffix", "fill-in-the-middle is not supported")
        if self.template:
            raise _bad("template", "llamad renders with the model's own chat template")
        options = self.params()
        if self.raw or self.context:
            if self.system is not None and not self.raw:
                raise _bad("system", "a system prompt cannot be added to a context")
            return None, options
        messages: list[dict[str, Any]] = []
        if self.system:
            messages.append({"role": "system", "content": self.system})
        messages.append({"role": "user", "content": self.prompt})
        return messages, options

    @property
    def loads_only(self) -> bool:
        """An empty prompt: Ollama's way to load (or, with ``keep_alive`` 0,
        unload) a model without generating."""
        return not self.prompt and not self.context


class EmbedRequest(msgspec.Struct, kw_only=True):
    model: str
    input: str | list[str]
    truncate: bool = True
    options: Options = msgspec.field(default_factory=Options)
    keep_alive: Duration = None
    dimensions: int | None = None

    def inputs(self) -> list[str]:
        items = [self.input] if isinstance(self.input, str) else list(self.input)
        if not items:
            raise _bad("input", "give at least one text")
        if self.dimensions is not None and self.dimensions < 1:
            raise _bad("dimensions", "must be at least 1")
        return items


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    """The older ``/api/embeddings``: one ``prompt``, an ``embedding`` back (not normalized)."""

    model: str
    prompt: str
    options: Options = msgspec.field(default_factory=Options)
    keep_alive: Duration = None


class ShowRequest(msgspec.Struct, kw_only=True):
    model: str = ""
    name: str = ""  # the older spelling
    verbose: bool = False

    @property
    def target(self) -> str:
        target = self.model or self.name
        if not target:
            raise _bad("model", "name a model")
        return target


def parse(body: bytes, typ: type[T]) -> T:
    """``body`` as ``typ``; a bad one is a ``BadRequest`` naming the field."""
    return decode_body(body, typ)


def _bad(field_name: str, message: str) -> BadRequest:
    return BadRequest(f"{field_name}: {message}", details={"field": field_name})


# -- names and keep_alive ---------------------------------------------------------------


def model_id(name: str) -> str:
    """The llamad model id an Ollama model name means (``id:latest`` is ``id``)."""
    return name.removesuffix(":latest")


def model_name(model_id_: str) -> str:
    """An id as Ollama names models: with its tag."""
    return model_id_ if ":" in model_id_ else f"{model_id_}:latest"


_UNIT_S: Final = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def keep_alive_seconds(value: Duration, where: str = "keep_alive") -> float | None:
    """Ollama's ``keep_alive`` in seconds: ``None`` when absent (the model's own
    setting stands), :data:`FOREVER` when negative, else ``>= 0``.

    A number is seconds; a string is a number of seconds or a Go duration
    (``"5m"``, ``"1h30m"``, ``"-1s"``, ``"300ms"``), as Ollama parses it.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise _bad(where, f"must be a duration, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip()
        try:
            seconds = float(text)
        except ValueError:
            seconds = _go_duration(text, where)
    if math.isnan(seconds):
        raise _bad(where, f"must be a duration, got {value!r}")
    return FOREVER if seconds < 0 else seconds


def _go_duration(text: str, where: str) -> float:
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    total = 0.0
    pos = 0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_S[match.group(2)]
        pos = match.end()
    if not body or pos != len(body):
        raise _bad(where, f"is not a duration: {text!r} (give seconds, or e.g. '5m', '1h30m')")
    return sign * total


# -- answers ------------------------------------------------------------------------------


def _now() -> str:
    """Ollama's ``created_at``: RFC 3339 in UTC with nanoseconds' worth of digits."""
    return datetime.datetime.now(datetime.UTC).isoformat().replace("+00:00", "Z")


def _ns(ms: float) -> int:
    return round(ms * 1e6)


def done_reason(completion: Completion) -> str:
    return "length" if completion.finish_reason is FinishReason.LENGTH else "stop"


def _counts(completion: Completion, total_ns: int) -> dict[str, Any]:
    """The final line's counts and durations (nanoseconds). ``prompt_eval_count``
    is the whole prompt; ``prompt_cached_count`` (llamad's) how many of its
    tokens the cache supplied, so ``prompt_eval_count - prompt_cached_count``
    were evaluated by this request."""
    s = completion.stats
    return {
        "done_reason": done_reason(completion),
        "total_duration": total_ns,
        "load_duration": 0,
        "prompt_eval_count": s.prompt_tokens,
        "prompt_eval_duration": _ns(s.restore_ms + s.prefill_ms),
        "eval_count": s.completion_tokens,
        "eval_duration": _ns(s.generation_ms),
        "prompt_cached_count": min(completion.cache_delta.read, s.prompt_tokens),
    }


def _message(content: str, thinking: str, calls: Sequence[Call] = ()) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if thinking:
        message["thinking"] = thinking
    if calls:
        message["tool_calls"] = [
            {"function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return message


def chat_chunk(
    model: str, *, content: str = "", thinking: str = "", calls: Sequence[Call] = ()
) -> dict[str, Any]:
    """One streamed ``/api/chat`` line (``done: false``)."""
    return {
        "model": model,
        "created_at": _now(),
        "message": _message(content, thinking, calls),
        "done": False,
    }


def chat_done(
    completion: Completion,
    model: str,
    total_ns: int,
    *,
    streamed: bool,
    tools: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The last ``/api/chat`` line, or the whole answer (``streamed`` False:
    the message holds the reply, its calls read out of it when ``tools``
    were offered; True: it was sent in the chunks)."""
    if streamed:
        message = _message("", "")
    else:
        if tools:
            text, calls = split_calls(completion.reply, completion.tool_calls, tools)
        else:
            text, calls = completion.reply + "".join(completion.tool_calls), []
        message = _message(text, completion.thinking, calls)
    return {
        "model": model,
        "created_at": _now(),
        "message": message,
        "done": True,
        **_counts(completion, total_ns),
    }


def generate_chunk(model: str, *, response: str = "", thinking: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {
        "model": model,
        "created_at": _now(),
        "response": response,
        "done": False,
    }
    if thinking:
        out["thinking"] = thinking
    return out


def generate_done(
    completion: Completion, model: str, total_ns: int, *, streamed: bool
) -> dict[str, Any]:
    """The last ``/api/generate`` line (or the whole answer). ``context``: the
    tokens the sequence holds at the end (prompt and reply), for the next
    request's ``context``."""
    out: dict[str, Any] = {
        "model": model,
        "created_at": _now(),
        "response": "" if streamed else completion.reply,
        "done": True,
        "context": list(completion.context_tokens),
        **_counts(completion, total_ns),
    }
    if completion.thinking and not streamed:
        out["thinking"] = completion.thinking
    return out


def load_done(model: str, reason: Literal["load", "unload"], *, chat: bool) -> dict[str, Any]:
    """The answer to an empty prompt (or empty messages): the model was loaded,
    or unloaded (``keep_alive`` 0)."""
    out: dict[str, Any] = {"model": model, "created_at": _now(), "done": True}
    out["done_reason"] = reason
    if chat:
        out["message"] = {"role": "assistant", "content": ""}
    else:
        out["response"] = ""
    return out


def truncate_embedding(vector: Sequence[float], dimensions: int | None) -> list[float]:
    """``vector`` cut to its first ``dimensions`` and scaled back to unit
    length (as Ollama does; a vector already shorter is left as is)."""
    if dimensions is None or dimensions >= len(vector):
        return list(vector)
    cut = list(vector[:dimensions])
    norm = math.sqrt(sum(x * x for x in cut))
    return [x / norm for x in cut] if norm > 0 else cut


def embed_body(model: str, vectors: list[list[float]], total_ns: int) -> dict[str, Any]:
    return {"model": model, "embeddings": vectors, "total_duration": total_ns, "load_duration": 0}


# -- models -------------------------------------------------------------------------------


def _iso(wall: float | None) -> str:
    at = datetime.datetime.fromtimestamp(wall or 0.0, datetime.UTC)
    return at.isoformat().replace("+00:00", "Z")


def _details(meta: GGUFMeta | None = None) -> dict[str, Any]:
    # Listings leave family and sizes empty (reading every file's header per
    # listing is not worth it); /api/show reads them from the GGUF header.
    family = meta.family if meta is not None else ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": meta.parameter_size if meta is not None else "",
        "quantization_level": meta.quantization_level if meta is not None else "",
    }


def _entry(info: ModelInfo, size: int, digest: str, modified: float | None) -> dict[str, Any]:
    name = model_name(info.model_id)
    return {
        "name": name,
        "model": name,
        "modified_at": _iso(modified),
        "size": size,
        "digest": digest,
        "details": _details(),
    }


FileFacts = Mapping[str, tuple[int, str, float | None]]
"""Per model id: its file's size, a digest naming it, its mtime (the route stats the files)."""


def tags_body(models: Sequence[ModelInfo], files: FileFacts) -> dict[str, Any]:
    """``/api/tags``: every model llamad knows (configured or loaded)."""
    return {
        "models": [
            _entry(m, *files.get(m.model_id, (0, "", m.loaded_at)))
            for m in models
            if m.state is not ModelState.FAILED
        ]
    }


def ps_body(models: Sequence[ModelInfo], files: FileFacts, now: float) -> dict[str, Any]:
    """``/api/ps``: the models with a running worker. ``expires_at``: ``now``
    plus the model's ``keep_alive`` (the front counts it from the last
    request, so this is an upper bound), or far away without one."""
    out = []
    for m in models:
        if m.state not in (ModelState.READY, ModelState.LOADING):
            continue
        entry = _entry(m, *files.get(m.model_id, (0, "", m.loaded_at)))
        del entry["modified_at"]
        entry["expires_at"] = (
            _iso(now + m.keep_alive_s) if m.keep_alive_s is not None else "2318-01-01T00:00:00Z"
        )
        entry["size_vram"] = 0
        entry["context_length"] = m.n_ctx
        out.append(entry)
    return {"models": out}


def show_body(
    info: ModelInfo, size: int, modified: float | None, meta: GGUFMeta | None = None
) -> dict[str, Any]:
    """``/api/show``: what llamad knows of the model, and what its GGUF header
    says (``meta``; None: the file could not be read). ``model_info`` holds
    the header's scalar keys (the tokenizer's left out, as Ollama's arrays
    are), ``general.parameter_count`` and llamad's own keys."""
    parameters = f"num_ctx {info.n_ctx}" if info.n_ctx else ""
    header: dict[str, Any] = {}
    if meta is not None:
        header = {k: v for k, v in meta.values.items() if not k.startswith("tokenizer.")}
        header["general.parameter_count"] = meta.parameter_count
    return {
        "modelfile": f"FROM {info.path}\n" + (f"PARAMETER {parameters}\n" if parameters else ""),
        "parameters": parameters,
        "template": "",
        "details": _details(meta),
        "model_info": {
            "general.file_type": "gguf",
            **header,
            "llamad.path": info.path,
            "llamad.size": size,
            "llamad.context_length": info.n_ctx,
            "llamad.n_seq_max": info.n_seq_max,
            "llamad.state": info.state.value,
        },
        "capabilities": ["completion"],
        "modified_at": _iso(modified),
    }


def version_body(version: str) -> dict[str, Any]:
    """``/api/version``: llamad's own version (not an Ollama release)."""
    return {"version": version}


# -- errors -------------------------------------------------------------------------------


def error_body(message: str) -> dict[str, Any]:
    return {"error": message}


def error_for(error: LlamadError) -> tuple[int, dict[str, Any]]:
    """The status and body answering ``error``: Ollama's ``{"error": ...}``."""
    return status_of(error), error_body(error.message)


def render_error(status: int, code: str, message: str, param: str | None) -> Response:
    """An error in Ollama's shape (:data:`llamad.gateway.gate.ErrorRender`)."""
    return _json(error_body(message), status)


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status, media_type="application/json")


def _ndjson(lines: AsyncIterator[dict[str, Any] | None]) -> StreamingResponse:
    """``lines`` as NDJSON, a ``None`` ending a write (:func:`gathered`)."""

    async def encoded() -> AsyncIterator[bytes | None]:
        async for line in lines:
            yield None if line is None else msgspec.json.encode(line) + b"\n"

    # EventStream cancels the stream the moment the client leaves, even while
    # nothing is sent (text held as a possible tool call).
    return EventStream(gathered(encoded()), media_type="application/x-ndjson")


# -- routes ---------------------------------------------------------------------------------


def _file_facts(info: ModelInfo) -> tuple[int, str, float | None]:
    """The model file's size, a digest naming it (of its path, size and mtime:
    hashing gigabytes per listing is out of the question) and its mtime."""
    try:
        st = os.stat(info.path)
    except OSError:
        return 0, "", info.loaded_at
    name = f"{info.path}\0{st.st_size}\0{st.st_mtime_ns}".encode()
    return st.st_size, hashlib.sha256(name).hexdigest(), st.st_mtime


_HEADERS: dict[tuple[str, int, int], GGUFMeta | None] = {}
"""Each model file's header, by its path, size and mtime (read once per version of a file)."""


async def _header_of(path: str) -> GGUFMeta | None:
    """The GGUF header of ``path`` (None: unreadable or not GGUF), read in a
    thread: a vocabulary of tens of thousands of tokens takes tens of
    milliseconds to walk, which the streams on the loop must not wait for."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_size, st.st_mtime_ns)
    if key not in _HEADERS:

        def read() -> GGUFMeta | None:
            try:
                return read_gguf_meta(path)
            except (OSError, ValueError):
                return None

        if len(_HEADERS) >= _MAX_HEADERS:
            _HEADERS.clear()
        _HEADERS[key] = await asyncio.to_thread(read)
    return _HEADERS[key]


_MAX_HEADERS: Final = 64


def routes(gate: Gate) -> list[BaseRoute]:
    """The Ollama routes (``/api/...``), over ``gate``."""

    async def keep(request: Request, model: str, seconds: float | None, *, after: bool) -> None:
        """The request's ``keep_alive``: a duration before the request (the
        front counts idle time from the last request anyway, and a model set
        to 0 by an earlier request must not be unloaded under this one), 0
        once it has been answered."""
        if seconds is None or (seconds == 0) != after:
            return
        await gate.set_keep_alive(request, model, None if seconds == FOREVER else seconds)

    async def generation(
        request: Request,
        caller: Caller,
        call: ChatRequest | GenerateRequest,
        prompt: str | list[int] | None,
        *,
        messages: list[dict[str, Any]] | None,
        options: dict[str, Any],
    ) -> Response:
        model = model_id(call.model)
        ka = keep_alive_seconds(call.keep_alive)
        kwargs: dict[str, Any] = dict(options)
        if messages is not None:
            kwargs["messages"] = messages
        chat = isinstance(call, ChatRequest)
        tools = call.tools if isinstance(call, ChatRequest) else None
        started = time.monotonic_ns()
        await keep(request, model, ka, after=False)
        if not call.stream:
            result = await gate.complete(request, caller, model, prompt, **kwargs)
            await keep(request, model, ka, after=True)
            total = time.monotonic_ns() - started
            if chat:
                return _json(chat_done(result, call.model, total, streamed=False, tools=tools))
            return _json(generate_done(result, call.model, total, streamed=False))
        opened = await gate.stream(request, caller, model, prompt, **kwargs)

        async def lines() -> AsyncIterator[dict[str, Any] | None]:
            hold = CallHold() if tools else None
            event_calls: list[str] = []
            try:
                async for event in opened.events():
                    if isinstance(event, DoneEvent):
                        if tools and hold is not None:
                            text, calls = split_calls(hold.held(), event_calls, tools)
                            if text or calls:
                                yield chat_chunk(call.model, content=text, calls=calls)
                        await keep(request, model, ka, after=True)
                        total = time.monotonic_ns() - started
                        done = chat_done if chat else generate_done
                        yield done(event.result, call.model, total, streamed=True)
                    elif isinstance(event, ThinkingEvent):
                        if event.text:
                            yield (
                                chat_chunk(call.model, thinking=event.text)
                                if chat
                                else generate_chunk(call.model, thinking=event.text)
                            )
                    elif isinstance(event, ToolCallEvent) and hold is not None:
                        event_calls.append(event.text)  # read with the held text at the end
                    elif isinstance(event, TokenEvent | ToolCallEvent):
                        text = hold.feed(event.text) if hold is not None else event.text
                        if text:
                            yield (
                                chat_chunk(call.model, content=text)
                                if chat
                                else generate_chunk(call.model, response=text)
                            )
                    if not isinstance(event, DoneEvent) and not opened.ready():
                        yield None  # what is gathered leaves before the next event
            except LlamadError as exc:
                # The status line is sent: the error is the last line, which
                # Ollama's clients raise.
                yield error_body(exc.message)

        return _ndjson(lines())

    async def api_chat(request: Request) -> Response:
        caller = gate.caller(request)
        call = convert_body(await gate.json_body(request), ChatRequest)
        if not call.messages:
            # Ollama's way to load (or with keep_alive 0, unload) a model.
            return await load_only(request, call.model, call.keep_alive, chat=True)
        messages, options = call.call()
        return await generation(request, caller, call, None, messages=messages, options=options)

    async def api_generate(request: Request) -> Response:
        caller = gate.caller(request)
        call = convert_body(await gate.json_body(request), GenerateRequest)
        if call.loads_only:
            return await load_only(request, call.model, call.keep_alive, chat=False)
        messages, options = call.call()
        prompt: str | list[int] | None = None
        if messages is None:
            prompt = call.prompt
            if call.context:
                # The earlier answer's tokens go on as they are; the new text
                # follows them without a second BOS.
                tail = await gate.tokenize(model_id(call.model), call.prompt, add_special=False)
                prompt = [*call.context, *tail]
        return await generation(request, caller, call, prompt, messages=messages, options=options)

    async def load_only(
        request: Request, name: str, keep_alive: Duration, *, chat: bool
    ) -> Response:
        model = model_id(name)
        ka = keep_alive_seconds(keep_alive)
        if ka == 0:
            await keep(request, model, ka, after=True)
            return _json(load_done(name, "unload", chat=chat))
        await keep(request, model, ka, after=False)
        # Routing the model loads it (a tokenize is the cheapest routed call).
        await gate.tokenize(model, "")
        return _json(load_done(name, "load", chat=chat))

    async def api_embed(request: Request) -> Response:
        caller = gate.caller(request)
        call = convert_body(await gate.json_body(request), EmbedRequest)
        model = model_id(call.model)
        started = time.monotonic_ns()
        ka = keep_alive_seconds(call.keep_alive)
        await keep(request, model, ka, after=False)
        found = await gate.embed(request, caller, model, call.inputs())
        vectors = [truncate_embedding(v, call.dimensions) for v in found]
        await keep(request, model, ka, after=True)
        return _json(embed_body(call.model, vectors, time.monotonic_ns() - started))

    async def api_embeddings(request: Request) -> Response:
        caller = gate.caller(request)
        call = convert_body(await gate.json_body(request), EmbeddingsRequest)
        model = model_id(call.model)
        ka = keep_alive_seconds(call.keep_alive)
        await keep(request, model, ka, after=False)
        [vector] = await gate.embed(request, caller, model, [call.prompt])
        await keep(request, model, ka, after=True)
        return _json({"embedding": vector})

    async def api_tags(request: Request) -> Response:
        gate.caller(request)
        models = await gate.list_models(request)
        return _json(tags_body(models, {m.model_id: _file_facts(m) for m in models}))

    async def api_ps(request: Request) -> Response:
        gate.caller(request)
        models = await gate.list_models(request)
        facts = {m.model_id: _file_facts(m) for m in models}
        return _json(ps_body(models, facts, time.time()))

    async def api_show(request: Request) -> Response:
        gate.caller(request)
        call = convert_body(await gate.json_body(request), ShowRequest)
        wanted = model_id(call.target)
        for info in await gate.list_models(request):
            if info.model_id == wanted:
                size, _, modified = _file_facts(info)
                meta = await _header_of(info.path)
                return _json(show_body(info, size, modified, meta))
        raise ModelNotFound(f"model '{call.target}' not found", details={"model_id": wanted})

    async def api_version(request: Request) -> Response:
        gate.caller(request)
        return _json(version_body(LLAMAD_VERSION))

    def unsupported(path: str) -> Callable[[Request], Awaitable[Response]]:
        async def refuse(request: Request) -> Response:
            gate.caller(request)
            return render_error(501, "not_implemented", UNSUPPORTED[path], None)

        return refuse

    table: list[tuple[str, Callable[[Request], Awaitable[Response]], list[str]]] = [
        ("/api/chat", api_chat, ["POST"]),
        ("/api/generate", api_generate, ["POST"]),
        ("/api/embed", api_embed, ["POST"]),
        ("/api/embeddings", api_embeddings, ["POST"]),
        ("/api/tags", api_tags, ["GET"]),
        ("/api/ps", api_ps, ["GET"]),
        ("/api/show", api_show, ["POST"]),
        ("/api/version", api_version, ["GET"]),
    ]
    methods = {"/api/delete": ["DELETE"]}
    table += [(p, unsupported(p), methods.get(p, ["POST"])) for p in UNSUPPORTED]
    return [gate.route(path, endpoint, render_error, m) for path, endpoint, m in table]
