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
from functools import partial
from typing import Any, Final, TypeVar, cast, overload

from llamad.actors.aio_client import AsyncActorClient, AsyncStreamCall
from llamad.actors.curve import CurveClient
from llamad.actors.errors import ClientClosed
from llamad.client import asks
from llamad.client.aio_stream import AsyncStream
from llamad.client.asks import Ask
from llamad.client.base import (
    DEFAULT,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_IDLE_TIMEOUT,
    DEFAULT_TIMEOUT,
    STATUS_TIMEOUT,
    ClientBase,
    combined,
)
from llamad.client.bodies import AdapterInfo, Prompt
from llamad.client.router import Spread, spread
from llamad.client.routes import AsyncLinks
from llamad.errors import LlamadError, Unavailable
from llamad.front.wire import (
    DaemonStatus,
    GcReport,
    LoadProgress,
    MetricsSnapshot,
    ModelInfo,
    ModelStatus,
    NoArgs,
)
from llamad.model.results import Completion, Event
from llamad.model.wire import ChatOptions

__all__ = ["AsyncClient"]

R = TypeVar("R")
T = TypeVar("T")

NO_ARGS: Final = NoArgs()

_DEFAULT: Final[Any] = DEFAULT


class AsyncClient(ClientBase):
    """An asyncio connection to the llamad daemon; arguments as :class:`~llamad.Client`."""

    _default_name = "llamad-async-client"

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
        endpoints: Sequence[str] | None = None,
    ) -> None:
        super().__init__(
            endpoint, config, timeout, connect_timeout, idle_timeout, name, curve, endpoints
        )
        self._links_by = {
            e: AsyncLinks(
                e,
                timeout=timeout,
                connect_timeout=connect_timeout,
                name=self.name,
                curve=self.curve,
                wait_front=self._router is None,
            )
            for e in self.endpoints
        }
        self._links = self._links_by[self.endpoint]

    # -- lifecycle -----------------------------------------------------------

    def close(self) -> None:
        """Close every socket (idempotent); open requests fail with ``ClientClosed``."""
        if self._closed:
            return
        self._closed = True
        if self._affinity is not None:
            self._affinity.close()
        for links in self._links_by.values():
            links.close()

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
        ask = asks.load_model(model_id, path, options)

        async def load_at(endpoint: str) -> Any:
            call = await self._usable(endpoint).front.stream(
                ask.op, ask.body, timeout=self._t(timeout), event_type=LoadProgress
            )
            async for event in call:
                if progress is not None:
                    progress(event.fraction)
            return call.result

        if self._router is None:
            return self._answered(ask, await load_at(self.endpoint))
        return self._answered(ask, await self._spread(ask, load_at))

    async def unload(self, model_id: str, *, timeout: float | None = _DEFAULT) -> None:
        return await self._run(asks.unload(model_id), timeout)

    async def list_models(self, *, timeout: float | None = _DEFAULT) -> list[ModelInfo]:
        return await self._run(asks.list_models(), timeout)

    async def model_info(self, model_id: str, *, timeout: float | None = _DEFAULT) -> ModelInfo:
        return await self._run(asks.model_info(model_id), timeout)

    async def set_keep_alive(
        self, model_id: str, seconds: float | None, *, timeout: float | None = _DEFAULT
    ) -> ModelInfo:
        return await self._run(asks.set_keep_alive(model_id, seconds), timeout)

    @overload
    async def status(
        self, model_id: None = None, *, timeout: float | None = ...
    ) -> DaemonStatus: ...
    @overload
    async def status(self, model_id: str, *, timeout: float | None = ...) -> ModelStatus: ...
    async def status(
        self, model_id: str | None = None, *, timeout: float | None = _DEFAULT
    ) -> DaemonStatus | ModelStatus:
        return await self._run(asks.status(model_id), timeout)

    async def counters(self, *, timeout: float | None = _DEFAULT) -> dict[str, int]:
        return await self._run(asks.counters(), timeout)

    async def metrics(self, *, timeout: float | None = _DEFAULT) -> MetricsSnapshot:
        return await self._run(asks.metrics(), timeout)

    async def evict_bytes(
        self, n: int, tiers: Iterable[str] | None = None, *, timeout: float | None = _DEFAULT
    ) -> int:
        return await self._run(asks.evict_bytes(n, tiers), timeout)

    async def gc(self, *, timeout: float | None = _DEFAULT) -> GcReport:
        return await self._run(asks.gc(), timeout)

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
        return await self._run(
            asks.generation(
                "complete", model_id, prompt, messages, request_id, add_special, chat, options
            ),
            timeout,
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
        return await self._run(
            asks.generation(
                "prefill_only", model_id, prompt, messages, request_id, add_special, chat, options
            ),
            timeout,
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
        return await self._stream(
            model_id,
            asks.generation(
                "infer", model_id, prompt, messages, request_id, add_special, chat, options
            ),
            timeout,
            idle_timeout,
        )

    async def cancel(
        self, request_id: str, *, model_id: str | None = None, timeout: float | None = _DEFAULT
    ) -> bool:
        """As :meth:`llamad.Client.cancel`."""
        ask = self._cancel_ask(request_id, model_id)
        return False if ask is None else await self._run(ask, timeout)

    async def tokenize(
        self,
        model_id: str,
        text: str,
        *,
        add_special: bool = True,
        parse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[int]:
        return await self._run(asks.tokenize(model_id, text, add_special, parse_special), timeout)

    async def detokenize(
        self,
        model_id: str,
        tokens: Sequence[int],
        *,
        remove_special: bool = False,
        unparse_special: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> str:
        return await self._run(
            asks.detokenize(model_id, tokens, remove_special, unparse_special), timeout
        )

    async def apply_chat_template(
        self,
        model_id: str,
        messages: Sequence[Mapping[str, Any]],
        *,
        timeout: float | None = _DEFAULT,
        **options: Any,
    ) -> list[int]:
        return await self._run(asks.apply_chat_template(model_id, messages, options), timeout)

    async def embed(
        self,
        model_id: str,
        text_or_tokens: Prompt,
        *,
        normalize: bool = True,
        timeout: float | None = _DEFAULT,
    ) -> list[float]:
        return await self._run(asks.embed(model_id, text_or_tokens, normalize), timeout)

    async def load_adapter(
        self,
        model_id: str,
        path: str | os.PathLike[str],
        *,
        scale: float = 1.0,
        name: str | None = None,
        timeout: float | None = _DEFAULT,
    ) -> AdapterInfo:
        return await self._run(asks.load_adapter(model_id, path, scale, name), timeout)

    async def unload_adapter(
        self, model_id: str, name: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        return await self._run(asks.unload_adapter(model_id, name), timeout)

    async def set_adapter_scale(
        self, model_id: str, name: str, scale: float, *, timeout: float | None = _DEFAULT
    ) -> AdapterInfo:
        return await self._run(asks.set_adapter_scale(model_id, name, scale), timeout)

    async def list_adapters(
        self, model_id: str, *, timeout: float | None = _DEFAULT
    ) -> list[AdapterInfo]:
        return await self._run(asks.list_adapters(model_id), timeout)

    async def end_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        return await self._run(asks.end_session(model_id, session_id), timeout)

    async def reset_session(
        self, model_id: str, session_id: str, *, timeout: float | None = _DEFAULT
    ) -> None:
        return await self._run(asks.reset_session(model_id, session_id), timeout)

    async def fork_session(
        self, model_id: str, source_id: str, new_id: str, *, timeout: float | None = _DEFAULT
    ) -> bool:
        return await self._run(asks.fork_session(model_id, source_id, new_id), timeout)

    # -- internals: the I/O --------------------------------------------------

    async def _run(self, ask: Ask[R], timeout: float | None) -> R:
        """Send ``ask`` (by the retry rule of :mod:`~llamad.client.routes`; to
        several daemons by :mod:`~llamad.client.router`'s) and wait for its
        answer; cancelling the task cancels it on the worker."""
        limit = self._started(ask, timeout)
        try:
            if self._router is None:
                answer = await self._run_at(self.endpoint, ask, limit)
            else:
                answer = await self._spread(ask, lambda e: self._run_at(e, ask, limit))
        finally:
            self._finished(ask)
        return self._answered(ask, answer)

    async def _run_at(self, endpoint: str, ask: Ask[R], limit: float | None) -> Any:
        links = self._usable(endpoint)
        if ask.model_id is None:
            return await links.front_call(ask.op, ask.body, ask.reply_type, limit)

        async def send(a: AsyncActorClient) -> Any:
            return await a.call(ask.op, ask.body, timeout=limit, reply_type=ask.reply_type)

        return await links.on_worker(ask.model_id, send)

    async def _stream(
        self, model_id: str, ask: Ask[Completion], timeout: float | None, idle: float | None
    ) -> AsyncStream:
        """Open the stream of generation ``ask`` (by the retry rule; on one of
        several daemons by the router's)."""
        first = self._t(timeout)

        async def send(a: AsyncActorClient) -> AsyncStreamCall:
            return await a.stream(ask.op, ask.body, timeout=first, event_type=Event)

        async def open_at(endpoint: str) -> tuple[str, AsyncStreamCall]:
            return endpoint, await self._usable(endpoint).on_worker(model_id, send)

        if self._router is None:
            endpoint, call = await open_at(self.endpoint)
            return AsyncStream(
                call,
                model_id=model_id,
                request_id=self._stream_started(ask),
                idle_timeout=self._idle(idle),
                cancel=self._cancel_stream,
                on_end=self._ended,
                endpoint=endpoint,
            )
        endpoint, call = await self._spread(ask, open_at, held=True)
        request_id = self._stream_started(ask)
        return AsyncStream(
            call,
            model_id=model_id,
            request_id=request_id,
            idle_timeout=self._idle(idle),
            cancel=self._cancel_stream,
            on_end=self._routed_end,
            on_error=partial(self._stream_failed, request_id),
            endpoint=endpoint,
            reopen=partial(self._reopen, ask, open_at),
        )

    async def _reopen(
        self,
        ask: Ask[Completion],
        open_at: Callable[[str], Awaitable[tuple[str, AsyncStreamCall]]],
        error: LlamadError,
    ) -> tuple[str, AsyncStreamCall] | None:
        """As :meth:`llamad.Client._reopen`."""
        endpoint = self._dead_under(ask, error)
        if endpoint is None or not await self._gone(endpoint):
            return None
        self._lost(ask, endpoint)
        try:
            return await self._spread(ask, open_at, held=True)
        except LlamadError:
            return None

    async def _gone(self, endpoint: str) -> bool:
        """As :meth:`llamad.Client._gone`."""
        try:
            await self._usable(endpoint).front_call(
                "status", NO_ARGS, DaemonStatus, STATUS_TIMEOUT, wait=False
            )
        except Unavailable:
            return True
        except LlamadError:
            return False
        return False

    async def _spread(
        self, ask: Ask[Any], attempt: Callable[[str], Awaitable[T]], *, held: bool = False
    ) -> T:
        """As :meth:`llamad.Client._spread`."""
        prefix = None
        if spread(ask.op) is Spread.ANY:
            await self._read_loads()
            tokens, key, get = self._prompt_plan(ask)
            if get is not None:
                tokens = await self._tokens_for(get)
            prefix = self._prefix(ask, tokens, key)
        targets = self._targets(ask, prefix)
        if self._everywhere(ask, targets):
            return await self._everyone(ask, targets, attempt)
        error: LlamadError | None = None
        for endpoint in targets:
            self._sent_to(ask, endpoint)
            opened = False
            try:
                answer = await attempt(endpoint)
                opened = held
            except LlamadError as exc:
                if not self._goes_on(ask, endpoint, exc) and not (
                    self._died_with(ask, exc) and await self._gone(endpoint)
                ):
                    raise
                error = exc
                continue
            finally:
                if not opened:
                    self._done_at(endpoint, ask.request_id)
            self._took(ask, endpoint)
            return answer
        assert error is not None
        raise error

    async def _everyone(
        self, ask: Ask[Any], targets: Sequence[str], attempt: Callable[[str], Awaitable[T]]
    ) -> T:
        answers: list[T] = []
        errors: list[LlamadError] = []
        for endpoint in targets:
            try:
                answers.append(await attempt(endpoint))
            except LlamadError as exc:
                self._goes_on(ask, endpoint, exc)
                errors.append(exc)
            else:
                self._took(ask, endpoint)
        if errors:
            raise errors[0]
        return cast("T", combined(ask, answers))

    async def _tokens_for(self, get: Ask[list[int]]) -> list[int] | None:
        """The prompt's token ids from the daemon the load alone would pick
        (one more round trip; ``None`` when it fails: route by load)."""
        assert get.model_id is not None
        endpoint = self.router.order(get.model_id)[0]
        try:
            return get.read(await self._run_at(endpoint, get, STATUS_TIMEOUT))
        except LlamadError:
            return None

    async def _read_loads(self) -> None:
        """Read the status (the load) of each daemon whose last read is stale."""
        for endpoint in self.router.stale():
            try:
                status = await self._usable(endpoint).front_call(
                    "status", NO_ARGS, DaemonStatus, STATUS_TIMEOUT, wait=False
                )
            except LlamadError:
                self.router.failed(endpoint)
            else:
                self._loaded(endpoint, status)

    def _usable(self, endpoint: str | None = None) -> AsyncLinks:
        if self._closed:
            raise ClientClosed("the llamad client is closed")
        return self._links_by[endpoint or self.endpoint]

    def _forget_route(self, model_id: str) -> None:
        for links in self._links_by.values():
            links.forget(model_id)

    async def _cancel_stream(self, request_id: str, model_id: str) -> bool:
        return await self.cancel(request_id, model_id=model_id)
