"""The calling side's connection to one actor, apart from the waiting (sans-I/O).

Two clients speak the actors protocol: the blocking
:class:`~llamad.actors.client.Client` waits in ``recv`` (or ``zmq_poll``) on
its own thread, the asyncio :class:`~llamad.actors.aio_client.AsyncActorClient`
on the event loop. How they wait is all that differs; what they do with what
arrives is written once, here, in :class:`Connection`, which both extend:

- **which actor**: a registered name is looked up in the registry (the
  endpoint, and the process expected to answer), an endpoint is probed
  (an ``ipc://`` path nobody listens on is refused without waiting);
- **the handshake**: the HELLO this process sends, the WELCOME read back,
  and what watches the actor: its pidfd when it runs on this host, else a
  socket monitor's disconnect event (over ``tcp://`` a monitor also watches
  the handshake itself, which CURVE may refuse);
- **requests**: correlation ids, the actor's limits checked before sending,
  one :class:`Slot` per open call or stream where its answers queue, and each
  answer routed to its slot by id;
- **endings**: the actor died (every open call and stream fails with
  :class:`~llamad.errors.WorkerCrashed`), refused the handshake (they fail
  with its :class:`~llamad.errors.PermissionDenied`), forgot this client (a
  ``handshake_required`` refusal: what was open there is cancelled, and the
  call is sent once more), or the client closed.

A subclass provides the I/O: ``_send`` (queue one request without waiting),
``_send_cancel``, ``_abandon`` (a stream dropped unfinished) and
``_disconnect`` (close the socket; the connection is down).
:class:`OpenStream` is the same split for an open stream.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

import msgspec
import structlog
import zmq

from llamad.actors.curve import HANDSHAKE_FAILED, CurveClient, handshake_refusal, secure_client
from llamad.actors.monitor import ProcessRef, ProcessWatch
from llamad.actors.registry import Registry, check_name
from llamad.actors.sockets import configure, listening, validate_endpoint
from llamad.actors.wire import (
    DECODE_ERRORS,
    HANDSHAKE_REQUIRED,
    MAX_CID,
    SERVER_KINDS,
    Blob,
    Hello,
    Kind,
    Limits,
    Rejected,
    Welcome,
    decode_envelope,
    encode_envelope,
    oversized_blob,
)
from llamad.errors import (
    Cancelled,
    LlamadError,
    PermissionDenied,
    TooLarge,
    Unavailable,
    WorkerCrashed,
    from_wire,
)

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "BYE",
    "CLIENT_LIMITS",
    "EMPTY",
    "END",
    "ENDED",
    "ERROR",
    "EVENT",
    "Arrival",
    "Connection",
    "OpenStream",
    "Slot",
    "Watch",
    "cancel_frame",
    "dealer",
    "decode",
    "monitor_event",
    "wire_error",
]

log = structlog.get_logger("llamad.actors")

Watch = Literal["auto", "process", "connection"]
"""How a client learns that its actor died (see :class:`Connection`)."""

EMPTY: Final[Any] = object()
"""A request with no body argument (sent as ``{}``), or a timeout left to the client's."""
ENDED: Final[Any] = object()
"""What :meth:`OpenStream._take` returns for the END of a stream (not an event)."""
CLIENT_LIMITS: Final = Limits(linger_s=0.0)
BYE: Final = encode_envelope(Kind.BYE, 0, "", None)
# Enum attribute access costs a microsecond on the hot path; bind plain ints.
ERROR: Final = int(Kind.ERROR)
EVENT: Final = int(Kind.EVENT)
END: Final = int(Kind.END)
_EVENTS: Final = int(Kind.EVENTS)
_CAST: Final = int(Kind.CAST)

_ANY: Final = msgspec.msgpack.Decoder()
_WELCOME: Final = msgspec.msgpack.Decoder(Welcome)
_BATCH: Final = msgspec.msgpack.Decoder(list[tuple[int, msgspec.Raw]])
_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


@dataclass(slots=True)
class Arrival:
    """One answer to an open request: an event, its terminal, or the error ending it."""

    kind: int
    body: msgspec.Raw | None
    blobs: tuple[memoryview, ...] = ()
    error: LlamadError | None = None


