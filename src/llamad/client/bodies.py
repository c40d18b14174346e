"""The bodies client methods send, and the END of a stream read back (no I/O).

:class:`~llamad.client.sync.Client` and :class:`~llamad.client.aio.AsyncClient`
differ only in how they wait; both build their requests' bodies here (by
way of :mod:`llamad.client.asks`), so the two cannot drift apart. Request
bodies are the wire Structs of :mod:`llamad.model.wire` (worker ops) and
:mod:`llamad.front.wire` (front ops), built and validated in the caller's
process: a bad parameter raises :class:`~llamad.errors.BadRequest` naming
the field before anything is sent.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

import msgspec

from llamad.errors import BadRequest
from llamad.front.wire import EVICT_ALL, EvictBytes, LoadModel, ModelRef, SetKeepAlive
from llamad.model.requests import RequestParams
from llamad.model.wire import (
    AdapterInfo,
    AdapterRef,
    AdapterScaleBody,
    CancelBody,
    ChatBody,
    ChatOptions,
    DetokenizeBody,
    EmbedBody,
    ForkBody,
    InferBody,
    LoadAdapterBody,
    SessionBody,
    TokenizeBody,
)

__all__ = [
    "CHAT_FIELDS",
    "PARAM_FIELDS",
    "AdapterInfo",
    "Prompt",
    "adapter_body",
    "chat_body",
    "evict_body",
    "infer_body",
    "load_model_body",
    "model_ref",
    "new_request_id",
    "read_end",
    "session_body",
]

S = TypeVar("S")

Prompt = str | Sequence[int]
"""Text (tokenized by the worker, special tokens parsed) or token ids."""

PARAM_FIELDS: Final = frozenset(f.name for f in msgspec.structs.fields(RequestParams))
"""Keyword options that are :class:`~llamad.model.requests.RequestParams` fields."""
CHAT_FIELDS: Final = frozenset(f.name for f in msgspec.structs.fields(ChatOptions))
"""Keyword options that are :class:`~llamad.model.wire.ChatOptions` fields."""


class UnknownOption(TypeError):
    """A keyword option no request has: the program's typo, raised like
    Python's own "unexpected keyword argument" (nothing is sent)."""


def new_request_id() -> str:
    """A request id unique enough to name a request across connections."""
    return "r-" + os.urandom(12).hex()


