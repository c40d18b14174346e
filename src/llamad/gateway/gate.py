"""Every HTTP request's one way into the daemon, whatever its protocol.

A protocol module (:mod:`llamad.gateway.openai`, and the Anthropic, Ollama
ones beside it) translates; it never calls the client itself. It asks the
:class:`Gate`, which for every request:

- **admits** the caller (:meth:`Gate.caller`): with ``[http.keys]`` set, a key
  in ``Authorization: Bearer`` or ``x-api-key``, matched by its SHA-256;
  without keys, anyone who reaches the (loopback) socket;
- reads the **body** within ``max_body_bytes`` (:meth:`Gate.json_body`);
- gives a tenant's requests their **cache salt** (:meth:`Gate.salt`, applied
  by :meth:`Gate.complete` and :meth:`Gate.stream` to whatever ``cache_salt``
  the request asked for), so one tenant's prompts are never a hit for another;
- counts its **running requests per key** (``max_streams_per_key``);
- bounds it by the **timeouts** (``request_timeout_s`` to the first token,
  ``idle_timeout_s`` between tokens);
- **cancels** it when the HTTP client goes away: a call is raced against the
  connection's ``http.disconnect`` and cancelled the moment it comes (the
  client sends CANCEL to the worker); a stream is cancelled by its response
  (the SSE response watches the same message).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec
import structlog
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route
from starlette.types import Receive, Scope, Send

from llamad.errors import LlamadError
from llamad.gateway.errors import HttpError, param_of, status_of
from llamad.gateway.sse import wait_disconnect
from llamad.model.results import Completion, DoneEvent, Event

if TYPE_CHECKING:
    from llamad.client.aio import AsyncClient
    from llamad.client.aio_stream import AsyncStream
    from llamad.config.sections import HttpSection
    from llamad.front.wire import MetricsSnapshot, ModelInfo

__all__ = [
    "Caller",
    "ClientGone",
    "ErrorRender",
    "Gate",
    "Guarded",
    "OpenStream",
]

log = structlog.get_logger("llamad.gateway")

T = TypeVar("T")

TENANT_SALT_PREFIX = "t/"
"""A tenant's cache salt is ``t/<tenant>`` (``t/<tenant>/<salt>`` with a salt of
the request's own); a request of no tenant that asks for a salt gets ``u/<salt>``,
so it can never name a tenant's namespace."""
CALLER_SALT_PREFIX = "u/"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who sent a request: ``key`` names the API key (``""`` without keys),
    the bucket its running requests count in; ``tenant``: its cache namespace."""

    key: str
    tenant: str | None = None


class ClientGone(Exception):
    """The HTTP client disconnected; its request was cancelled."""


ErrorRender = Callable[[int, str, str, "str | None"], Response]
"""A protocol's error shape: ``(status, code, message, param) -> Response``."""

Endpoint = Callable[[Request], Awaitable[Response]]