class Slot:
    """One open request: the answers queued for it, and whoever waits on them
    (the asyncio client's future; the blocking client waits on its socket)."""

    __slots__ = ("arrivals", "terminal", "waiter")

    def __init__(self) -> None:
        self.arrivals: deque[Arrival] = deque()
        self.terminal = False
        self.waiter: asyncio.Future[None] | None = None

    def push(self, arrival: Arrival) -> None:
        if arrival.kind != EVENT:
            self.terminal = True
        self.arrivals.append(arrival)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class Connection:
    """What a client of one actor keeps between its waits (see the module doc).

    The actor is reached by ``endpoint`` or by registered ``name``;
    ``watch`` picks how its death is seen: ``auto`` (its pidfd when it runs
    on this host, else the connection's disconnect event), ``process`` or
    ``connection``.
    """

    _log: Any = log

    def __init__(  # noqa: PLR0917 - the clients' own keywords, passed on in order
        self,
        endpoint: str | None,
        name: str | None,
        registry: Registry | None,
        timeout: float | None,
        connect_timeout: float,
        limits: Limits | None,
        client_name: str,
        curve: CurveClient | None,
        watch: Watch = "auto",
    ) -> None:
        if (endpoint is None) == (name is None):
            raise ValueError("give exactly one of endpoint or name")
        self._endpoint = validate_endpoint(endpoint) if endpoint is not None else None
        self._name = check_name(name) if name is not None else None
        self._registry = registry if registry is not None or name is None else Registry()
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.limits = limits or CLIENT_LIMITS
        self.client_name = client_name
        self.watch_mode: Watch = watch
        if curve is not None and not isinstance(curve, CurveClient):
            raise ValueError("curve must be a CurveClient")
        self.curve = curve
        self._pid = os.getpid()
        self._server: Welcome | None = None
        self._slots: dict[int, Slot] = {}
        self._next_cid = 0
        self._closed = False

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

    # -- the I/O, provided by each client ------------------------------------

    def _send(self, header: bytes, blobs: Sequence[Blob] = ()) -> None:
        """Queue one request without waiting; ``Unavailable`` when it cannot go."""
        raise NotImplementedError

    def _send_cancel(self, cid: int) -> None:
        """Tell the actor to stop working on ``cid`` (when connected); never raises."""
        raise NotImplementedError

    def _abandon(self, cid: int) -> None:
        """A stream was dropped unfinished, maybe by a collection on another thread."""
        raise NotImplementedError

    def _disconnect(self) -> None:
        """Close the socket and stop watching the actor: the connection is down."""
        raise NotImplementedError

    # -- which actor, and the handshake --------------------------------------

    def _resolve(self) -> tuple[str, ProcessRef | None]:
        """Where the actor is now, and the process expected to answer there."""
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

    def _watch_plan(
        self, endpoint: str, expected: ProcessRef | None
    ) -> tuple[int, ProcessRef | None]:
        """How to watch a new connection until the WELCOME says who answered: the
        socket monitor's events (0: no monitor), and the process whose pidfd
        to watch meanwhile (the ``expected`` one, unless only the connection
        is watched)."""
        events = 0
        if endpoint.startswith("tcp://"):
            # Over tcp the handshake itself may be refused (CURVE): watched
            # until it completes, then kept only if the actor is not local.
            events = int(zmq.EVENT_DISCONNECTED | HANDSHAKE_FAILED)
        elif self.watch_mode == "connection" or (
            self.watch_mode == "auto" and (expected is None or not expected.is_local())
        ):
            events = int(zmq.EVENT_DISCONNECTED)
        return events, None if self.watch_mode == "connection" else expected

    def _hello(self) -> tuple[int, Slot, bytes]:
        """Open the handshake: its correlation id, the slot its answer lands in,
        and the HELLO frame (this process's identity, for the actor's watch)."""
        me = ProcessRef.current()
        hello = Hello(me.pid, me.start_ticks, me.boot_id, me.pidns, self.client_name, batches=True)
        cid = self._cid()
        slot = self._slots[cid] = Slot()
        return cid, slot, encode_envelope(Kind.HELLO, cid, "", hello)

    def _welcomed(self, cid: int, arrival: Arrival) -> tuple[Welcome, ProcessRef]:
        """Close the handshake ``cid`` with its answer: the WELCOME and the process
        that sent it, or its error raised (down)."""
        self._slots.pop(cid, None)
        if arrival.error is not None:
            self._disconnect()
            raise arrival.error
        assert arrival.body is not None
        welcome = _WELCOME.decode(arrival.body)
        return welcome, ProcessRef(welcome.pid, welcome.start_ticks, welcome.boot_id, welcome.pidns)

    def _follow(
        self, watch: ProcessWatch, expected: ProcessRef | None, ref: ProcessRef, *, monitored: bool
    ) -> bool:
        """Watch ``ref``, the process that answered the handshake, instead of the
        one the registry named. True when its pidfd watches it (a socket
        monitor is no longer needed: the pidfd is authoritative); False when
        the connection's monitor must. Raises (down) when it cannot be watched."""
        if expected is not None and ref != expected:
            watch.unwatch(expected)
        if self.watch_mode != "connection" and ref.is_local():
            if not watch.watch(ref):
                self._disconnect()
                raise Unavailable(f"actor {self.target!r} exited during the handshake")
            return True
        if not monitored or self.watch_mode == "process":
            self._disconnect()
            raise Unavailable(
                f"actor {self.target!r} is not on this host; use watch='connection' or 'auto'"
            )
        return False

    def _connected(self, welcome: Welcome) -> Welcome:
        self._server = welcome
        self._log.debug("actor.client.connected", target=self.target, pid=welcome.pid)
        return welcome

    # -- requests ------------------------------------------------------------

    def _cid(self) -> int:
        cid = self._next_cid = self._next_cid + 1 if self._next_cid < MAX_CID else 1
        return cid

    def _connect_deadline(self, now: float, deadline: float | None) -> float:
        """Until when a request sent ``now`` may wait to be connected:
        ``connect_timeout``, and never past its own ``deadline``."""
        limit = now + self.connect_timeout
        return limit if deadline is None else min(limit, deadline)

    def _issue(
        self, server: Welcome, kind: int, op: str, body: Any, blobs: Sequence[Blob] = ()
    ) -> int:
        """Send a request to the connected actor ``server``; its correlation id
        (with a slot for its answers, unless it is a cast). The actor's limits
        are checked first: what it would refuse raises ``TooLarge`` here."""
        if blobs:
            if len(blobs) > server.max_blobs:
                raise TooLarge(f"{len(blobs)} blobs exceed the actor's limit of {server.max_blobs}")
            big = oversized_blob(blobs, server.max_frame_bytes)
            if big is not None:
                raise TooLarge(
                    f"blob {big} exceeds the actor's frame limit of {server.max_frame_bytes} bytes",
                    details={"limit": server.max_frame_bytes},
                )
        cid = self._cid()
        header = encode_envelope(kind, cid, op, {} if body is EMPTY else body)
        if len(header) > server.max_header_bytes:
            raise TooLarge(
                f"request header of {len(header)} bytes exceeds {server.max_header_bytes}",
                details={"limit": server.max_header_bytes},
            )
        if kind != _CAST:
            self._slots[cid] = Slot()
        try:
            self._send(header, blobs)
        except BaseException:
            self._slots.pop(cid, None)
            raise
        return cid

    def _forgot_us(self, error: LlamadError, attempt: int) -> bool:
        """Whether the first attempt's ``error`` says the actor forgot this client
        (it dropped it as stuck) and did not run the call: then whatever else
        was open there is gone, and the call is sent again after a new
        handshake."""
        if attempt != 1 or error.details.get("reason") != HANDSHAKE_REQUIRED:
            return False
        dropped = f"actor {self.target!r} dropped this client"
        self._fail_all(Cancelled(dropped, details={"reason": "backpressure"}))
        self._disconnect()
        return True

    # -- answers -------------------------------------------------------------

    def _route(self, header: bytes | memoryview, blobs: tuple[memoryview, ...] = ()) -> None:
        """Queue one message from the actor on the slot its correlation id names."""
        try:
            env = decode_envelope(header, self.limits.max_frame_bytes, SERVER_KINDS)
        except Rejected as rej:
            self._log.warning(
                "actor.client.bad_response", target=self.target, code=rej.error.code, cid=rej.cid
            )
            slot = self._slots.get(rej.cid)
            if slot is not None and not slot.terminal:
                slot.push(Arrival(ERROR, None, (), rej.error))
            return
        if env.kind == _EVENTS:
            self._route_batch(env.body)
            return
        slot = self._slots.get(env.cid)
        if slot is None or slot.terminal:
            return  # a late answer to something we gave up on
        if env.kind == ERROR:
            slot.push(Arrival(ERROR, None, (), wire_error(env.body)))
        else:
            slot.push(Arrival(env.kind, env.body, blobs))

    def _route_batch(self, body: msgspec.Raw) -> None:
        """Queue each event of an ``EVENTS`` message on its stream's slot, in order."""
        try:
            events = _BATCH.decode(body)
        except DECODE_ERRORS as exc:
            # No stream can be told which of its events this held; the actor
            # never sends one (it encodes each body before it batches it).
            self._log.warning("actor.client.bad_batch", target=self.target, error=str(exc))
            return
        slots = self._slots
        for cid, raw in events:
            slot = slots.get(cid)
            if slot is not None and not slot.terminal:
                slot.push(Arrival(EVENT, raw))

    # -- endings -------------------------------------------------------------

    def _lost(self, reason: str, refusal: PermissionDenied | None) -> None:
        """The connection is gone: refused (whatever waits fails with the reason),
        else the actor is taken for dead."""
        if refusal is not None:
            self._disconnect()
            self._fail_all(refusal)  # refused, not crashed
        else:
            self._server_down(reason)

    def _server_down(self, reason: str) -> None:
        """The actor died: down, and every open call and stream fails."""
        server = self._server
        pid = server.pid if server is not None else None
        self._disconnect()
        self._log.info("actor.client.server_down", target=self.target, pid=pid, reason=reason)
        self._fail_all(
            WorkerCrashed(
                f"actor {self.target!r} (pid {pid}) died: {reason}",
                details={"actor": self.target, "pid": pid, "reason": reason},
            )
        )

    def _fail_all(self, error: LlamadError) -> None:
        for slot in self._slots.values():
            if not slot.terminal:
                slot.push(Arrival(ERROR, None, (), error))

    def _closing(self) -> bool:
        """Mark the client closed; whether this call should tear its connection
        down (not when closed already, nor in a forked copy, which must not
        touch the parent's ZeroMQ state)."""
        if self._closed:
            return False
        self._closed = True
        return os.getpid() == self._pid