def split_options(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``options`` as (request parameters, chat options); an unknown key is a TypeError.

    ``continue`` is a Python keyword: both ``continue_=True`` and
    ``**{"continue": True}`` set it.
    """
    params: dict[str, Any] = {}
    chat: dict[str, Any] = {}
    for key, value in options.items():
        if key in ("continue", "continue_"):
            params["continue"] = value  # the field's wire name
        elif key == "stop":
            # One stop string or several (a str is not a list of one-letter stops).
            params[key] = (value,) if isinstance(value, str) else value
        elif key in PARAM_FIELDS:
            params[key] = value
        elif key in CHAT_FIELDS:
            chat[key] = value
        else:
            raise UnknownOption(f"unknown request option {key!r}")
    stop = params.get("stop", ())
    if stop is None:
        del params["stop"]
    elif not isinstance(stop, tuple) and isinstance(stop, Iterable):
        params["stop"] = tuple(stop)
    return params, chat


def infer_body(
    prompt: Prompt | None,
    *,
    messages: Sequence[Mapping[str, Any]] | None,
    request_id: str,
    add_special: bool,
    chat: ChatOptions | Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> InferBody:
    """The body of ``infer`` / ``complete`` / ``prefill_only``."""
    params, chat_kw = split_options(options)
    if isinstance(chat, ChatOptions):
        chat_options = msgspec.structs.replace(chat, **chat_kw) if chat_kw else chat
    else:
        chat_options = _struct(ChatOptions, {**(chat or {}), **chat_kw}, "chat")
    if prompt is not None and not isinstance(prompt, str):
        prompt = _tokens(prompt, "prompt")
    return _struct(
        InferBody,
        {
            "prompt": prompt,
            "messages": None if messages is None else [dict(m) for m in messages],
            "params": _struct(RequestParams, params, "params"),
            "chat": chat_options,
            "request_id": request_id,
            "add_special": add_special,
            # Same-host workers count the request's queue_ms from here.
            "sent_at": time.monotonic(),
        },
        "",
    )


def tokenize_body(text: str, *, add_special: bool, parse_special: bool) -> TokenizeBody:
    return _struct(
        TokenizeBody,
        {"text": text, "add_special": add_special, "parse_special": parse_special},
        "",
    )


def detokenize_body(
    tokens: Sequence[int], *, remove_special: bool, unparse_special: bool
) -> DetokenizeBody:
    return _struct(
        DetokenizeBody,
        {
            "tokens": _tokens(tokens, "tokens"),
            "remove_special": remove_special,
            "unparse_special": unparse_special,
        },
        "",
    )


def chat_body(messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any]) -> ChatBody:
    return _struct(
        ChatBody,
        {"messages": [dict(m) for m in messages], "chat": _struct(ChatOptions, options, "chat")},
        "",
    )


def embed_body(text_or_tokens: Prompt, *, normalize: bool) -> EmbedBody:
    item = text_or_tokens if isinstance(text_or_tokens, str) else _tokens(text_or_tokens, "input")
    return _struct(EmbedBody, {"inputs": [item], "normalize": normalize}, "")


def session_body(session_id: str) -> SessionBody:
    return _struct(SessionBody, {"session_id": session_id}, "")


def fork_body(source_id: str, new_id: str) -> ForkBody:
    return _struct(ForkBody, {"source_id": source_id, "new_id": new_id}, "")


def cancel_body(request_id: str) -> CancelBody:
    return _struct(CancelBody, {"request_id": request_id}, "")


def adapter_body(
    path: str | os.PathLike[str], *, scale: float, name: str | None
) -> LoadAdapterBody:
    return _struct(LoadAdapterBody, {"path": os.fspath(path), "scale": scale, "name": name}, "")


def adapter_ref(name: str) -> AdapterRef:
    return _struct(AdapterRef, {"name": name}, "")


def adapter_scale_body(name: str, scale: float) -> AdapterScaleBody:
    return _struct(AdapterScaleBody, {"name": name, "scale": scale}, "")


def model_ref(model_id: str) -> ModelRef:
    return _struct(ModelRef, {"model_id": model_id}, "")


def keep_alive_body(model_id: str, seconds: float | None) -> SetKeepAlive:
    return _struct(SetKeepAlive, {"model_id": model_id, "keep_alive_s": seconds}, "")


def load_model_body(
    model_id: str, path: str | os.PathLike[str] | None, options: Mapping[str, Any]
) -> LoadModel:
    return _struct(
        LoadModel,
        {
            "model_id": model_id,
            "path": None if path is None else os.fspath(path),
            "options": dict(options),
        },
        "",
    )


def evict_body(n: int, tiers: Iterable[str] | None) -> EvictBytes:
    """Any int ``n >= 0``, clamped to :data:`~llamad.front.wire.EVICT_ALL`
    (``evict_bytes(sys.maxsize)`` means "all that can go")."""
    if isinstance(n, int) and not isinstance(n, bool) and n > EVICT_ALL:
        n = EVICT_ALL
    return _struct(
        EvictBytes, {"n": n, "tiers": None if tiers is None else [str(t) for t in tiers]}, ""
    )


def read_end(result: Any, typ: type[S]) -> S:
    """A stream's END body as ``typ``: the asyncio actors client keeps it
    undecoded (``msgspec.Raw``), the blocking one decodes it as msgpack gives it."""
    if isinstance(result, msgspec.Raw):
        return msgspec.msgpack.decode(result, type=typ)
    return msgspec.convert(result, typ)


def _tokens(tokens: Sequence[int], field: str) -> list[int]:
    if isinstance(tokens, bytes | bytearray | memoryview):
        # A bytes object is a sequence of ints, and was read as token ids.
        # Text must be given as str (decoded by the caller, who knows its
        # encoding), as surrogates are refused (llamad.actors.wire).
        raise BadRequest(
            f"{field}: bytes are neither text nor token ids: decode them to a str, "
            "or give the token ids as a list of ints",
            details={"field": field},
        )
    out = list(tokens)
    if set(map(type, out)) <= {int}:
        # Plain ints only (a bool's type is bool): the common case, in C. The
        # loop below, with its two isinstance per id, took ~0.1 ms of every
        # 2,048-token prompt's first token; it stays for the rest (int
        # subclasses pass, bools and others are named).
        return out
    for i, t in enumerate(out):
        if isinstance(t, bool) or not isinstance(t, int):
            raise BadRequest(
                f"{field}[{i}]: a token id must be an int, got {t!r}", details={"field": field}
            )
    return out


def _struct(cls: type[S], fields: Mapping[str, Any], where: str) -> S:
    """``cls`` built from ``fields`` with the wire's own validation (the
    worker decodes the same body with the same rules), so a refusal here is
    exactly the one the worker would answer, raised before sending."""
    try:
        return msgspec.convert(dict(fields), cls, from_attributes=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        _, _, at = message.rpartition("at `$.")
        field = at.rstrip("`").split("[")[0] if at else ""
        if where and field:
            field = f"{where}.{field}"
        raise BadRequest(message, details={"field": field or where}) from None
