"""The calling side: a blocking client of one actor.

A :class:`Client` owns one DEALER socket (and its own ZeroMQ context, created
in the process and at the moment it first connects). It multiplexes any
number of open calls and streams by correlation id, so a thread can hold a
stream open while making calls.

**Handshake.** On connect the client sends HELLO (protocol version and its
own process identity) and gets a :class:`~llamad.actors.wire.Welcome` with
the actor's identity and limits; a version mismatch fails the connect with
:class:`~llamad.errors.VersionMismatch`.

**Crash detection.** When the actor runs on this host (same boot and pid
namespace) the client watches its pid with a pidfd. Before each request it
checks the pidfd (so a death while idle reconnects instead of failing the
request); while waiting for an answer it blocks in ``recv`` and checks the
pidfd every :data:`CRASH_CHECK_S` (0.1 s): a caller blocked in
:meth:`Client.call` gets :class:`~llamad.errors.WorkerCrashed` within about
0.1 s of the actor's exit (SPEC A3 asks for ≤ 1 s), and open streams end
with that error. Waiting in a plain blocking ``recv`` rather than a
``zmq_poll`` over socket and pidfd is what keeps the round trip close to
ZeroMQ's own (the poll costs several syscalls and a Python-level item list
per wait). A wait still empty after that first tick goes on in one
``zmq_poll`` over both, for as long as it may last: an idle subscriber
(the front's supervisor watch) then sleeps until something comes or the
actor dies, instead of waking ten times a second. For a remote actor (or
``watch="connection"``) a ZeroMQ socket monitor's disconnect event is polled
with the socket instead.

**Security.** A client of a ``tcp://`` endpoint served with CURVE passes
``curve`` (its keypair and the server's public key,
:class:`~llamad.actors.curve.CurveClient`). A handshake the actor refuses (a
key it does not allow, CURVE on one side only, the wrong server key) fails
the connect at once with :class:`~llamad.errors.PermissionDenied`, as does
an ipc socket this user may not open; ZeroMQ alone would retry them forever.

**Reconnect.** After a crash the client is *down*: the next call reconnects
first. While the actor is not back, calls fail fast with
:class:`~llamad.errors.Unavailable` (a registered actor with no live record,
or an ipc endpoint nobody listens on, is refused without waiting; other
endpoints wait at most ``connect_timeout``). Once the actor is back (a
restart under the same name, possibly on a new endpoint) calls work again
with no action from the caller.

A client is not thread-safe: use one per thread (the thread that creates it
is its owner; a stream dropped unfinished is cancelled at once when that
happens on the owner thread, else at the owner's next operation).

What it does with what arrives (resolving, the handshake's bookkeeping,
correlation ids, routing answers, failing what is open when the actor dies)
it shares with the asyncio client: :mod:`llamad.actors.connection`. This
module is the blocking waiting.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Final

import zmq

from llamad.actors import connection
from llamad.actors.connection import EMPTY, Arrival, Connection, OpenStream, Slot, Watch, decode
from llamad.actors.curve import CurveClient
from llamad.actors.errors import ClientClosed, WrongProcess
from llamad.actors.monitor import ProcessWatch
from llamad.actors.registry import Registry
from llamad.actors.sockets import (
    FORKS,
    NOBLOCK,
    POLLIN,
    SNDMORE,
    SNDMORE_NOBLOCK,
    send_frame,
)
from llamad.actors.wire import (
    DECODE_ERRORS,
    ENVELOPE_DECODER,
    MAX_CID,
    PROTOCOL_VERSION,
    Blob,
    Kind,
    Limits,
    Message,
    Welcome,
    encode_envelope,
    oversized_blob,
)
from llamad.errors import LlamadError, PermissionDenied, RequestTimeout, Unavailable

__all__ = ["CRASH_CHECK_S", "HANDSHAKE_TIMEOUT", "Client", "StreamCall"]

_LATE_REPLY_GRACE_S: Final = 0.01
_HEARD_GRACE_S: Final = 0.02
"""A call with ``heard_within`` sends its ``$ping`` only if not answered within this."""
CRASH_CHECK_S: Final = 0.1
"""How often a client blocked waiting for an answer checks that the actor lives."""
HANDSHAKE_TIMEOUT: Final = "handshake_timeout"
"""``details["reason"]`` of the :class:`~llamad.errors.Unavailable` a connect
raises when the actor took the connection and did not answer in time (its
loop does not run), as opposed to one refused at once (nobody listening)."""
_CRASH_CHECK_MS: Final = round(CRASH_CHECK_S * 1000)
# Enum attribute access costs a microsecond on the hot path; bind plain ints.
_CALL: Final = int(Kind.CALL)
_REPLY: Final = int(Kind.REPLY)
_CAST: Final = int(Kind.CAST)
_STREAM: Final = int(Kind.STREAM)


class Client(Connection):
    """Blocking client of one actor, reached by ``endpoint`` or registered ``name``.

    ``timeout`` is the default for :meth:`call`; ``connect_timeout`` bounds
    each (re)connect handshake. ``watch`` picks crash detection: ``auto``
    (pidfd when the actor is local, else connection events), ``process`` or
    ``connection``. ``curve``: CURVE keys for a ``tcp://`` actor that requires
    them (see the module doc).
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
        watch: Watch = "auto",
        curve: CurveClient | None = None,
    ) -> None:
        super().__init__(
            endpoint, name, registry, timeout, connect_timeout, limits, client_name, curve, watch
        )
        self._refusal: PermissionDenied | None = None
        self._forks = FORKS[0]
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        self._items: list[tuple[Any, int]] = []
        self._probe: list[tuple[Any, int]] = []
        # While connected to a local actor watched by a pidfd: that pidfd
        # alone, for the zero-timeout check before each request.
        self._pidcheck: select.poll | None = None
        self._rcvtimeo = _CRASH_CHECK_MS  # the socket's RCVTIMEO now
        self._tick_ms = _CRASH_CHECK_MS  # the longest a recv may block
        self._watch = ProcessWatch()
        self._owner = threading.get_ident()
        self._busy = 0
        self._abandoned: list[int] = []

    # -- connection ----------------------------------------------------------

    def connect(self, timeout: float | None = None) -> Welcome:
        """Handshake now (otherwise the first request does it), retrying until
        ``timeout`` (default ``connect_timeout``) while the actor is not up."""
        self._check_usable()
        deadline = time.monotonic() + (self.connect_timeout if timeout is None else timeout)
        while True:
            try:
                return self._ensure_connected(deadline)
            except Unavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)

    def close(self) -> None:
        """Say goodbye, close the socket, then the context. Idempotent."""
        if not self._closing():
            return
        if self._sock is not None and self._server is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(connection.BYE, zmq.NOBLOCK)
        self._disconnect()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        self._fail_all(ClientClosed("client closed"))

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- requests ------------------------------------------------------------

    def call(
        self,
        op: str,
        body: Any = EMPTY,
        *,
        blobs: Sequence[Blob] = (),
        timeout: float | None = EMPTY,
        reply_type: Any = Any,
        heard_within: float | None = None,
    ) -> Any:
        """Call ``op`` and return the reply body, or raise the actor's typed error.

        ``timeout`` (default: the client's) raises
        :class:`~llamad.errors.RequestTimeout` and tells the actor to give up;
        the actor dying raises :class:`~llamad.errors.WorkerCrashed` within
        about :data:`CRASH_CHECK_S`.
        ``reply_type`` decodes (and validates) the body into a msgspec type.
        ``heard_within``: for an op the actor may rightly hold for long (a
        wait it was asked for), the actor must still show that it runs
        within these seconds: a call not answered at once (20 ms) is
        followed by a ``$ping``, and :class:`~llamad.errors.RequestTimeout`
        is raised (the call cancelled) if neither is answered in time. A stopped or stuck actor
        then costs ``heard_within``, not the whole ``timeout``.
        """
        arrival = self._round_trip(
            op, body, blobs, self.timeout if timeout is EMPTY else timeout, heard_within
        )
        assert arrival.body is not None
        return decode(arrival.body, reply_type)

    def request(
        self,
        op: str,
        body: Any = EMPTY,
        *,
        blobs: Sequence[Blob] = (),
        timeout: float | None = EMPTY,
        reply_type: Any = Any,
    ) -> Message:
        """Like :meth:`call` but return the whole reply, blobs included."""
        arrival = self._round_trip(op, body, blobs, self.timeout if timeout is EMPTY else timeout)
        assert arrival.body is not None
        return Message(decode(arrival.body, reply_type), arrival.blobs)

    def _round_trip(
        self,
        op: str,
        body: Any,
        blobs: Sequence[Blob],
        limit: float | None,
        heard_within: float | None = None,
    ) -> Arrival:
        """Send a CALL and wait for its answer; raise its error, if any."""
        now = time.monotonic()
        deadline = None if limit is None else now + limit
        if heard_within is not None and (deadline is None or now + heard_within < deadline):
            return self._heard_round_trip(op, body, blobs, deadline, now + heard_within)
        for attempt in (1, 2):
            arrival = None
            if (
                self._pidcheck is not None
                and not self._slots
                and not self._busy
                and not self._abandoned
                and not self._closed
                and self._forks == FORKS[0]
            ):
                arrival = self._quick_call(op, body, blobs, deadline)
            if arrival is None:
                cid = self._open(_CALL, op, body, blobs, deadline)
                arrival = self._await(cid, deadline)
            error = arrival.error
            if error is None:
                return arrival
            if self._forgot_us(error, attempt):
                continue  # introduce ourselves again and resend
            raise error
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _heard_round_trip(
        self,
        op: str,
        body: Any,
        blobs: Sequence[Blob],
        deadline: float | None,
        heard_by: float,
    ) -> Arrival:
        """:meth:`_round_trip` that hears from the actor by ``heard_by``: its
        answer, or else its answer to a ``$ping`` (:meth:`_hear`)."""
        for attempt in (1, 2):
            cid = self._open(_CALL, op, body, blobs, deadline)
            try:
                self._hear(self._slots[cid], heard_by)
            except BaseException:
                if self._slots.pop(cid, None) is not None:
                    self._send_cancel(cid)
                raise
            arrival = self._await(cid, deadline)
            error = arrival.error
            if error is None:
                return arrival
            if self._forgot_us(error, attempt):
                continue
            raise error
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _hear(self, call: Slot, heard_by: float) -> None:
        """Return once ``call`` has an answer or the actor answered a ``$ping``;
        :class:`~llamad.errors.RequestTimeout` if neither came by ``heard_by``.

        The ping goes out only if the call is not answered within
        :data:`_HEARD_GRACE_S` (the common case costs nothing more); the actor
        handles a peer's messages in order, so its answer shows that its loop
        runs while it holds the call.
        """
        grace = min(heard_by, time.monotonic() + _HEARD_GRACE_S)
        while not call.arrivals and self._sock is not None:
            left = grace - time.monotonic()
            if left <= 0:
                break
            self._pump(left, call)
        if call.arrivals or self._sock is None:
            return  # answered, or down: the call's own wait says how
        ping = self._open(_CALL, "$ping", EMPTY, (), heard_by)
        pinged = self._slots[ping]
        try:
            while not call.arrivals and not pinged.arrivals and self._sock is not None:
                left = heard_by - time.monotonic()
                if left <= 0:
                    self._send_cancel(ping)
                    raise RequestTimeout(f"no answer from {self.target!r} in time")
                self._pump(left, pinged)
        finally:
            self._slots.pop(ping, None)

    def _await(self, cid: int, deadline: float | None) -> Arrival:
        slot = self._slots[cid]
        try:
            return self._next_arrival(slot, deadline)
        except RequestTimeout:
            self._send_cancel(cid)
            raise
        finally:
            self._slots.pop(cid, None)

    def _quick_call(
        self, op: str, body: Any, blobs: Sequence[Blob], deadline: float | None
    ) -> Arrival | None:
        """The common call, in few steps: connected to a local actor watched by
        a pidfd, nothing else open, nothing unusual coming back.

        Returns ``None`` before sending anything when the general path must
        decide (the actor may be gone, a limit is exceeded: it reconnects or
        raises); once sent, anything unexpected (no answer within a crash
        check tick, another message, an error) is handed to the general
        machinery, so every outcome is the one :meth:`_open` and
        :meth:`_await` give. With no other slot open, no stream can be
        abandoned mid-send, which is what ``_busy`` guards against.
        """
        assert self._pidcheck is not None and self._sock is not None
        server = self._server
        if server is None or self._pidcheck.poll(0):
            return None
        if blobs and (
            len(blobs) > server.max_blobs
            or oversized_blob(blobs, server.max_frame_bytes) is not None
        ):
            return None
        cid = self._next_cid = self._next_cid + 1 if self._next_cid < MAX_CID else 1
        header = encode_envelope(_CALL, cid, op, {} if body is EMPTY else body)
        if len(header) > server.max_header_bytes:
            return None
        self._send(header, blobs)
        sock = self._sock
        frame = None
        waited = False
        if deadline is None or deadline - time.monotonic() > self._tick_ms / 1000:
            if self._rcvtimeo != self._tick_ms:
                # A short timeout before this call left it lower.
                sock.setsockopt(zmq.RCVTIMEO, self._tick_ms)
                self._rcvtimeo = self._tick_ms
            try:
                frame = sock.recv(0, copy=False)
            except zmq.Again:
                waited = True
            else:
                if not frame.more:
                    reply = frame.bytes
                    try:
                        version, kind, rcid, _, raw = ENVELOPE_DECODER.decode(reply)
                    except DECODE_ERRORS:
                        version = kind = rcid = 0
                    if version == PROTOCOL_VERSION and kind == _REPLY and rcid == cid:
                        return Arrival(_REPLY, raw, ())
        self._slots[cid] = Slot()
        if frame is not None:
            header = frame.bytes
            extra: list[memoryview] = []
            while frame.more:
                frame = sock.recv(NOBLOCK, copy=False)
                extra.append(frame.buffer)
            self._route(header, tuple(extra))
        elif waited and self._watch.exited():
            self._server_down("process exited")
        return self._await(cid, deadline)

    def cast(self, op: str, body: Any = EMPTY, *, blobs: Sequence[Blob] = ()) -> None:
        """Send ``op`` without waiting; the actor sends nothing back."""
        self._open(_CAST, op, body, blobs, None)

    def stream(
        self,
        op: str,
        body: Any = EMPTY,
        *,
        blobs: Sequence[Blob] = (),
        timeout: float | None = None,
        event_type: Any = Any,
    ) -> StreamCall:
        """Open a stream; iterate the result for events (see :class:`StreamCall`).

        ``timeout`` bounds the wait for each next event (``None``: no bound).
        """
        cid = self._open(_STREAM, op, body, blobs, None)
        return StreamCall(self, cid, op, timeout, event_type)

    # -- internals: sending --------------------------------------------------

    def _open(
        self, kind: int, op: str, body: Any, blobs: Sequence[Blob], deadline: float | None
    ) -> int:
        self._busy += 1
        try:
            return self._open_unguarded(kind, op, body, blobs, deadline)
        finally:
            self._busy -= 1
            if self._abandoned:
                self._flush_abandoned()

    def _open_unguarded(
        self, kind: int, op: str, body: Any, blobs: Sequence[Blob], deadline: float | None
    ) -> int:
        if self._closed or self._forks != FORKS[0]:
            self._check_usable()
        server = self._server
        pidcheck = self._pidcheck
        if server is None or pidcheck is None or pidcheck.poll(0):
            # Not connected, watched without a pidfd, or the pidfd says the
            # actor is gone: the general path reconnects (or notices).
            connect_deadline = self._connect_deadline(time.monotonic(), deadline)
            server = self._ensure_connected(connect_deadline)
        return self._issue(server, kind, op, body, blobs)

    def _send(self, header: bytes, blobs: Sequence[Blob] = ()) -> None:
        sock = self._sock
        assert sock is not None
        try:
            if not blobs:
                send_frame(sock, header, NOBLOCK)
                return
            send_frame(sock, header, SNDMORE_NOBLOCK)
        except zmq.Again:
            raise Unavailable(f"actor {self.target!r} is not reading (send queue full)") from None
        last = len(blobs) - 1
        for i, blob in enumerate(blobs):
            send_frame(sock, blob, 0 if i == last else SNDMORE, False)

    def _send_cancel(self, cid: int) -> None:
        if self._sock is not None and self._server is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(connection.cancel_frame(cid), zmq.NOBLOCK)

    def _abandon(self, cid: int) -> None:
        """A stream was dropped without being finished: cancel it on the actor.

        Called from ``StreamCall.__del__``, which may run in the middle of
        one of our own socket operations or on another thread; then the
        cancel waits for the owner thread's next operation.
        """
        self._abandoned.append(cid)
        if (
            not self._busy
            and threading.get_ident() == self._owner
            and not self._closed
            and os.getpid() == self._pid
        ):
            self._flush_abandoned()

    def _flush_abandoned(self) -> None:
        while self._abandoned:
            cid = self._abandoned.pop()
            if self._slots.pop(cid, None) is not None:
                self._send_cancel(cid)

    # -- internals: receiving ------------------------------------------------

    def _next_arrival(self, slot: Slot, deadline: float | None) -> Arrival:
        arrivals = slot.arrivals
        while not arrivals:
            if self._sock is None:
                raise Unavailable(f"actor {self.target!r} is not connected")
            if deadline is None:
                left = None
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeout(f"no answer from {self.target!r} in time")
            self._pump(left, slot)
        return arrivals.popleft()

    def _pump(self, timeout: float | None, want: Slot | None = None) -> None:
        """Wait up to ``timeout`` for traffic or the actor's death; route arrivals."""
        self._busy += 1
        try:
            if self._monitor is None:
                self._recv_one(timeout)
            else:
                self._poll_monitored(timeout, want)
        finally:
            self._busy -= 1
            if self._abandoned:
                self._flush_abandoned()

    def _poll_monitored(self, timeout: float | None, want: Slot | None) -> None:
        """Connection watch: the monitor socket must be polled with ours."""
        interval = self._watch.poll_interval()
        if interval is not None:
            timeout = interval if timeout is None else min(timeout, interval)
        ms = -1 if timeout is None else max(0, int(timeout * 1000 + 0.999))
        ready = zmq.zmq_poll(self._items, ms)
        fds: list[int] = []
        monitor_ready = False
        for item, _ in ready:
            if item is self._sock:
                self._drain(want)
            elif item is self._monitor:
                monitor_ready = True
            else:
                fds.append(item)
        if monitor_ready and self._disconnected():
            refusal, self._refusal = self._refusal, None
            self._lost("connection lost", refusal)
            return
        if (fds or interval is not None) and self._watch.exited(fds):
            self._server_down("process exited")

    def _recv_one(self, timeout: float | None) -> None:
        """Block in ``recv`` for one message and route it; after ``timeout`` or
        :data:`CRASH_CHECK_S` without one, check whether the actor still lives,
        and wait out the rest of a longer ``timeout`` in one poll over the
        socket and the actor's pidfd (no wakeup per tick while nothing comes)."""
        sock = self._sock
        assert sock is not None
        ms = self._tick_ms
        if timeout is not None and timeout * 1000 < ms:
            ms = max(0, int(timeout * 1000 + 0.999))
        if ms != self._rcvtimeo:
            # Only a short remaining timeout changes it; the next wait resets it.
            sock.setsockopt(zmq.RCVTIMEO, ms)
            self._rcvtimeo = ms
        try:
            frame = sock.recv(0, copy=False)
        except zmq.Again:
            if self._watch.exited():
                self._server_down("process exited")
            elif self._watch.fds() and (timeout is None or timeout * 1000 > ms):
                # Quiet for a whole tick: the rest of a long wait (a
                # subscription, a call held on purpose) blocks in one poll
                # over the socket and the actor's pidfd instead of waking
                # every tick to look (the front's supervisor watch woke 10
                # times a second, each wakeup a core taken from a decode).
                self._poll_monitored(None if timeout is None else timeout - ms / 1000, None)
            return
        # A small header is cheaper to copy out than to view.
        header = frame.bytes
        blobs: list[memoryview] = []
        while frame.more:
            frame = sock.recv(NOBLOCK, copy=False)
            blobs.append(frame.buffer)
        self._route(header, tuple(blobs))

    def _drain(self, want: Slot | None = None) -> None:
        """Route what is queued; stop early once ``want`` has an arrival (the
        rest is picked up by the next poll, which returns at once)."""
        sock = self._sock
        if sock is None:
            return
        probe = self._probe
        while True:
            try:
                frame = sock.recv(NOBLOCK, copy=False)
            except zmq.Again:
                return
            header = frame.bytes
            blobs: list[memoryview] = []
            while frame.more:
                frame = sock.recv(NOBLOCK, copy=False)
                blobs.append(frame.buffer)
            self._route(header, tuple(blobs))
            if want is not None and want.arrivals:
                return
            # A zero-timeout poll is far cheaper in pyzmq than the Again
            # exception an empty recv raises.
            if not zmq.zmq_poll(probe, 0):
                return

    def _send_hello(self, sock: zmq.Socket[bytes], frame: bytes, deadline: float) -> None:
        """Send the HELLO within the connect deadline.

        A DEALER's send blocks while it has no pipe, and a refused CURVE
        handshake takes the pipe away for good: a refusal that lands before
        the HELLO is sent (a loaded machine) would hang a blocking send. The
        monitor says why instead, and the deadline bounds the rest.
        """
        while True:
            try:
                sock.send(frame, NOBLOCK)
                return
            except zmq.Again:
                pass
            left = deadline - time.monotonic()
            if left <= 0:
                raise Unavailable(f"actor {self.target!r} did not accept the handshake")
            items: list[tuple[Any, int]] = [(sock, zmq.POLLOUT)]
            if self._monitor is not None:
                items.append((self._monitor, POLLIN))
            ready = zmq.zmq_poll(items, max(1, min(int(left * 1000 + 0.999), _CRASH_CHECK_MS)))
            if any(item is self._monitor for item, _ in ready) and self._disconnected():
                refusal, self._refusal = self._refusal, None
                if refusal is not None:
                    raise refusal
            if self._watch.exited():
                raise Unavailable(f"actor {self.target!r} exited during the handshake")

    def _disconnected(self) -> bool:
        monitor = self._monitor
        assert monitor is not None
        lost = False
        while zmq.zmq_poll([(monitor, POLLIN)], 0):
            gone, refusal = connection.monitor_event(monitor.recv_multipart(NOBLOCK))
            lost = lost or gone
            if self._refusal is None:
                # The first refusal says why; retries that follow may say less.
                self._refusal = refusal
        return lost

    # -- internals: connection state -----------------------------------------

    def _ensure_connected(self, deadline: float) -> Welcome:
        if self._sock is not None and self._server is not None:
            # Notice a death that happened while we were idle, so the new
            # request reconnects instead of failing as if it had been in flight.
            if self._watch.exited():
                self._server_down("process exited")
            elif self._monitor is not None and self._disconnected():
                self._server_down("connection lost")
            else:
                return self._server
        return self._handshake(deadline)

    def _handshake(self, deadline: float) -> Welcome:
        endpoint, expected = self._resolve()
        if self._ctx is None:
            self._ctx = zmq.Context()
        sock = connection.dealer(self._ctx, endpoint, self.limits, self.curve)
        sock.setsockopt(zmq.RCVTIMEO, _CRASH_CHECK_MS)
        self._rcvtimeo = _CRASH_CHECK_MS
        self._sock = sock
        self._refusal = None
        events, watched = self._watch_plan(endpoint, expected)
        if events:
            self._monitor = sock.get_monitor_socket(events)
        sock.connect(endpoint)
        if watched is not None:
            self._watch.watch(watched)
        self._rebuild_items()
        cid, slot, hello = self._hello()
        try:
            self._send_hello(sock, hello, deadline)
            while not slot.arrivals:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Unavailable(
                        f"actor {self.target!r} did not answer the handshake",
                        details={"reason": HANDSHAKE_TIMEOUT},
                    )
                if self._sock is None:
                    raise Unavailable(f"actor {self.target!r} went away during the handshake")
                self._pump(left)
        except BaseException:
            self._slots.pop(cid, None)
            self._disconnect()
            raise
        welcome, ref = self._welcomed(cid, slot.arrivals.popleft())
        if self._follow(self._watch, expected, ref, monitored=self._monitor is not None):
            # The pidfd is authoritative; a socket monitor on top would only
            # cost an extra poll item and a probe per request.
            self._close_monitor()
        self._rebuild_items()
        fds = self._watch.fds()
        if self._monitor is None and len(fds) == 1 and self._watch.poll_interval() is None:
            self._pidcheck = select.poll()
            self._pidcheck.register(fds[0], select.POLLIN)
        return self._connected(welcome)

    def _server_down(self, reason: str) -> None:
        if self._slots and self._sock is not None:
            # Answers the actor sent just before dying may still be in flight
            # through our I/O thread: give them a moment to land.
            self._sock.poll(round(_LATE_REPLY_GRACE_S * 1000))
            self._drain()
        super()._server_down(reason)

    def _disconnect(self) -> None:
        self._close_monitor()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._watch.close()
        self._pidcheck = None
        self._server = None
        self._items = []
        self._probe = []

    def _close_monitor(self) -> None:
        if self._monitor is None:
            return
        if self._sock is not None:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._monitor = None

    def _rebuild_items(self) -> None:
        items: list[tuple[Any, int]] = []
        if self._sock is not None:
            items.append((self._sock, POLLIN))
        if self._monitor is not None:
            items.append((self._monitor, POLLIN))
        items += [(fd, POLLIN) for fd in self._watch.fds()]
        self._items = items
        self._probe = items[:1]
        interval = self._watch.poll_interval()
        self._tick_ms = _CRASH_CHECK_MS
        if interval is not None:
            self._tick_ms = min(_CRASH_CHECK_MS, max(1, round(interval * 1000)))

    def _check_usable(self) -> None:
        if self._closed:
            raise ClientClosed(f"client of {self.target!r} is closed")
        if os.getpid() != self._pid:
            raise WrongProcess("a Client cannot be used after fork; create one in this process")