C = TypeVar("C", bound=Connection)


class OpenStream(Generic[C]):
    """An open stream of ``client``'s, apart from the waiting: it ends with
    exactly one terminal, its END (:attr:`result`, set by the subclass's
    ``_ended``) or an error (raised, and kept in :attr:`error`)."""

    def __init__(self, client: C, cid: int, timeout: float | None, event_type: Any) -> None:
        self._client = client
        self.cid = cid
        self.timeout = timeout
        self._event_type = event_type
        self.error: LlamadError | None = None
        self.finished = False

    def cancel(self) -> None:
        """Stop consuming and ask the actor to stop producing. Idempotent."""
        if not self.finished:
            self._finish()
            self._client._send_cancel(self.cid)

    def _slot(self) -> Slot | None:
        """Where the next answer lands; ``None`` once the stream is over."""
        if self.finished:
            return None
        slot = self._client._slots.get(self.cid)
        if slot is None:
            self.finished = True
        return slot

    def _take(self, arrival: Arrival) -> Any:
        """The event ``arrival`` carries, or :data:`ENDED` once the stream ended
        well; the error that ended it is raised."""
        if arrival.error is not None:
            self._finish()
            self.error = arrival.error
            raise arrival.error
        assert arrival.body is not None
        if arrival.kind == END:
            self._finish()
            self._ended(arrival)
            return ENDED
        return self._event(arrival)

    def _event(self, arrival: Arrival) -> Any:
        raise NotImplementedError

    def _ended(self, arrival: Arrival) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        self.finished = True
        self._client._slots.pop(self.cid, None)

    def __del__(self) -> None:
        # Breaking out of a for loop drops the last reference: the actor
        # must stop producing for a consumer that left.
        if not self.finished:
            with contextlib.suppress(Exception):
                self._client._abandon(self.cid)


