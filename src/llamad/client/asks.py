"""Every request a public client method makes, as data (no I/O).

:class:`~llamad.client.sync.Client` and :class:`~llamad.client.aio.AsyncClient`
differ only in how they wait. Each of their methods builds its :class:`Ask`
here: the op, its body (built and validated by :mod:`llamad.client.bodies`),
where it goes (the daemon's front, or a model's worker), the type its answer
decodes to and what the method returns of that answer. The client's ``_run``
is the one place that sends it and waits.

Every builder is a door (:func:`_door`): a value its request cannot hold (a
number for a prompt, a list for a model id, a path that is not a path) is a
:class:`~llamad.errors.BadRequest` naming the method, as the daemon would
answer it, never a ``TypeError`` from deep inside the building. A keyword
option no request has stays a ``TypeError``
(:class:`~llamad.client.bodies.UnknownOption`), like Python's own.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final, Generic, ParamSpec, TypeVar

from llamad.client import bodies
from llamad.client.bodies import AdapterInfo, Prompt, UnknownOption
from llamad.errors import BadRequest, ModelNotFound
from llamad.front.wire import (
    DaemonStatus,
    GcReport,
    MetricsSnapshot,
    ModelInfo,
    ModelStatus,
    NoArgs,
)
from llamad.model.results import Completion
from llamad.model.wire import (
    CancelReply,
    ChatOptions,
    EmbedReply,
    ForkReply,
    TextReply,
    TokensReply,
)

__all__ = ["Ask"]

R = TypeVar("R")
P = ParamSpec("P")

_NO_ARGS: Final = NoArgs()


def _as_is(answer: Any) -> Any:
    return answer


def _nothing(answer: Any) -> None:
    return None


@dataclass(frozen=True, slots=True)
class Ask(Generic[R]):
    """One request of a public method: ``op`` with ``body``, to the worker of
    ``model_id`` (``None``: the front); its answer decoded as ``reply_type``
    and ``read`` into what the method returns."""

    op: str
    body: Any
    reply_type: Any = Any
    model_id: str | None = None
    read: Callable[[Any], R] = _as_is
    request_id: str | None = None
    """A generation's id, noted as running while it runs (for ``cancel``)."""
    forgets: str | None = None
    """The model whose cached route the answer makes stale (loaded, unloaded)."""


def _door(build: Callable[P, Ask[R]]) -> Callable[P, Ask[R]]:
    """``build``, with a value its request cannot hold refused as a BadRequest."""
    method = build.__name__

    @functools.wraps(build)
    def checked(*args: P.args, **kwargs: P.kwargs) -> Ask[R]:
        try:
            ask = build(*args, **kwargs)
        except UnknownOption:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise BadRequest(f"{method}: {exc}", details={"method": method}) from None
        if ask.model_id is not None and not isinstance(ask.model_id, str):
            got = type(ask.model_id).__name__
            raise BadRequest(
                f"{method}: model_id must be a str, got {got}", details={"method": method}
            )
        return ask

    return checked


# -- the front ----------------------------------------------------------------


@_door
def load_model(
    model_id: str, path: str | os.PathLike[str] | None, options: Mapping[str, Any]
) -> Ask[ModelInfo]:
    """A stream of ``LoadProgress`` events, then the model's info."""
    body = bodies.load_model_body(model_id, path, options)
    return Ask("load_model", body, ModelInfo, read=_model_info, forgets=model_id)


@_door
def unload(model_id: str) -> Ask[None]:
    return Ask("unload", bodies.model_ref(model_id), read=_nothing, forgets=model_id)


@_door
def list_models() -> Ask[list[ModelInfo]]:
    return Ask("list_models", _NO_ARGS, list[ModelInfo])


@_door
def model_info(model_id: str) -> Ask[ModelInfo]:
    return Ask("model_info", bodies.model_ref(model_id), ModelInfo)


@_door
def set_keep_alive(model_id: str, seconds: float | None) -> Ask[ModelInfo]:
    return Ask("set_keep_alive", bodies.keep_alive_body(model_id, seconds), ModelInfo)


@_door
def status(model_id: str | None) -> Ask[DaemonStatus | ModelStatus]:
    """The daemon's status, or the one model's of it."""
    return Ask("status", _NO_ARGS, DaemonStatus, read=partial(_model_status, model_id))


@_door
def counters() -> Ask[dict[str, int]]:
    return Ask("counters", _NO_ARGS, dict[str, int])


@_door
def metrics() -> Ask[MetricsSnapshot]:
    return Ask("metrics", _NO_ARGS, MetricsSnapshot)


