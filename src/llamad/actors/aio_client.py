"""An asyncio client of one actor: the actors protocol on the event loop.

The blocking :class:`llamad.actors.Client` waits in ``recv`` on its own
thread; an asyncio program must never do that. This client speaks the same
protocol (``docs/internals/actors.md``: HELLO, CALL, STREAM, CANCEL, BYE,
the same envelope codec from :mod:`llamad.actors.wire`) with every wait on
the event loop. Its connection (:class:`~llamad.actors.aio_link.AsyncLink`)
is a socket whose descriptor, and the actor's pidfd, are registered with
``loop.add_reader``; this module multiplexes requests over it:

- answers are routed by correlation id to each request's queue; a waiting
  task awaits a future, and a deadline is a ``loop.call_at`` timer;
- the actor's death (noticed at once through its pidfd) fails every open
  call and stream with ``WorkerCrashed``;
- a call whose task is cancelled, or that times out, sends CANCEL, so the
  actor drops the request (a model worker frees the sequence); so does a
  stream left unfinished (``cancel``, garbage collection);
- after a death the client is down; the next request resolves the actor
  again (by registry name, or probing the ipc endpoint) and handshakes, so a
  restarted actor is used with no action from the caller.

One instance belongs to one event loop (the loop that first connects it); if
it is used from another loop it drops the old connection and reconnects. It
is not thread-safe; everything runs on the loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Final

import msgspec
import structlog
import zmq

from llamad.actors.aio_link import AsyncLink
from llamad.actors.curve import CurveClient
from llamad.actors.errors import ClientClosed, WrongProcess
from llamad.actors.monitor import ProcessRef
from llamad.actors.registry import Registry, check_name
from llamad.actors.sockets import listening, validate_endpoint
from llamad.actors.wire import (
    DECODE_ERRORS,
    HANDSHAKE_REQUIRED,
    MAX_CID,
    SERVER_KINDS,
    Hello,
    Kind,
    Limits,
    Rejected,
    Welcome,
    decode_envelope,
    encode_envelope,
)
from llamad.errors import (
    Cancelled,
    LlamadError,
    RequestTimeout,
    TooLarge,
    Unavailable,
    WorkerCrashed,
    from_wire,
)

__all__ = ["AsyncActorClient", "AsyncStreamCall"]

log = structlog.get_logger("llamad.client")

_EMPTY: Final[Any] = object()
_ANY: Final = msgspec.msgpack.Decoder()
_WELCOME: Final = msgspec.msgpack.Decoder(Welcome)
_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {}
_CLIENT_LIMITS: Final = Limits(linger_s=0.0)
_CALL: Final = int(Kind.CALL)
_STREAM: Final = int(Kind.STREAM)
_ERROR: Final = int(Kind.ERROR)
_EVENT: Final = int(Kind.EVENT)
_END: Final = int(Kind.END)


@dataclass(slots=True)
class _Arrival:
    kind: int
    body: msgspec.Raw | None
    error: LlamadError | None = None


class _Slot:
    """One open request: its arrivals, and the future of whoever waits on them."""

    __slots__ = ("arrivals", "terminal", "waiter")

    def __init__(self) -> None:
        self.arrivals: deque[_Arrival] = deque()
        self.terminal = False
        self.waiter: asyncio.Future[None] | None = None

    def push(self, arrival: _Arrival) -> None:
        if arrival.kind != _EVENT:
            self.terminal = True
        self.arrivals.append(arrival)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class AsyncActorClient:
    """Asyncio client of one actor, reached by ``endpoint`` or registered ``name``.

    ``timeout`` is the default bound of :meth:`call` (``None``: none);
    ``connect_timeout`` bounds each (re)connect handshake. ``context`` is a
    ZeroMQ context to share with other clients (the caller terminates it);
    without one the client makes and terminates its own. ``curve``: CURVE
    keys for a ``tcp://`` actor that requires them.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        name: str | None = None,
        registry: Registry | None = None,
        timeout: float | None = 30.0,
        connect_timeout: float = 2.0,
        limits: Limits | None = None,
        client_name: str = "",
        context: zmq.Context[zmq.Socket[bytes]] | None = None,
        curve: CurveClient | None = None,
    ) -> None:
        if (endpoint is None) == (name is None):
            raise ValueError("give exactly one of endpoint or name")
        self._endpoint = validate_endpoint(endpoint) if endpoint is not None else None
        self._name = check_name(name) if name is not None else None
        self._registry = registry if registry is not None or name is None else Registry()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.limits = limits or _CLIENT_LIMITS
        self.client_name = client_name
        self.curve = curve
        self._own_ctx = context is None
        self._ctx = context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._link: AsyncLink | None = None
        self._server: Welcome | None = None
        self._connecting: asyncio.Future[Welcome] | None = None
        self._slots: dict[int, _Slot] = {}
        self._next_cid = 0
        self._closed = False
        self._pid = os.getpid()

    # -- connection ----------------------------------------------------------

    @property
    def target(self) -> str:
        return self._name if self._name is not None else str(self._endpoint)

    @property
    def server(self) -> Welcome | None:
        """The actor's handshake reply while connected, else ``None``."""
        return self._server

    @property
    def connected(self) -> bool:
        return self._server is not None

    async def connect(self, timeout: float | None = None) -> Welcome:
        """Be connected, retrying until ``timeout`` (default ``connect_timeout``)
        while the actor is not up; raises :class:`~llamad.errors.Unavailable`."""
        loop = self._bind_loop()
        deadline = loop.time() + (self.connect_timeout if timeout is None else timeout)
        while True:
            try:
                return await self._ensure_connected(deadline)
            except Unavailable:
                if loop.time() >= deadline:
                    raise
                await asyncio.sleep(0.01)

    def close(self) -> None:
        """Say goodbye and close (idempotent); open requests fail with ``ClientClosed``."""
        if self._closed:
            return
        self._closed = True
        if os.getpid() != self._pid:
            return  # a forked copy must not touch the parent's ZeroMQ state
        if self._link is not None and self._server is not None:
            self._link.send_quietly(encode_envelope(Kind.BYE, 0, "", None))
        self._disconnect()
        self._fail_all(ClientClosed(f"client of {self.target!r} is closed"))
        if self._own_ctx and self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- requests ------------------------------------------------------------

    async def call(
        self,
        op: str,
        body: Any = _EMPTY,
        *,
        timeout: float | None = _EMPTY,
        reply_type: Any = Any,
    ) -> Any:
        """Call ``op``; the reply body decoded as ``reply_type``, or the typed error.

        ``timeout`` (default: the client's) raises
        :class:`~llamad.errors.RequestTimeout`; a timeout or a cancelled task
        sends CANCEL so the actor stops working on it.
        """
        loop = self._bind_loop()
        limit = self.timeout if timeout is _EMPTY else timeout
        deadline = None if limit is None else loop.time() + limit
        for attempt in (1, 2):
            cid = await self._open(_CALL, op, body, deadline)
            slot = self._slots[cid]
            try:
                arrival = await self._next_arrival(slot, deadline)
            except BaseException:
                # Timed out, or the task was cancelled: the actor must stop too.
                if not slot.terminal:
                    self._send_cancel(cid)
                raise
            finally:
                self._slots.pop(cid, None)
            error = arrival.error
            if error is None:
                assert arrival.body is not None
                return _decode(arrival.body, reply_type)
            if attempt == 1 and error.details.get("reason") == HANDSHAKE_REQUIRED:
                # The actor dropped us as stuck and did not run the call.
                self._fail_all(
                    Cancelled(
                        f"actor {self.target!r} dropped this client",
                        details={"reason": "backpressure"},
                    )
                )
                self._disconnect()
                continue
            raise error
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def stream(
        self,
        op: str,
        body: Any = _EMPTY,
        *,
        timeout: float | None = None,
        event_type: Any = Any,
    ) -> AsyncStreamCall:
        """Open a stream (connecting first if needed); iterate it for events.

        ``timeout`` bounds the wait for each next event (``None``: no bound);
        it can be changed on the returned object between events.
        """
        cid = await self._open(_STREAM, op, body, None)
        return AsyncStreamCall(self, cid, timeout, event_type)

    # -- internals: sending --------------------------------------------------

    async def _open(self, kind: int, op: str, body: Any, deadline: float | None) -> int:
        loop = self._bind_loop()
        connect_deadline = loop.time() + self.connect_timeout
        if deadline is not None:
            connect_deadline = min(connect_deadline, deadline)
        server = await self._ensure_connected(connect_deadline)
        cid = self._next_cid = self._next_cid + 1 if self._next_cid < MAX_CID else 1
        header = encode_envelope(kind, cid, op, {} if body is _EMPTY else body)
        if len(header) > server.max_header_bytes:
            raise TooLarge(
                f"request header of {len(header)} bytes exceeds {server.max_header_bytes}",
                details={"limit": server.max_header_bytes},
            )
        self._slots[cid] = _Slot()
        try:
            self._send(header)
        except BaseException:
            self._slots.pop(cid, None)
            raise
        return cid

    def _send(self, header: bytes) -> None:
        if self._link is None:
            raise Unavailable(f"actor {self.target!r} is not connected")
        self._link.send(header)

    def _send_cancel(self, cid: int) -> None:
        if self._link is not None and self._server is not None and not self._closed:
            self._link.send_quietly(encode_envelope(Kind.CANCEL, cid, "", None))

    def _abandon(self, cid: int) -> None:
        """A stream was dropped unfinished (possibly from a GC on another thread)."""
        loop = self._loop
        if loop is None or self._closed or os.getpid() != self._pid:
            return
        if threading.get_ident() == self._thread:
            self._forget(cid)
        elif not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._forget, cid)

    def _forget(self, cid: int) -> None:
        slot = self._slots.pop(cid, None)
        if slot is not None and not slot.terminal:
            self._send_cancel(cid)

    # -- internals: receiving ------------------------------------------------

    async def _next_arrival(self, slot: _Slot, deadline: float | None) -> _Arrival:
        arrivals = slot.arrivals
        while not arrivals:
            loop = self._loop
            assert loop is not None
            if self._link is None:
                raise Unavailable(f"actor {self.target!r} is not connected")
            waiter: asyncio.Future[None] = loop.create_future()
            slot.waiter = waiter
            timer = None
            if deadline is not None:
                if loop.time() >= deadline:
                    raise RequestTimeout(f"no answer from {self.target!r} in time")
                timer = loop.call_at(deadline, _expire, waiter)
            try:
                await waiter
            finally:
                slot.waiter = None
                if timer is not None:
                    timer.cancel()
            if not arrivals and deadline is not None and loop.time() >= deadline:
                raise RequestTimeout(f"no answer from {self.target!r} in time")
        return arrivals.popleft()

    def _route(self, header: bytes) -> None:
        try:
            env = decode_envelope(header, self.limits.max_frame_bytes, SERVER_KINDS)
        except Rejected as rej:
            log.warning(
                "actor.client.bad_response", target=self.target, code=rej.error.code, cid=rej.cid
            )
            slot = self._slots.get(rej.cid)
            if slot is not None and not slot.terminal:
                slot.push(_Arrival(_ERROR, None, rej.error))
            return
        slot = self._slots.get(env.cid)
        if slot is None or slot.terminal:
            return  # a late answer to something we gave up on
        if env.kind == _ERROR:
            slot.push(_Arrival(_ERROR, None, _error(env.body)))
        else:
            slot.push(_Arrival(env.kind, env.body))

    # -- internals: connection state -----------------------------------------

    def _bind_loop(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise ClientClosed(f"client of {self.target!r} is closed")
        if os.getpid() != self._pid:
            raise WrongProcess("an AsyncClient cannot be used after fork; create one here")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            if self._loop is not None:
                # Used from a new loop (a second asyncio.run): the old loop's
                # readers are gone with it.
                self._disconnect()
                self._fail_all(Unavailable(f"client of {self.target!r} moved to another loop"))
            self._loop = loop
            self._thread = threading.get_ident()
        return loop

    async def _ensure_connected(self, deadline: float) -> Welcome:
        link = self._link
        if link is not None and link.going_down is not None:
            await asyncio.shield(link.going_down)
        if self._server is not None:
            return self._server
        if self._connecting is not None:
            # Another task is handshaking: share its outcome.
            return await asyncio.shield(self._connecting)
        loop = self._bind_loop()
        self._connecting = fut = loop.create_future()
        try:
            welcome = await self._handshake(deadline)
        except BaseException as exc:
            if isinstance(exc, Exception):
                fut.set_exception(exc)
                fut.exception()  # retrieved: no "never retrieved" warning if nobody shares it
            else:
                fut.cancel()
            raise
        else:
            fut.set_result(welcome)
            return welcome
        finally:
            self._connecting = None

    async def _handshake(self, deadline: float) -> Welcome:
        loop = self._loop
        assert loop is not None
        endpoint, expected = self._resolve()
        if self._ctx is None:
            self._ctx = zmq.Context()

        def down(reason: str) -> None:
            if self._link is link:
                if link.refusal is not None:
                    self._disconnect()
                    self._fail_all(link.refusal)  # refused, not crashed
                else:
                    self._server_down(reason)

        link = self._link = AsyncLink(
            loop,
            self._ctx,
            endpoint,
            self.limits,
            target=self.target,
            expected=expected,
            on_message=self._route,
            on_down=down,
            curve=self.curve,
        )
        me = ProcessRef.current()
        hello = Hello(me.pid, me.start_ticks, me.boot_id, me.pidns, self.client_name)
        cid = self._next_cid = self._next_cid + 1 if self._next_cid < MAX_CID else 1
        slot = self._slots[cid] = _Slot()
        try:
            # No pipe: a refused CURVE handshake takes it away for good. The
            # monitor reports the refusal onto this slot; the deadline bounds
            # the wait when nothing does.
            with contextlib.suppress(Unavailable):
                self._send(encode_envelope(Kind.HELLO, cid, "", hello))
            try:
                arrival = await self._next_arrival(slot, deadline)
            except RequestTimeout:
                raise Unavailable(f"actor {self.target!r} did not answer the handshake") from None
        except BaseException:
            self._slots.pop(cid, None)
            self._disconnect()
            raise
        self._slots.pop(cid, None)
        if arrival.error is not None:
            self._disconnect()
            raise arrival.error
        assert arrival.body is not None
        welcome = _WELCOME.decode(arrival.body)
        ref = ProcessRef(welcome.pid, welcome.start_ticks, welcome.boot_id, welcome.pidns)
        if not link.watch(ref, expected):
            self._disconnect()
            raise Unavailable(f"actor {self.target!r} exited during the handshake")
        self._server = welcome
        log.debug("actor.client.connected", target=self.target, pid=welcome.pid)
        return welcome

    def _resolve(self) -> tuple[str, ProcessRef | None]:
        if self._name is not None:
            assert self._registry is not None
            entry = self._registry.lookup(self._name)
            if entry is None:
                raise Unavailable(
                    f"actor {self._name!r} is not running", details={"name": self._name}
                )
            return entry.endpoint, entry.process
        assert self._endpoint is not None
        if not listening(self._endpoint):
            raise Unavailable(
                f"nothing listens on {self._endpoint}", details={"endpoint": self._endpoint}
            )
        return self._endpoint, None

    def _server_down(self, reason: str) -> None:
        """The actor died (its link drained what it sent first): fail what is open."""
        server = self._server
        pid = server.pid if server is not None else None
        self._disconnect()
        log.info("actor.client.server_down", target=self.target, pid=pid, reason=reason)
        self._fail_all(
            WorkerCrashed(
                f"actor {self.target!r} (pid {pid}) died: {reason}",
                details={"actor": self.target, "pid": pid, "reason": reason},
            )
        )

    def _fail_all(self, error: LlamadError) -> None:
        for slot in self._slots.values():
            if not slot.terminal:
                slot.push(_Arrival(_ERROR, None, error))

    def _disconnect(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()
        self._server = None


class AsyncStreamCall:
    """An open stream: ``async for`` its events; it ends with exactly one terminal.

    Each event is its body decoded as ``event_type``. A successful end stops
    the iteration and sets :attr:`result` (the END body, undecoded: the
    caller decodes it); a terminal error is raised from the iteration and
    kept in :attr:`error`. :meth:`cancel` tells the actor to stop.
    """

    def __init__(
        self, client: AsyncActorClient, cid: int, timeout: float | None, event_type: Any
    ) -> None:
        self._client = client
        self.cid = cid
        self.timeout = timeout
        self._event_type = event_type
        self.result: msgspec.Raw | None = None
        self.error: LlamadError | None = None
        self.finished = False

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        if self.finished:
            raise StopAsyncIteration
        client = self._client
        slot = client._slots.get(self.cid)
        if slot is None:
            self.finished = True
            raise StopAsyncIteration
        loop = client._bind_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        try:
            arrival = await client._next_arrival(slot, deadline)
        except LlamadError as exc:
            self.cancel()
            self.error = exc
            raise
        except BaseException:
            self.cancel()  # the consuming task was cancelled: so is the stream
            raise
        if arrival.error is not None:
            self._finish()
            self.error = arrival.error
            raise arrival.error
        assert arrival.body is not None
        if arrival.kind == _END:
            self._finish()
            self.result = arrival.body
            raise StopAsyncIteration
        return _decode(arrival.body, self._event_type)

    def cancel(self) -> None:
        """Stop consuming and ask the actor to stop producing. Idempotent."""
        if not self.finished:
            self._finish()
            self._client._send_cancel(self.cid)

    def _finish(self) -> None:
        self.finished = True
        self._client._slots.pop(self.cid, None)

    def __del__(self) -> None:
        if not self.finished:
            with contextlib.suppress(Exception):
                self._client._abandon(self.cid)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _decode(raw: msgspec.Raw, typ: Any) -> Any:
    decoder = _ANY if typ is Any else _DECODERS.get(typ)
    if decoder is None:
        decoder = _DECODERS[typ] = msgspec.msgpack.Decoder(typ)
    try:
        return decoder.decode(raw)
    except DECODE_ERRORS as exc:
        raise LlamadError(f"malformed answer from the actor: {exc}") from None


def _error(raw: msgspec.Raw) -> LlamadError:
    try:
        payload = _ANY.decode(raw)
    except DECODE_ERRORS:
        payload = None
    if not isinstance(payload, dict):
        return LlamadError("the actor sent a malformed error")
    return from_wire(payload)