def dealer(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, limits: Limits, curve: CurveClient | None
) -> zmq.Socket[bytes]:
    """A client's DEALER socket for ``endpoint``, configured, not yet connected."""
    sock = ctx.socket(zmq.DEALER)
    configure(sock, limits, linger_s=0.0, endpoint=endpoint)
    if endpoint.startswith("tcp://") and curve is not None:
        secure_client(sock, curve)
    sock.setsockopt(zmq.ROUTING_ID, os.urandom(12))
    sock.setsockopt(zmq.RECONNECT_IVL, 20)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
    return sock


def monitor_event(frames: list[bytes]) -> tuple[bool, PermissionDenied | None]:
    """One socket-monitor event: whether the connection is lost, and the refusal
    it reports when the actor refused the handshake."""
    event = int.from_bytes(frames[0][:2], "little")
    if event & HANDSHAKE_FAILED:
        value = int.from_bytes(frames[0][2:6], "little")
        return True, handshake_refusal(event, value, frames[1].decode(errors="replace"))
    return event == zmq.EVENT_DISCONNECTED, None


def cancel_frame(cid: int) -> bytes:
    return encode_envelope(Kind.CANCEL, cid, "", None)


def decode(raw: msgspec.Raw, typ: Any) -> Any:
    """``raw`` decoded (and validated) as ``typ``; ``Any``: as msgpack gives it."""
    decoder = _ANY if typ is Any else _DECODERS.get(typ)
    if decoder is None:
        decoder = _DECODERS[typ] = msgspec.msgpack.Decoder(typ)
    try:
        return decoder.decode(raw)
    except DECODE_ERRORS as exc:
        raise LlamadError(f"malformed answer from the actor: {exc}") from None


def wire_error(raw: msgspec.Raw) -> LlamadError:
    """The typed error an ERROR body carries."""
    try:
        payload = _ANY.decode(raw)
    except DECODE_ERRORS:
        payload = None
    if not isinstance(payload, dict):
        return LlamadError("the actor sent a malformed error")
    return from_wire(payload)