class StreamCall(OpenStream[Client]):
    """An open stream: iterate for events; it ends with exactly one terminal.

    Iteration yields each event as a :class:`~llamad.actors.wire.Message`.
    A successful end stops the iteration and sets :attr:`result` (the end
    body); a terminal error (the actor's, or ``WorkerCrashed`` if it died) is
    raised from the iteration and kept in :attr:`error`. :meth:`cancel` (or
    leaving a ``with`` block early) tells the actor to stop.
    """

    def __init__(
        self, client: Client, cid: int, op: str, timeout: float | None, event_type: Any
    ) -> None:
        super().__init__(client, cid, timeout, event_type)
        self.op = op
        self.result: Any = None
        self.result_blobs: tuple[memoryview, ...] = ()

    def __iter__(self) -> StreamCall:
        return self

    def __next__(self) -> Message:
        slot = self._slot()
        if slot is None:
            raise StopIteration
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        try:
            arrival = self._client._next_arrival(slot, deadline)
        except RequestTimeout:
            self.cancel()
            raise
        except LlamadError as exc:
            self._finish()
            self.error = exc
            raise
        event = self._take(arrival)
        if event is connection.ENDED:
            raise StopIteration
        message: Message = event
        return message

    def _event(self, arrival: Arrival) -> Message:
        assert arrival.body is not None
        return Message(decode(arrival.body, self._event_type), arrival.blobs)

    def _ended(self, arrival: Arrival) -> None:
        assert arrival.body is not None
        self.result = decode(arrival.body, Any)
        self.result_blobs = arrival.blobs

    def __enter__(self) -> StreamCall:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