class Guarded:
    """``endpoint`` as a plain ASGI app, every refusal rendered in its
    protocol's shape and the status of :mod:`llamad.gateway.errors`.

    A starlette ``Route`` takes it as is (it is no function): no
    ``request_response`` around it, so none of starlette's exception wrapper
    and its ``send`` relay, which every body chunk of a stream went through
    (this catches every exception itself; ``docs/internals/gateway.md``)."""

    __slots__ = ("endpoint", "render")

    def __init__(self, render: ErrorRender, endpoint: Endpoint) -> None:
        self.render = render
        self.endpoint = endpoint

    async def run(self, request: Request) -> Response:
        try:
            return await self.endpoint(request)
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the socket is gone
        except (LlamadError, HttpError) as exc:
            return self.render(status_of(exc), exc.code, exc.message, param_of(exc))
        except Exception:
            log.exception("gateway.internal_error", path=request.url.path)
            message = "internal error (the gateway's log says more)"
            return self.render(500, "internal", message, None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = await self.run(Request(scope, receive, send))
        await response(scope, receive, send)


def key_digest(key: str) -> str:
    """How a key is stored: its SHA-256 in hex (``[http.keys.<name>] sha256``)."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(slots=True)
class OpenStream:
    """A stream that produced its first event, or (``pending``) whose first
    event is late: the response iterates :meth:`events` (the first one, then
    the rest) and the request's slot is given back when the iteration ends,
    however it ends. ``keepalive_s``: the response pings every so often
    (:class:`~llamad.gateway.sse.EventStream`'s ``ping_s``), None: never."""

    first: Event | None
    rest: AsyncIterator[Event] | None
    _release: Callable[[], None]
    _close: Callable[[], Awaitable[None]]
    pending: asyncio.Future[tuple[AsyncIterator[Event], Event]] | None = None
    keepalive_s: float | None = None
    _buffered: Callable[[], int] | None = None
    _gave_first: bool = False

    def ready(self) -> bool:
        """Whether :meth:`events`' next event is here already (taking it does
        not wait): a protocol gathers the chunks of the events that are into
        one write, and writes what it has before one that is not."""
        if not self._gave_first:
            return self.pending is None or self.pending.done()
        return self._buffered is not None and self._buffered() > 0

    async def events(self) -> AsyncIterator[Event]:
        try:
            if self.pending is not None:
                # Its refusal, if any, comes inside the stream now (the status
                # is sent): the protocol's guard renders it as an error event.
                self.rest, self.first = await self.pending
            assert self.first is not None and self.rest is not None
            self._gave_first = True
            yield self.first
            if not isinstance(self.first, DoneEvent):
                async for event in self.rest:
                    yield event
        finally:
            # Left early (the client went away: the response cancelled this
            # generator) or done: closing an unfinished stream cancels it on
            # the worker.
            if self.pending is not None and not self.pending.done():
                self.pending.cancel()
                with suppress(BaseException):
                    await self.pending
            self._release()
            await self._close()


class Gate:
    """See the module doc. ``client``: the daemon's :class:`~llamad.AsyncClient`."""

    def __init__(self, http: HttpSection, client: AsyncClient, *, state_dir: str = "") -> None:
        self.http = http
        self.client = client
        self.state_dir = state_dir
        """The daemon's state directory (stored responses; ``""``: none kept)."""
        self._keys = {k.sha256.lower(): Caller(name, k.tenant) for name, k in http.keys.items()}
        self._running: dict[str, int] = {}

    # -- routes -----------------------------------------------------------------------

    def route(
        self, path: str, endpoint: Endpoint, render: ErrorRender, methods: Sequence[str]
    ) -> BaseRoute:
        """A starlette route whose refusals ``render`` shapes."""
        return Route(path, Guarded(render, endpoint), methods=list(methods))

    # -- who, and what they sent ----------------------------------------------------

    def caller(self, request: Request) -> Caller:
        """The request's caller, or ``invalid_api_key`` (401) when keys are set
        and it carries none of them."""
        if not self._keys:
            return Caller("")
        key = request.headers.get("x-api-key")
        auth = request.headers.get("authorization", "")
        if key is None and auth[:7].lower() == "bearer ":
            key = auth[7:].strip()
        found = None if not key else self._keys.get(key_digest(key))
        if found is None:
            raise HttpError(
                "invalid_api_key",
                "a valid API key is required (Authorization: Bearer KEY, or x-api-key: KEY)",
            )
        return found

    async def json_body(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object, read within ``max_body_bytes``."""
        limit = self.http.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        try:
            body = msgspec.json.decode(b"".join(chunks))
        except msgspec.DecodeError as exc:
            raise HttpError("bad_request", f"the body is not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise HttpError("bad_request", "the body must be a JSON object")
        return body

    def salt(self, caller: Caller, requested: object = None) -> str | None:
        """The cache salt of a request of ``caller`` that asked for ``requested``."""
        if requested is not None and not isinstance(requested, str):
            raise HttpError("bad_request", "cache_salt must be a string", param="cache_salt")
        if caller.tenant is not None:
            own = TENANT_SALT_PREFIX + caller.tenant
            return own if not requested else f"{own}/{requested}"
        return None if not requested else CALLER_SALT_PREFIX + requested

    def _salted(self, caller: Caller, kwargs: dict[str, Any]) -> dict[str, Any]:
        salt = self.salt(caller, kwargs.pop("cache_salt", None))
        return kwargs if salt is None else {**kwargs, "cache_salt": salt}

    # -- the daemon -------------------------------------------------------------------

    async def complete(
        self, request: Request, caller: Caller, model: str, prompt: Any = None, **kwargs: Any
    ) -> Completion:
        """``client.complete`` for ``caller``, cancelled if the HTTP client leaves
        (a ``cache_salt`` in ``kwargs`` is the request's own: :meth:`salt` applies)."""
        kwargs = self._salted(caller, kwargs)
        with self._slot(caller):
            return await self.unless_gone(
                request,
                self.client.complete(model, prompt, timeout=self.http.request_timeout_s, **kwargs),
            )

    async def stream(
        self,
        request: Request,
        caller: Caller,
        model: str,
        prompt: Any = None,
        *,
        keepalive: bool = False,
        **kwargs: Any,
    ) -> OpenStream:
        """``client.infer`` for ``caller``, once its first event is there (so a
        refusal, a context overflow included, still gets its HTTP status).

        ``keepalive`` (an SSE stream): a first event later than
        ``http.keepalive_s`` (a long queue or prefill) is not waited for: the
        stream returns ``pending``, its response starts and pings until the
        first token (a refusal that late comes as the protocol's error event).
        """
        kwargs = self._salted(caller, kwargs)
        release = self._take_slot(caller)
        opened: list[AsyncStream] = []  # the stream once sent, to close if what follows fails
        commit = self.http.keepalive_s if keepalive else None

        loop = asyncio.get_running_loop()
        woken = loop.create_future()  # the first event, a refusal, the client gone, or commit

        def wake(_: object = None) -> None:
            if not woken.done():
                woken.set_result(None)

        async def start() -> tuple[AsyncIterator[Event], Event]:
            stream = await self.client.infer(
                model,
                prompt,
                timeout=self.http.request_timeout_s,
                idle_timeout=self.http.idle_timeout_s,
                **kwargs,
            )
            opened.append(stream)
            events = aiter(stream)
            first = await anext(events)
            # Woken from here, not from the task's end: the request goes on a
            # loop turn sooner (the task is done by the time it runs).
            wake()
            return events, first

        async def close() -> None:
            for stream in opened:
                await stream.aclose()

        def buffered() -> int:
            return opened[0].buffered() if opened else 0

        # One watch over the send and the first event: two tasks, one waiter.
        starting = loop.create_task(start())
        gone = loop.create_task(wait_disconnect(request.receive))
        starting.add_done_callback(wake)  # a refusal (the task raised)
        gone.add_done_callback(wake)
        timer = None if commit is None else loop.call_later(commit, wake)
        try:
            try:
                await woken
            finally:
                starting.remove_done_callback(wake)
                gone.remove_done_callback(wake)
                if not gone.done():
                    gone.cancel()
                if timer is not None:
                    timer.cancel()
            if starting.done():
                events, first = starting.result()
            elif gone.done():
                log.info("gateway.client_gone", path=request.url.path)
                raise ClientGone
            else:
                return OpenStream(
                    None,
                    None,
                    release,
                    close,
                    pending=starting,
                    keepalive_s=commit,
                    _buffered=buffered,
                )
        except BaseException:
            if not starting.done():
                starting.cancel()
                with suppress(BaseException):
                    await starting
            await close()
            release()
            raise
        return OpenStream(first, events, release, close, keepalive_s=commit, _buffered=buffered)

    async def embed(
        self, request: Request, caller: Caller, model: str, inputs: Sequence[Any]
    ) -> list[list[float]]:
        """One vector per input (text or tokens), as one running request of ``caller``."""
        timeout = self.http.request_timeout_s

        async def all_of() -> list[list[float]]:
            return list(
                await asyncio.gather(
                    *(self.client.embed(model, x, timeout=timeout) for x in inputs)
                )
            )

        with self._slot(caller):
            return await self.unless_gone(request, all_of())

    async def list_models(self, request: Request) -> list[ModelInfo]:
        return await self.unless_gone(request, self.client.list_models())

    async def metrics(self, request: Request) -> MetricsSnapshot:
        """The daemon's metrics (the front's ``metrics``: boards and counters)."""
        return await self.unless_gone(request, self.client.metrics())

    async def tokenize(self, model: str, text: str, **kwargs: Any) -> list[int]:
        return await self.client.tokenize(model, text, **kwargs)

    async def apply_chat_template(
        self, request: Request, model: str, messages: Sequence[Mapping[str, Any]], **chat: Any
    ) -> list[int]:
        """The tokens ``messages`` render to (Anthropic's ``count_tokens``)."""
        return await self.unless_gone(
            request, self.client.apply_chat_template(model, messages, **chat)
        )

    async def set_keep_alive(self, request: Request, model: str, seconds: float | None) -> None:
        """The model's ``keep_alive`` from now on (Ollama's per-request ``keep_alive``)."""
        await self.unless_gone(request, self.client.set_keep_alive(model, seconds))

    async def detokenize(self, model: str, tokens: Sequence[int]) -> str:
        return await self.client.detokenize(model, tokens)

    async def unless_gone(self, request: Request, work: Awaitable[T]) -> T:
        """``work``'s result, or :class:`ClientGone` once the HTTP client
        disconnected (``work`` is cancelled at once: the client sends CANCEL)."""
        task = asyncio.ensure_future(work)
        gone = asyncio.ensure_future(wait_disconnect(request.receive))
        try:
            await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            raise
        finally:
            if not gone.done():
                gone.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with suppress(BaseException):
            await task
        log.info("gateway.client_gone", path=request.url.path)
        raise ClientGone

    # -- limits -----------------------------------------------------------------------

    def _take_slot(self, caller: Caller) -> Callable[[], None]:
        running = self._running.get(caller.key, 0)
        if running >= self.http.max_streams_per_key:
            raise HttpError(
                "too_many_streams",
                f"{running} requests of this key are running (http.max_streams_per_key); "
                "retry when one has finished",
            )
        self._running[caller.key] = running + 1
        done = False

        def release() -> None:
            nonlocal done
            if not done:
                done = True
                left = self._running[caller.key] - 1
                if left:
                    self._running[caller.key] = left
                else:
                    del self._running[caller.key]

        return release

    def _slot(self, caller: Caller) -> _Slot:
        return _Slot(self._take_slot(caller))

    def running(self) -> Mapping[str, int]:
        """Requests running per key (for tests and metrics)."""
        return dict(self._running)


class _Slot:
    def __init__(self, release: Callable[[], None]) -> None:
        self._release = release

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        self._release()


def _too_large(limit: int) -> HttpError:
    return HttpError("too_large", f"the body is larger than http.max_body_bytes ({limit} bytes)")
