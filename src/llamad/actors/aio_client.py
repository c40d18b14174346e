"""An asyncio client of one actor: the actors protocol on the event loop.

The blocking :class:`llamad.actors.Client` waits in ``recv`` on its own
thread; an asyncio program must never do that. This client speaks the same
protocol (``docs/internals/actors.md``: HELLO, CALL, STREAM, CANCEL, BYE,
the same envelope codec from :mod:`llamad.actors.wire`) with every wait on
the event loop. Its connection (:class:`~llamad.actors.aio_link.AsyncLink`)
is a socket whose descriptor, and the actor's pidfd, are registered with
``loop.add_reader``; this module multiplexes requests over it, with the
bookkeeping both clients share (:class:`~llamad.actors.connection.Connection`)
and only the waiting of its own:

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
from collections.abc import AsyncIterator, Sequence
from typing import Any, Final

import msgspec
import structlog
import zmq

from llamad.actors import connection
from llamad.actors.aio_link import AsyncLink
from llamad.actors.connection import EMPTY, ENDED, Arrival, Connection, OpenStream, Slot, decode
from llamad.actors.curve import CurveClient
from llamad.actors.errors import ClientClosed, WrongProcess
from llamad.actors.registry import Registry
from llamad.actors.wire import Blob, Kind, Limits, Welcome
from llamad.errors import LlamadError, RequestTimeout, Unavailable

__all__ = ["AsyncActorClient", "AsyncStreamCall"]

_CALL: Final = int(Kind.CALL)
_STREAM: Final = int(Kind.STREAM)


class AsyncActorClient(Connection):
    """Asyncio client of one actor, reached by ``endpoint`` or registered ``name``.

    ``timeout`` is the default bound of :meth:`call` (``None``: none);
    ``connect_timeout`` bounds each (re)connect handshake. ``context`` is a
    ZeroMQ context to share with other clients (the caller terminates it);
    without one the client makes and terminates its own. ``curve``: CURVE
    keys for a ``tcp://`` actor that requires them.
    """

    _log = structlog.get_logger("llamad.client")

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
        super().__init__(
            endpoint, name, registry, timeout, connect_timeout, limits, client_name, curve
        )
        self._own_ctx = context is None
        self._ctx = context
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._link: AsyncLink | None = None
        self._connecting: asyncio.Future[Welcome] | None = None

    # -- connection ----------------------------------------------------------

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
        if not self._closing():
            return
        if self._link is not None and self._server is not None:
            self._link.send_quietly(connection.BYE)
        self._disconnect()
        self._fail_all(ClientClosed(f"client of {self.target!r} is closed"))
        if self._own_ctx and self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- requests ------------------------------------------------------------

    async def call(
        self,
        op: str,
        body: Any = EMPTY,
        *,
        timeout: float | None = EMPTY,
        reply_type: Any = Any,
    ) -> Any:
        """Call ``op``; the reply body decoded as ``reply_type``, or the typed error.

        ``timeout`` (default: the client's) raises
        :class:`~llamad.errors.RequestTimeout`; a timeout or a cancelled task
        sends CANCEL so the actor stops working on it.
        """
        loop = self._bind_loop()
        limit = self.timeout if timeout is EMPTY else timeout
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
                return decode(arrival.body, reply_type)
            if self._forgot_us(error, attempt):
                continue  # introduce ourselves again and resend
            raise error
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def stream(
        self,
        op: str,
        body: Any = EMPTY,
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
        connect_deadline = self._connect_deadline(loop.time(), deadline)
        server = await self._ensure_connected(connect_deadline)
        return self._issue(server, kind, op, body)

    def _send(self, header: bytes, blobs: Sequence[Blob] = ()) -> None:
        if self._link is None:
            raise Unavailable(f"actor {self.target!r} is not connected")
        self._link.send(header)

    def _send_cancel(self, cid: int) -> None:
        if self._link is not None and self._server is not None and not self._closed:
            self._link.send_quietly(connection.cancel_frame(cid))

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

    async def _next_arrival(self, slot: Slot, deadline: float | None) -> Arrival:
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
                self._lost(reason, link.refusal)

        events, watched = self._watch_plan(endpoint, expected)
        link = self._link = AsyncLink(
            loop,
            self._ctx,
            endpoint,
            self.limits,
            target=self.target,
            monitor=events,
            watched=watched,
            on_message=self._route,
            on_down=down,
            curve=self.curve,
        )
        cid, slot, hello = self._hello()
        try:
            # No pipe: a refused CURVE handshake takes it away for good. The
            # monitor reports the refusal onto this slot; the deadline bounds
            # the wait when nothing does.
            with contextlib.suppress(Unavailable):
                self._send(hello)
            try:
                arrival = await self._next_arrival(slot, deadline)
            except RequestTimeout:
                raise Unavailable(f"actor {self.target!r} did not answer the handshake") from None
        except BaseException:
            self._slots.pop(cid, None)
            self._disconnect()
            raise
        welcome, ref = self._welcomed(cid, arrival)
        if self._follow(link.watch, expected, ref, monitored=link.monitored):
            link.close_monitor()  # the pidfd is authoritative
        link.rewatch()
        return self._connected(welcome)

    def _disconnect(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()
        self._server = None


class AsyncStreamCall(OpenStream[AsyncActorClient]):
    """An open stream: ``async for`` its events; it ends with exactly one terminal.

    Each event is its body decoded as ``event_type``. A successful end stops
    the iteration and sets :attr:`result` (the END body, undecoded: the
    caller decodes it); a terminal error is raised from the iteration and
    kept in :attr:`error`. :meth:`cancel` tells the actor to stop.
    """

    def __init__(
        self, client: AsyncActorClient, cid: int, timeout: float | None, event_type: Any
    ) -> None:
        super().__init__(client, cid, timeout, event_type)
        self.result: msgspec.Raw | None = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        slot = self._slot()
        if slot is None:
            raise StopAsyncIteration
        loop = self._client._bind_loop()
        deadline = None if self.timeout is None else loop.time() + self.timeout
        try:
            arrival = await self._client._next_arrival(slot, deadline)
        except LlamadError as exc:
            self.cancel()
            self.error = exc
            raise
        except BaseException:
            self.cancel()  # the consuming task was cancelled: so is the stream
            raise
        event = self._take(arrival)
        if event is ENDED:
            raise StopAsyncIteration
        return event

    def buffered(self) -> int:
        """The answers here already (events, and the terminal): taking them
        does not wait. 0 once the stream is over."""
        slot = None if self.finished else self._client._slots.get(self.cid)
        return 0 if slot is None else len(slot.arrivals)

    def _event(self, arrival: Arrival) -> Any:
        assert arrival.body is not None
        return decode(arrival.body, self._event_type)

    def _ended(self, arrival: Arrival) -> None:
        self.result = arrival.body


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