@_door
def evict_bytes(n: int, tiers: Iterable[str] | None) -> Ask[int]:
    return Ask("evict_bytes", bodies.evict_body(n, tiers), int)


@_door
def gc() -> Ask[GcReport]:
    return Ask("gc", _NO_ARGS, GcReport)


def _model_status(model_id: str | None, daemon: DaemonStatus) -> DaemonStatus | ModelStatus:
    if model_id is None:
        return daemon
    for model in daemon.models:
        if model.info.model_id == model_id:
            return model
    raise ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})


# -- a model's worker -----------------------------------------------------------


@_door
def generation(  # noqa: PLR0917 - the public methods' own arguments, passed on in order
    op: str,
    model_id: str,
    prompt: Prompt | None,
    messages: Sequence[Mapping[str, Any]] | None,
    request_id: str | None,
    add_special: bool,
    chat: ChatOptions | Mapping[str, Any] | None,
    options: Mapping[str, Any],
) -> Ask[Completion]:
    """``complete``, ``prefill_only`` or ``infer`` (whose answer is a stream of
    events, then the :class:`Completion`); a new request id unless given."""
    rid = request_id or bodies.new_request_id()
    body = bodies.infer_body(
        prompt,
        messages=messages,
        request_id=rid,
        add_special=add_special,
        chat=chat,
        options=options,
    )
    return Ask(op, body, Completion, model_id, request_id=rid)


@_door
def cancel(model_id: str, request_id: str) -> Ask[bool]:
    return Ask("cancel", bodies.cancel_body(request_id), CancelReply, model_id, _cancelled)


@_door
def tokenize(model_id: str, text: str, add_special: bool, parse_special: bool) -> Ask[list[int]]:
    body = bodies.tokenize_body(text, add_special=add_special, parse_special=parse_special)
    return Ask("tokenize", body, TokensReply, model_id, _tokens)


@_door
def detokenize(
    model_id: str, tokens: Sequence[int], remove_special: bool, unparse_special: bool
) -> Ask[str]:
    body = bodies.detokenize_body(
        tokens, remove_special=remove_special, unparse_special=unparse_special
    )
    return Ask("detokenize", body, TextReply, model_id, _text)


@_door
def apply_chat_template(
    model_id: str, messages: Sequence[Mapping[str, Any]], options: Mapping[str, Any]
) -> Ask[list[int]]:
    body = bodies.chat_body(messages, options)
    return Ask("apply_chat_template", body, TokensReply, model_id, _tokens)


@_door
def embed(model_id: str, text_or_tokens: Prompt, normalize: bool) -> Ask[list[float]]:
    body = bodies.embed_body(text_or_tokens, normalize=normalize)
    return Ask("embed", body, EmbedReply, model_id, _first_embedding)


@_door
def load_adapter(
    model_id: str, path: str | os.PathLike[str], scale: float, name: str | None
) -> Ask[AdapterInfo]:
    body = bodies.adapter_body(path, scale=scale, name=name)
    return Ask("load_adapter", body, AdapterInfo, model_id)


@_door
def unload_adapter(model_id: str, name: str) -> Ask[None]:
    return Ask("unload_adapter", bodies.adapter_ref(name), Any, model_id, _nothing)


@_door
def set_adapter_scale(model_id: str, name: str, scale: float) -> Ask[AdapterInfo]:
    body = bodies.adapter_scale_body(name, scale)
    return Ask("set_adapter_scale", body, AdapterInfo, model_id)


@_door
def list_adapters(model_id: str) -> Ask[list[AdapterInfo]]:
    return Ask("list_adapters", _NO_ARGS, list[AdapterInfo], model_id)


@_door
def end_session(model_id: str, session_id: str) -> Ask[None]:
    return Ask("end_session", bodies.session_body(session_id), Any, model_id, _nothing)


@_door
def reset_session(model_id: str, session_id: str) -> Ask[None]:
    return Ask("reset_session", bodies.session_body(session_id), Any, model_id, _nothing)


@_door
def fork_session(model_id: str, source_id: str, new_id: str) -> Ask[bool]:
    body = bodies.fork_body(source_id, new_id)
    return Ask("fork_session", body, ForkReply, model_id, _copied)


def _model_info(result: Any) -> ModelInfo:
    return bodies.read_end(result, ModelInfo)


def _cancelled(reply: CancelReply) -> bool:
    return reply.cancelled


def _tokens(reply: TokensReply) -> list[int]:
    return reply.tokens


def _text(reply: TextReply) -> str:
    return reply.text


def _first_embedding(reply: EmbedReply) -> list[float]:
    return reply.embeddings[0]


def _copied(reply: ForkReply) -> bool:
    return reply.copied
