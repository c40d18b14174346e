"""The asyncio public client: ``from llamad import AsyncClient`` (SPEC D3).

The same methods as :class:`llamad.client.sync.Client`, as coroutines, and
``infer`` returning an :class:`~llamad.client.aio_stream.AsyncStream`.
It never blocks the event loop: it speaks the actors protocol on the loop
itself (:mod:`llamad.actors.aio_client`: the sockets' descriptors and the
actors' pidfds are registered with ``loop.add_reader``), with no thread per
request. Cancelling the task that awaits a call or consumes a stream cancels
the request on the worker. Routing, retries and errors behave exactly as in
the blocking client (see :mod:`llamad.client.sync`).

One ``AsyncClient`` serves any number of concurrent tasks of one event loop.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar, overload

import msgspec

from llamad import logs
from llamad.actors.aio_client import AsyncActorClient, AsyncStreamCall
from llamad.actors.curve import CurveClient
from llamad.actors.errors import ClientClosed
from llamad.client import bodies as ops
from llamad.client.aio_stream import AsyncStream
from llamad.client.bodies import AdapterInfo, Prompt
from llamad.client.routes import AsyncLinks
from llamad.client.sync import DEFAULT_CONNECT_TIMEOUT, DEFAULT_IDLE_TIMEOUT, DEFAULT_TIMEOUT
from llamad.config import client_curve, client_endpoint
from llamad.errors import ModelNotFound
from llamad.front.wire import DaemonStatus, GcReport, LoadProgress, ModelInfo, ModelStatus, NoArgs
from llamad.model.results import Completion, Event
from llamad.model.wire import (
    CancelReply,
    ChatOptions,
    EmbedReply,
    ForkReply,
    TextReply,
    TokensReply,
)

__all__ = ["AsyncClient"]

T = TypeVar("T")

_DEFAULT: Final[Any] = object()
_NO_ARGS: Final = NoArgs()


class AsyncClient:
    """An asyncio connection to the llamad daemon; arguments as :class:`~llamad.Client`."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        config: str | os.PathLike[str] | None = None,
        timeout: float | None = DEFAULT_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        name: str = "",
        curve: CurveClient | None = None,
    ) -> None:
        # A library user's program never sees llamad's debug lines unless it
        # configured logging itself (llamad/logs.py says how).
        logs.library_default()
        if endpoint is None:
            endpoint = client_endpoint(config)
        if curve is None and endpoint.startswith("tcp://"):
            curve = client_curve(config)
        self.endpoint = endpoint
        self.curve = curve
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self.name = name or f"llamad-async-client-{os.getpid()}"
        self._links = AsyncLinks(
            endpoint,
            timeout=timeout,
            connect_timeout=connect_timeout,
            name=self.name,
            curve=self.curve,
        )
        self._running: dict[str, str] = {}
        self._closed = False

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every socket (idempotent); open requests fail with ``ClientClosed``."""
        if self._closed:
            return
        self._closed = True
        self._links.close()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- models (the front) --------------------------------------------------

    async def load_model(
        self,
        model_id: str,
        path: str | os.PathLike[str] | None = None,
        *,
        progress: Callable[[float], None] | None = None,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> ModelInfo:
        """As :meth:`llamad.Client.load_model`."""
        body = ops.load_model_body(model_id, path, options)
        call = await self._usable().front.stream(
            "load_model", body, timeout=self._t(timeout), event_type=LoadProgress
        )
        async for event in call:
            if progress is not None:
                progress(event.fraction)
        self._forget_route(model_id)
        assert call.result is not None
        return msgspec.msgpack.decode(call.result, type=ModelInfo)

    async def unload(self, model_id: str, *, timeout: float | None = _DEFAULT) -> None:
        await self._front_call("unload", ops.model_ref(model_id), None, timeout)
        self._forget_route(model_id)

    async def list_models(self, *, timeout: float | None = _DEFAULT) -> list[ModelInfo]:
        result: list[ModelInfo] = await self._front_call(
            "list_models", _NO_ARGS, list[ModelInfo], timeout
        )
        return result

    async def model_info(self, model_id: str, *, timeout: float | None = _DEFAULT) -> ModelInfo:
        result: ModelInfo = await self._front_call(
            "model_info", ops.model_ref(model_id), ModelInfo, timeout
        )
        return result

    @overload
    async def status(
        self, model_id: None = None, *, timeout: float | None = ...
    ) -> DaemonStatus: ...
    @overload
    async def status(self, model_id: str, *, timeout: float | None = ...) -> ModelStatus: ...
    async def status(
        self, model_id: str | None = None, *, timeout: float | None = _DEFAULT
    ) -> DaemonStatus | ModelStatus:
        daemon: DaemonStatus = await self._front_call("status", _NO_ARGS, DaemonStatus, timeout)
        if model_id is None:
            return daemon
        for model in daemon.models:
            if model.info.model_id == model_id:
                return model
        raise ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})

    async def counters(self, *, timeout: float | None = _DEFAULT) -> dict[str, int]:
        result: dict[str, int] = await self._front_call(
            "counters", _NO_ARGS, dict[str, int], timeout
        )
        return result

    async def evict_bytes(
        self, n: int, tiers: Iterable[str] | None = None, *, timeout: float | None = _DEFAULT
    ) -> int:
        result: int = await self._front_call("evict_bytes", ops.evict_body(n, tiers), int, timeout)
        return result

    async def gc(self, *, timeout: float | None = _DEFAULT) -> GcReport:
        result: GcReport = await self._front_call("gc", _NO_ARGS, GcReport, timeout)
        return result

    # -- requests (the worker) -----------------------------------------------

    async def complete(
        self,
        model_id: str,
        prompt: Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        chat: ChatOptions | Mapping[str, Any] | None = None,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> Completion:
        """As :meth:`llamad.Client.complete`; cancelling the task cancels the request."""
        return await self._generate(
            "complete",
            model_id=model_id,
            prompt=prompt,
            messages=messages,
            request_id=request_id,
            add_special=add_special,
            chat=chat,
            timeout=timeout,
            options=options,
        )

    async def prefill_only(
        self,
        model_id: str,
        prompt: Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        chat: ChatOptions | Mapping[str, Any] | None = None,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> Completion:
        return await self._generate(
            "prefill_only",
            model_id=model_id,
            prompt=prompt,
            messages=messages,
            request_id=request_id,
            add_special=add_special,
            chat=chat,
            timeout=timeout,
            options=options,
        )

    async def infer(
        self,
        model_id: str,
        prompt: Prompt | None = None,
        *,
        messages: Sequence[Mapping[str, Any]] | None = None,
        request_id: str | None = None,
        add_special: bool = True,
        chat: ChatOptions | Mapping[str, Any] | None = None,
        timeout: float | None = _DEFAULT,
        idle_timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> AsyncStream:
        """Start generating; ``async for`` the :class:`AsyncStream`'s events."""
        rid = request_id or ops.new_request_id()
        body = ops.infer_body(
            prompt,
            messages=messages,
            request_id=rid,
            add_special=add_special,
            chat=chat,
            options=options,
        )
        first = self._t(timeout)
        idle = self.idle_timeout if idle_timeout is _DEFAULT else idle_timeout

        async def send(a: AsyncActorClient) -> AsyncStreamCall:
            return await a.stream("infer", body, timeout=first, event_type=Event)

        call = await self._on_worker(model_id, send)
        self._running[rid] = model_id
        return AsyncStream(
            call,
            model_id=model_id,
            request_id=rid,
            idle_timeout=idle,
            cancel=self._cancel_on,
            on_end=self._ended,
        )

    async def cancel(
        self, request_id: str, *, model_id: str | None = None, timeout: float | None = _DEFAULT
    ) -> bool:
        """As :meth:`llamad.Client.cancel`."""
        model = model_id or self._running.get(request_id)
        if model is None:
            return False
        return await self._cancel_on(request_id, model, timeout)

    async def tokenize(
        self,
        model_id: str,
        text: str,
        *,
        add_special: bool = True,
        parse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[int]:
        body = ops.tokenize_body(text, add_special=add_special, parse_special=parse_special)
        reply: TokensReply = await self._worker_call(
            model_id, "tokenize", body, TokensReply, timeout
        )
        return reply.tokens

    async def detokenize(
        self,
        model_id: str,
        tokens: Sequence[int],
        *,
        remove_special: bool = False,
        unparse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> str:
        body = ops.detokenize_body(
            tokens, remove_special=remove_special, unparse_special=unparse_special
        )
        reply: TextReply = await self._worker_call(model_id, "detokenize", body, TextReply, timeout)
        return reply.text

    async def apply_chat_template(
        self,
        model_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> list[int]:
        body = ops.chat_body(messages, options)
        reply: TokensReply = await self._worker_call(
            model_id, "apply_chat_template", body, TokensReply, timeout
        )
        return reply.tokens

    async def embed(
        self,
        model_id: str,
        text_or_tokens: Prompt,
        *,
        normalize: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[float]:
        body = ops.embed_body(text_or_tokens, normalize=normalize)
        reply: EmbedReply = await self._worker_call(model_id, "embed", body, EmbedReply, timeout)
        return reply.embeddings[0]

    async def load_adapter(
        self,
        model_id: str,
        path: str | os.PathLike[str],
        *,
        scale: float = 1.0,
        name: str | None = None,
        timeout: float | None = _DEFAULT,
    ) -> AdapterInfo:
        body = ops.adapter_body(path, scale=scale, name=name)
        result: AdapterInfo = await self._worker_call(
            model_id, "load_adapter", body, AdapterInfo, timeout
        )
        return result

    async def unload_adapter(
        self, model_id: str, name: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        await self._worker_call(model_id, "unload_adapter", ops.adapter_ref(name), None, timeout)

    async def set_adapter_scale(
        self, model_id: str, name: str, scale: float, *, timeout: float | None = _DEFAULT
    ) -> AdapterInfo:
        body = ops.adapter_scale_body(name, scale)
        result: AdapterInfo = await self._worker_call(
            model_id, "set_adapter_scale", body, AdapterInfo, timeout
        )
        return result

    async def list_adapters(
        self, model_id: str, *, timeout: float | None = _DEFAULT
    ) -> list[AdapterInfo]:
        result: list[AdapterInfo] = await self._worker_call(
            model_id, "list_adapters", _NO_ARGS, list[AdapterInfo], timeout
        )
        return result

    async def end_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        await self._worker_call(
            model_id, "end_session", ops.session_body(session_id), None, timeout
        )

    async def reset_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        await self._worker_call(
            model_id, "reset_session", ops.session_body(session_id), None, timeout
        )

    async def fork_session(
        self, model_id: str, source_id: str, new_id: str, *, timeout: float | None = _DEFAULT
    ) -> bool:
        body = ops.fork_body(source_id, new_id)
        reply: ForkReply = await self._worker_call(
            model_id, "fork_session", body, ForkReply, timeout
        )
        return reply.copied

    # -- internals -----------------------------------------------------------

    def _t(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is _DEFAULT else timeout

    def _usable(self) -> AsyncLinks:
        if self._closed:
            raise ClientClosed("the llamad client is closed")
        return self._links

    async def _front_call(self, op: str, body: Any, reply_type: Any, timeout: float | None) -> Any:
        return await self._usable().front_call(op, body, reply_type, self._t(timeout))

    def _forget_route(self, model_id: str) -> None:
        self._links.forget(model_id)

    async def _on_worker(
        self, model_id: str, send: Callable[[AsyncActorClient], Awaitable[T]]
    ) -> T:
        return await self._usable().on_worker(model_id, send)

    async def _worker_call(
        self, model_id: str, op: str, body: Any, reply_type: Any, timeout: float | None
    ) -> Any:
        limit = self._t(timeout)
        rtype = Any if reply_type is None else reply_type

        async def send(a: AsyncActorClient) -> Any:
            return await a.call(op, body, timeout=limit, reply_type=rtype)

        return await self._on_worker(model_id, send)

    async def _generate(
        self,
        op: str,
        *,
        model_id: str,
        prompt: Prompt | None,
        messages: Sequence[Mapping[str, Any]] | None,
        request_id: str | None,
        add_special: bool,
        chat: ChatOptions | Mapping[str, Any] | None,
        timeout: float | None,
        options: Mapping[str, Any],
    ) -> Completion:
        rid = request_id or ops.new_request_id()
        body = ops.infer_body(
            prompt,
            messages=messages,
            request_id=rid,
            add_special=add_special,
            chat=chat,
            options=options,
        )
        self._running[rid] = model_id
        try:
            result: Completion = await self._worker_call(model_id, op, body, Completion, timeout)
        finally:
            self._ended(rid)
        return result

    async def _cancel_on(
        self, request_id: str, model_id: str, timeout: float | None = _DEFAULT
    ) -> bool:
        reply: CancelReply = await self._worker_call(
            model_id, "cancel", ops.cancel_body(request_id), CancelReply, timeout
        )
        return reply.cancelled

    def _ended(self, request_id: str) -> None:
        self._running.pop(request_id, None)
