"""The serving side: an actor owns an endpoint and answers validated requests.

An :class:`Actor` binds one ROUTER socket, checks every inbound message
against the wire format and its op's declared schema, and runs the op's
handler. A handler failure becomes an error reply; the actor keeps serving.

Two ways to run one:

- a plain actor calls :meth:`Actor.serve_forever` (SIGTERM/SIGINT stop it
  cleanly);
- an actor embedded in a loop that does other work (a model worker's tick
  loop, cache-meta with writer threads) calls :meth:`Actor.poll` each
  iteration: ``poll(0)`` handles what is queued without blocking,
  ``poll(timeout)`` sleeps until a message, a timer, a watched fd
  (:meth:`Actor.add_reader`) or :meth:`Actor.wake` (thread- and signal-safe).

Everything else (sending through handles, registering ops) happens on the
thread that started the actor. ZeroMQ state is created in :meth:`start`, in
the process that serves, never inherited across ``fork``.

The actor is the loop and the inbound side (validation, dispatch, streams
run from iterators); its parts live beside it: what it sends, and the
handles' door to that, in :mod:`llamad.actors.outbox`, the clients it knows
in :mod:`llamad.actors.peers`, deferred replies' deadlines in
:mod:`llamad.actors.timers`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Final

import msgspec
import structlog
import zmq

from llamad.actors.curve import CurveServer, ZapHandler, secure_server
from llamad.actors.errors import ActorConfigError, WrongProcess
from llamad.actors.handles import Peer, Request, StreamSender, internal_error
from llamad.actors.monitor import ProcessRef
from llamad.actors.ops import OpKind, OpSpec
from llamad.actors.outbox import SocketOutbox
from llamad.actors.peers import PeerTable
from llamad.actors.registry import Registration, Registry, check_name
from llamad.actors.sockets import (
    FORKS,
    NOBLOCK,
    POLLIN,
    configure,
    restrict_ipc,
    tcp_options,
    validate_endpoint,
)
from llamad.actors.timers import Timers
from llamad.actors.wire import (
    CLIENT_KINDS,
    DECODE_ERRORS,
    ENVELOPE_DECODER,
    HANDSHAKE_REQUIRED,
    PROTOCOL_VERSION,
    Hello,
    Kind,
    Limits,
    Message,
    Rejected,
    Welcome,
    decode_body,
    decode_envelope,
    encode_envelope,
    error_body,
)
from llamad.errors import BadRequest, LlamadError, TooLarge, Unavailable, UnknownOp

__all__ = ["Actor", "ActorStats", "Handler"]

log = structlog.get_logger("llamad.actors")

Handler = Callable[[Request[Any]], Any]
"""A handler takes the validated request and returns the reply body (calls),
an iterator of events or the end body (streams), or ``None`` (casts)."""

_HELLO: Final = msgspec.msgpack.Decoder(Hello)
# Enum attribute access costs a microsecond on the hot path; bind once.
_K_CALL: Final = Kind.CALL
_K_STREAM: Final = Kind.STREAM
_INTAKE_KINDS: Final = frozenset((Kind.CANCEL, Kind.BYE, Kind.HELLO))
_CAST: Final = int(Kind.CAST)
_REPLY: Final = int(Kind.REPLY)
_MAX_BATCH: Final = 256  # messages per poll() before yielding to the owner's loop
_LOG_EVERY_S: Final = 1.0  # rate limit of logs about malformed input, per error code
_PARK_AT: Final = 1000  # backlog length at which an iterator stream pauses
_RESUME_AT: Final = 100  # ... and at which it resumes
_RETRY_S: Final = 0.002  # how soon to retry sending to a full peer queue


@dataclass(slots=True)
class ActorStats:
    """Counters of one actor's life (exposed by the ``$info`` op)."""

    received: int = 0
    replies: int = 0
    errors: int = 0
    events: int = 0
    event_batches: int = 0  # EVENTS messages sent, each carrying 2 or more of the events
    rejected: dict[str, int] = field(default_factory=dict)
    handler_failures: int = 0
    send_dropped: int = 0
    peers_down: int = 0
    peers_expired: int = 0  # of peers_down: released by the idle check
    pings: int = 0  # PINGs the idle check sent to quiet peers still connected


@dataclass(frozen=True, slots=True)
class _Route:
    spec: OpSpec
    handler: Handler
    kind: Kind  # the wire kind requests for this op must have
    # The spec's fields the hot path reads, one attribute lookup away.
    wire_kind: int  # ``kind`` as a plain int
    min_blobs: int
    max_blobs: int
    decoder: msgspec.msgpack.Decoder[Any]


class Actor:
    """A named actor serving ops on one endpoint (see module doc).

    ``endpoint`` defaults to the registry's deterministic ``ipc://`` path for
    ``name``; ``tcp://HOST:0`` binds an ephemeral port (read :attr:`endpoint`
    after :meth:`start`). With ``register=True`` (default) the actor claims
    ``name`` in ``registry`` (default :class:`Registry`) so clients can find
    it by name and follow its restarts.

    ``curve`` makes every ``tcp://`` endpoint of the actor a CURVE server that
    lets in only ``curve.allowed`` client keys (:mod:`llamad.actors.curve`);
    an ``ipc://`` endpoint never uses it. ``tcp_host`` binds a second endpoint,
    ``tcp://<tcp_host>:<ephemeral port>``, beside the first (read
    :attr:`tcp_endpoint` after :meth:`start`; it is in the registry record
    too): how clients on other hosts reach an actor whose own endpoint is ipc.
    """

    def __init__(
        self,
        name: str,
        *,
        endpoint: str | None = None,
        registry: Registry | None = None,
        register: bool = True,
        limits: Limits | None = None,
        curve: CurveServer | None = None,
        tcp_host: str | None = None,
    ) -> None:
        self.name = check_name(name)
        if endpoint is not None:
            validate_endpoint(endpoint)
        elif not register:
            raise ActorConfigError("endpoint", "required when the actor is not registered")
        if tcp_host is not None:
            validate_endpoint(f"tcp://{tcp_host}:0", "tcp_host")
        if curve is not None and not isinstance(curve, CurveServer):
            raise ActorConfigError("curve", "must be a CurveServer")
        self._curve = curve
        self._tcp_host = tcp_host
        self._zap: ZapHandler | None = None
        self.tcp_endpoint = ""
        self.limits = limits or Limits()
        self._endpoint_arg = endpoint
        self._registry = registry
        self._register = register
        self._routes: dict[str, _Route] = {}
        self.stats = ActorStats()
        self.instance = ""
        self.endpoint = ""
        self._late_cancel: Callable[[Peer, int], None] | None = None
        self._pid = 0
        self._forks = FORKS[0]
        self._state = "new"
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._items: list[tuple[Any, int]] = []
        self._probe: list[tuple[Any, int]] = []
        self._items_dirty = True
        # Every plain fd (wake pipe, readers, peers' pidfds) sits in one epoll
        # set, so zmq_poll watches two items however many peers there are.
        self._epoll: select.epoll | None = None
        self._wake_fd = -1  # read end of the wake pipe (in the poll set)
        self._wake_w = -1  # write end: wake(), and the C-level signal wakeup fd
        self._stop_signals: frozenset[int] = frozenset()
        self._readers: dict[int, Callable[[], None]] = {}
        self._registration: Registration | None = None
        self._timers = Timers()
        self._outbox = SocketOutbox(self.name, self.limits, self.stats, self._timers)
        self._peer_table = PeerTable(
            self.name,
            self.stats,
            self._outbox,
            self._timers,
            self.limits,
            fds_changed=self._fds_changed,
        )
        # The parts' state the loop reads on every message or poll, one
        # attribute lookup away (the objects are never replaced).
        self._send = self._outbox.send
        self._peers = self._peer_table.by_ident
        self._watch = self._peer_table.watch
        self._backlogged = self._outbox.backlogged
        self._timer_heap = self._timers.heap
        self._parked: list[tuple[StreamSender, Iterator[Any]]] = []
        self._stop_requested = False
        # Messages read by intake() while the loop was inside a long call,
        # handled first by the next poll(), in arrival order.
        self._stash: list[tuple[bytes, bytes, list[memoryview], int]] = []
        self.interrupt_ops: frozenset[str] = frozenset()
        """Ops that :meth:`intake` handles at once (their handlers only mark work)."""
        self._log_state: dict[str, tuple[float, int]] = {}
        self.add_op(OpSpec("$ping", OpKind.CALL, body=Any), self._op_ping, _builtin=True)
        self.add_op(OpSpec("$info", OpKind.CALL, body=Any), self._op_info, _builtin=True)

    # -- declaration ---------------------------------------------------------

    def add_op(self, spec: OpSpec, handler: Handler, *, _builtin: bool = False) -> None:
        """Serve ``spec`` with ``handler``. Names starting with ``$`` are reserved."""
        if spec.name.startswith("$") and not _builtin:
            raise ActorConfigError("name", f"{spec.name!r}: names starting with '$' are reserved")
        if spec.name in self._routes:
            raise ActorConfigError("name", f"op {spec.name!r} is already declared")
        if spec.max_blobs > self.limits.max_blobs:
            raise ActorConfigError(
                "max_blobs", f"op {spec.name!r} allows more blobs than the actor's limit"
            )
        wire_kind = spec.kind.wire_kind
        self._routes[spec.name] = _Route(
            spec, handler, wire_kind, int(wire_kind), spec.min_blobs, spec.max_blobs, spec.decoder
        )

    def op(
        self, name: str, kind: OpKind | str = OpKind.CALL, *, body: Any = dict[str, Any], **kw: Any
    ) -> Callable[[Handler], Handler]:
        """Decorator form of :meth:`add_op`: ``@actor.op("echo", body=Echo)``."""

        def register(handler: Handler) -> Handler:
            self.add_op(OpSpec(name, OpKind(kind), body=body, **kw), handler)
            return handler

        return register

    def on_peer_down(self, callback: Callable[[Peer, str], None]) -> None:
        """Run ``callback(peer, reason)`` when a client goes away (after its
        open requests were cancelled). Reasons: ``peer_closed`` (it said bye),
        ``peer_died`` (its process exited), ``unreachable`` (a send found no
        connection), ``backpressure`` (it stopped reading), ``idle_expired``
        (quiet for ``Limits.peer_idle_s`` and its connection gone)."""
        self._peer_table.on_down.append(callback)

    def on_late_cancel(self, callback: Callable[[Peer, int], None]) -> None:
        """Run ``callback(peer, cid)`` for a CANCEL of a call with nothing open:
        one answered already, whose client gave up before the answer reached
        it (a call's timeout sends one), or one never seen. An actor whose
        answers hand something out (cache-meta's pins) takes it back here."""
        self._late_cancel = callback

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from :meth:`poll` whenever ``fd`` is readable."""
        self._readers[fd] = callback
        self._items_dirty = True

    def remove_reader(self, fd: int) -> None:
        self._readers.pop(fd, None)
        self._items_dirty = True

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> str:
        """Create the ZeroMQ context and socket here, bind, register; return
        the bound endpoint."""
        if self._state != "new":
            raise RuntimeError(f"actor {self.name!r} is {self._state}, cannot start")
        self._pid = os.getpid()
        self._forks = FORKS[0]
        # os.urandom is what secrets.token_hex reads; ``secrets`` would bring
        # hmac and OpenSSL's libcrypto (~4-6 MB resident in every process, P9).
        self.instance = os.urandom(8).hex()
        registry = self._registry
        if self._register and registry is None:
            registry = self._registry = Registry()
        endpoint = self._endpoint_arg
        if endpoint is None:
            assert registry is not None
            endpoint = registry.ipc_endpoint(self.name)
        if self._register:
            assert registry is not None
            self._registration = registry.claim(self.name)
        try:
            self._ctx = zmq.Context()
            curve = self._curve
            if curve is not None and (_is_tcp(endpoint) or self._tcp_host is not None):
                # Before any CURVE endpoint exists: without a ZAP handler
                # libzmq would let in every client that knows our public key.
                self._zap = ZapHandler(self._ctx, curve, self.name)
                self._zap.start()
            sock = self._ctx.socket(zmq.ROUTER)
            self._sock = self._outbox.sock = sock
            configure(sock, self.limits, linger_s=self.limits.linger_s, endpoint=endpoint)
            if curve is not None and _is_tcp(endpoint):
                secure_server(sock, curve)
            sock.bind(endpoint)
            self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            restrict_ipc(self.endpoint)
            if self._tcp_host is not None:
                self.tcp_endpoint = self._bind_tcp(sock, self._tcp_host)
            self._wake_fd, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            if self._registration is not None:
                self._registration.publish(self.endpoint, self.instance, self.tcp_endpoint)
        except BaseException:
            self._teardown()
            raise
        self._state = "running"
        log.info(
            "actor.started",
            actor=self.name,
            endpoint=self.endpoint,
            tcp_endpoint=self.tcp_endpoint or None,
            curve=self._zap is not None,
            pid=self._pid,
            instance=self.instance,
        )
        return self.endpoint

    def _bind_tcp(self, sock: zmq.Socket[bytes], host: str) -> str:
        """Bind the second, tcp, endpoint; its options apply to it alone, as
        libzmq copies them into each endpoint when it binds."""
        endpoint = f"tcp://{host}:0"
        tcp_options(sock, endpoint)
        if self._curve is not None:
            secure_server(sock, self._curve)
        sock.bind(endpoint)
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    def request_stop(self) -> None:
        """Ask :meth:`serve_forever` to return (thread- and signal-safe)."""
        self._stop_requested = True
        self.wake()

    @property
    def stop_requested(self) -> bool:
        return self._stop_requested

    def wake(self) -> None:
        """Interrupt a blocking :meth:`poll` (thread- and signal-safe)."""
        if self._wake_w >= 0:
            # A full pipe already guarantees a wakeup.
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"\0")

    def serve_forever(self, *, handle_signals: bool = True) -> None:
        """Serve until :meth:`request_stop` (or SIGTERM/SIGINT), then close."""
        if self._state == "new":
            self.start()
        restore = self.stop_on_signals() if handle_signals else None
        try:
            while not self._stop_requested:
                self.poll(None)
        finally:
            if restore is not None:
                restore()
            self.close()

    def stop_on_signals(
        self, signals: Sequence[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> Callable[[], None]:
        """Make ``signals`` request a stop; return a function that undoes it.

        Call from the main thread after :meth:`start`. Besides installing
        handlers that set the flag, the actor's wake pipe becomes Python's
        signal wakeup fd: the C-level handler writes the signal number into
        it, so a :meth:`poll` blocked in ``zmq_poll`` wakes even when the
        signal lands just before the poll starts, or on another thread,
        where a Python-level handler alone would not run until something
        else woke the loop. (There is one wakeup fd per process; the
        previous one is restored.)
        """
        if threading.current_thread() is not threading.main_thread():
            return lambda: None
        previous = {sig: signal.signal(sig, self._on_signal) for sig in signals}
        previous_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        self._stop_signals = frozenset(int(sig) for sig in signals)

        def restore() -> None:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop_signals = frozenset()

        return restore

    def close(self) -> None:
        """Fail what is still open, close the socket, then the context. Idempotent."""
        if self._state != "running":
            self._teardown()
            return
        self._check_process()
        self._state = "closing"
        stopping = Unavailable(f"actor {self.name!r} is stopping")
        for peer in list(self._peers.values()):
            for handle in list(peer.open.values()):
                handle.fail(stopping)
        self._teardown()
        log.info("actor.stopped", actor=self.name, pid=self._pid, instance=self.instance)

    def __enter__(self) -> Actor:
        if self._state == "new":
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def peers(self) -> list[Peer]:
        """Connected clients that completed the handshake."""
        return list(self._peers.values())

    def batched(self) -> contextlib.AbstractContextManager[None]:
        """A block whose stream events leave as one message per client, at its
        end, to each client that reads batches (see
        :meth:`~llamad.actors.outbox.SocketOutbox.batched`). For code on the
        actor's thread that emits several events in one go: the model
        worker's delivery of a tick."""
        return self._outbox.batched()

    # -- the loop step -------------------------------------------------------

    def poll(self, timeout: float | None = 0.0) -> int:
        """Handle what is pending, waiting up to ``timeout`` seconds (``None``:
        until something happens) if nothing is; return messages handled."""
        if self._forks != FORKS[0]:
            self._check_process()
        if self._state != "running":
            raise RuntimeError(f"actor {self.name!r} is not running")
        if self._backlogged:
            self._outbox.flush()
        if self._parked:
            self._resume_parked()
        handled = 0
        if self._stash:
            handled = self._handle_stash()
            timeout = 0.0
        if self._items_dirty:
            self._rebuild_items()
        # One zmq_poll covers the socket and the epoll set of the wake fd,
        # readers and the clients' pidfds; it returns at once when anything
        # is pending.
        ready = zmq.zmq_poll(self._items, self._wait_ms(timeout))
        fds: list[int] = []
        for item, _ in ready:
            if item is self._sock:
                # After a blocking wait, one message and back: the next
                # poll's zmq_poll returns at once if more are queued, so a
                # zero-timeout probe per message would be pure overhead.
                # poll(0) from a tick loop drains everything queued.
                handled += self._drain(_MAX_BATCH if timeout == 0 else 1)
            else:
                assert self._epoll is not None
                for fd, _ in self._epoll.poll(0):
                    if fd == self._wake_fd:
                        self._read_wake_pipe()
                    elif fd in self._readers:
                        self._run_reader(fd)
                    else:
                        fds.append(fd)
        if fds or self._watch.poll_interval() is not None:
            self._peer_table.exited(self._watch.exited(fds))
        if self._timer_heap:
            self._timers.fire()
        return handled

    def intake(self) -> None:
        """Look at what is pending while the loop is inside a long call (a
        model worker's decode, from its abort check), on the loop's thread.

        Interrupts are acted on now: a client's HELLO, CANCEL or BYE, a call
        of an op in :attr:`interrupt_ops`, a stop signal, and (when nothing is kept)
        clients that exited; their callbacks must only mark work for later.
        Every other message is read and kept, in order, for the next
        :meth:`poll` to handle; so is every later message of a client with
        one kept, so that a client's messages keep their order (a cancel of
        a request kept unhandled reaches it after it). Readers and timers
        wait for :meth:`poll`.
        """
        if self._state != "running" or self._forks != FORKS[0]:
            return
        if self._items_dirty:
            self._rebuild_items()
        fds: list[int] = []
        for item, _ in zmq.zmq_poll(self._items, 0):
            if item is self._sock:
                self._intake_socket()
            else:
                assert self._epoll is not None
                for fd, _ in self._epoll.poll(0):
                    if fd == self._wake_fd:
                        self._read_wake_pipe()
                    elif fd not in self._readers:
                        fds.append(fd)
        if fds and not self._stash:
            self._peer_table.exited(self._watch.exited(fds))

    def _intake_socket(self) -> None:
        sock = self._sock
        assert sock is not None
        max_blobs = self.limits.max_blobs
        kept = {entry[0] for entry in self._stash}
        while True:
            try:
                ident = sock.recv(NOBLOCK)
            except zmq.Again:
                return
            frame = sock.recv(NOBLOCK, copy=False)
            header = frame.bytes
            blobs: list[memoryview] = []
            extra = 0
            while frame.more:
                frame = sock.recv(NOBLOCK, copy=False)
                if len(blobs) < max_blobs:
                    blobs.append(frame.buffer)
                else:
                    extra += 1
            if ident not in kept and not extra and self._interrupts(header):
                self.stats.received += 1
                try:
                    self._handle(ident, header, blobs, extra)
                except Exception as exc:
                    log.exception("actor.inbound_failed", actor=self.name)
                    self._refuse(ident, 0, None, internal_error(exc, "?"))
            else:
                kept.add(ident)
                self._stash.append((ident, header, blobs, extra))

    def _interrupts(self, header: bytes) -> bool:
        if len(header) > self.limits.max_header_bytes:
            return False
        try:
            version, kind, _, op, _ = ENVELOPE_DECODER.decode(header)
        except DECODE_ERRORS:
            return False
        if version != PROTOCOL_VERSION:
            return False
        # HELLO too: a client that connects during a long call to cancel
        # would otherwise wait out its handshake (it touches no op's state).
        return kind in _INTAKE_KINDS or (kind == _K_CALL and op in self.interrupt_ops)

    def _handle_stash(self) -> int:
        stash, self._stash = self._stash, []
        for ident, header, blobs, extra in stash:
            self.stats.received += 1
            try:
                self._handle(ident, header, blobs, extra)
            except Exception as exc:
                log.exception("actor.inbound_failed", actor=self.name)
                self._refuse(ident, 0, None, internal_error(exc, "?"))
        return len(stash)

    def _wait_ms(self, timeout: float | None) -> int:
        if timeout is not None and timeout <= 0:
            return 0
        budget = timeout
        if self._timer_heap:
            until = max(0.0, self._timer_heap[0][0] - time.monotonic())
            budget = until if budget is None else min(budget, until)
        interval = self._watch.poll_interval()
        if self._backlogged or self._parked:
            interval = _RETRY_S if interval is None else min(interval, _RETRY_S)
        if interval is not None:
            budget = interval if budget is None else min(budget, interval)
        return -1 if budget is None else max(0, int(budget * 1000 + 0.999))

    def _rebuild_items(self) -> None:
        assert self._sock is not None
        # A fresh set rather than a diff: a pidfd closed since the last
        # rebuild has left the old set by itself, and its number may already
        # belong to a new one.
        if self._epoll is not None:
            self._epoll.close()
        self._epoll = select.epoll()
        for fd in {self._wake_fd, *self._readers, *self._watch.fds()}:
            self._epoll.register(fd, select.EPOLLIN)
        self._items = [(self._sock, POLLIN), (self._epoll.fileno(), POLLIN)]
        self._probe = [(self._sock, POLLIN)]
        self._items_dirty = False

    def _read_wake_pipe(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while data := os.read(self._wake_fd, 4096):
                # Bytes other than 0 are signal numbers written by the C-level
                # handler (see stop_on_signals).
                if self._stop_signals.intersection(data):
                    self._stop_requested = True
                if len(data) < 4096:
                    break

    def _run_reader(self, fd: int) -> None:
        try:
            self._readers[fd]()
        except Exception:
            log.exception("actor.reader_failed", actor=self.name, fd=fd)

    def _drain(self, batch: int) -> int:
        sock = self._sock
        assert sock is not None
        max_blobs = self.limits.max_blobs
        probe = self._probe
        recv = sock.recv
        handled = 0
        while True:
            try:
                ident = recv(NOBLOCK)
            except zmq.Again:
                break
            # A ROUTER message always has a part after the routing id.
            frame = recv(NOBLOCK, copy=False)
            # A small header is cheaper to copy out than to view.
            header = frame.bytes
            blobs: list[memoryview] = []
            extra = 0
            # Every part of a multipart message must be read even when the
            # message is refused, or it would poison the next one.
            while frame.more:
                frame = recv(NOBLOCK, copy=False)
                if len(blobs) < max_blobs:
                    blobs.append(frame.buffer)
                else:
                    extra += 1
            handled += 1
            self.stats.received += 1
            try:
                self._handle(ident, header, blobs, extra)
            except Exception as exc:
                # Defense in depth: validation should have refused anything
                # that can reach here, but no input may stop the actor.
                log.exception("actor.inbound_failed", actor=self.name)
                self._refuse(ident, 0, None, internal_error(exc, "?"))
            # A zero-timeout poll is far cheaper in pyzmq than the Again
            # exception an empty recv raises.
            if handled >= batch or not zmq.zmq_poll(probe, 0):
                break
        return handled

    # -- inbound -------------------------------------------------------------

    def _handle(
        self, ident: bytes, header: bytes | memoryview, blobs: list[memoryview], extra: int
    ) -> None:
        # The checks of decode_envelope, inline for a well-formed header; it
        # runs them again, in order, to refuse anything else.
        version = -1
        if len(header) <= self.limits.max_header_bytes:
            try:
                version, kind, cid, op, raw = ENVELOPE_DECODER.decode(header)
            except DECODE_ERRORS:
                version = -1
        if version != PROTOCOL_VERSION or kind not in CLIENT_KINDS:
            try:
                _, kind, cid, op, raw = decode_envelope(
                    header, self.limits.max_header_bytes, CLIENT_KINDS
                )
            except Rejected as rej:
                self._refuse(ident, rej.cid, rej.kind, rej.error)
                return
        peer = self._peers.get(ident)
        route = self._routes.get(op)
        # Fast path for a well-formed request from a known peer; everything
        # else (control messages, every refusal) goes through _handle_other,
        # which checks in the documented order.
        if (
            extra
            or peer is None
            or route is None
            or route.wire_kind != kind
            or not route.min_blobs <= len(blobs) <= route.max_blobs
            or (kind != _CAST and (cid == 0 or cid in peer.open))
        ):
            self._handle_other(
                ident,
                kind,
                cid,
                op=op,
                raw=raw,
                peer=peer,
                route=route,
                nblobs=len(blobs),
                extra=extra,
            )
            return
        # What the idle check reads (peers.py): no clock on a message's path.
        peer.heard = True
        try:
            body = decode_body(raw, route.decoder)
        except BadRequest as exc:
            self._refuse(ident, cid, kind, exc)
            return
        self._dispatch(
            route,
            Request(self._outbox, peer, route.kind, cid, op, body=body, blobs=tuple(blobs)),
        )

    def _handle_other(
        self,
        ident: bytes,
        kind: int,
        cid: int,
        *,
        op: str,
        raw: msgspec.Raw,
        peer: Peer | None,
        route: _Route | None,
        nblobs: int,
        extra: int,
    ) -> None:
        if peer is not None:
            peer.heard = True
        if extra:
            self._refuse(
                ident,
                cid,
                kind,
                TooLarge(
                    f"{nblobs + extra} binary frames exceed the limit of {self.limits.max_blobs}",
                    details={"limit": self.limits.max_blobs},
                ),
            )
        elif kind == Kind.HELLO:
            self._hello(ident, cid, raw)
        elif kind == Kind.CANCEL:
            if peer is not None and (handle := peer.open.get(cid)) is not None:
                handle._cancel("cancelled")
            elif peer is not None and self._late_cancel is not None:
                self._late_cancel(peer, cid)
        elif kind == Kind.BYE:
            if peer is not None:
                self._peer_table.gone(peer, "peer_closed")
        elif peer is None:
            self._refuse(
                ident,
                cid,
                kind,
                BadRequest(
                    "no handshake: send HELLO first",
                    details={"reason": HANDSHAKE_REQUIRED},
                ),
            )
        elif route is None:
            self._refuse(ident, cid, kind, UnknownOp(f"unknown op {op!r}", details={"op": op}))
        elif route.wire_kind != kind:
            self._refuse(
                ident,
                cid,
                kind,
                BadRequest(f"op {op!r} is a {route.spec.kind} op, not {Kind(kind).name.lower()}"),
            )
        elif not route.spec.min_blobs <= nblobs <= route.spec.max_blobs:
            spec = route.spec
            self._refuse(
                ident,
                cid,
                kind,
                BadRequest(
                    f"op {op!r} takes {spec.min_blobs}..{spec.max_blobs} binary frames, "
                    f"got {nblobs}"
                ),
            )
        else:
            self._refuse(ident, cid, kind, BadRequest(f"correlation id {cid} is 0 or in use"))

    def _dispatch(self, route: _Route, req: Request[Any]) -> None:
        try:
            result = route.handler(req)
            if req.kind is _K_CALL:
                if req._handle is None:  # not deferred: the result is the reply
                    if isinstance(result, Message):
                        self._send(req.peer, _REPLY, req.cid, result.body, result.blobs, op=req.op)
                    else:
                        self._send(req.peer, _REPLY, req.cid, result, (), op=req.op)
            elif req.kind is _K_STREAM:
                took_sender = req.handle is not None
                if isinstance(result, Iterator):
                    self._run_stream(req.stream(), result)
                elif not took_sender:
                    # The handler finished the stream by returning: the value
                    # is the terminal body. Taking the sender means "later".
                    self._send_end(req.stream(), result)
        except Exception as exc:
            self._handler_failed(req, exc)

    def _run_stream(self, sender: StreamSender, events: Iterator[Any]) -> None:
        """Drain a handler's event iterator into its stream.

        When the client reads slower than the iterator produces, the stream
        is parked and resumed from :meth:`poll` once the peer's queue has
        drained, so a slow or stuck consumer neither blocks the loop nor
        makes the actor buffer the whole stream.
        """
        finished = True
        try:
            while not sender.done:
                if len(sender.peer.backlog) >= _PARK_AT:
                    self._parked.append((sender, events))
                    finished = False
                    return
                try:
                    item = next(events)
                except StopIteration as stop:
                    self._send_end(sender, stop.value)
                    return
                if isinstance(item, Message):
                    sender.emit(item.body, item.blobs)
                else:
                    sender.emit(item)
        except Exception as exc:
            self._stream_failed(sender, exc)
        finally:
            if finished:
                close = getattr(events, "close", None)
                if close is not None:
                    close()

    def _resume_parked(self) -> None:
        parked, self._parked = self._parked, []
        for sender, events in parked:
            if sender.done or len(sender.peer.backlog) < _RESUME_AT:
                self._run_stream(sender, events)
            else:
                self._parked.append((sender, events))

    def _stream_failed(self, sender: StreamSender, exc: Exception) -> None:
        if isinstance(exc, LlamadError):
            err = exc
        else:
            self.stats.handler_failures += 1
            err = internal_error(exc, sender.op)
            log.error(
                "actor.handler_failed",
                actor=self.name,
                op=sender.op,
                error=err.message,
                exc_info=exc,
            )
        sender.fail(err)

    def _send_end(self, sender: StreamSender, result: Any) -> None:
        if isinstance(result, Message):
            sender.end(result.body, result.blobs)
        else:
            sender.end(result)

    def _handler_failed(self, req: Request[Any], exc: Exception) -> None:
        if isinstance(exc, LlamadError):
            err = exc
            log.info(
                "actor.handler_refused",
                actor=self.name,
                op=req.op,
                code=err.code,
                error=err.message,
            )
        else:
            self.stats.handler_failures += 1
            err = internal_error(exc, req.op)
            log.error(
                "actor.handler_failed", actor=self.name, op=req.op, error=err.message, exc_info=exc
            )
        if req.kind == Kind.CAST:
            return
        handle = req.handle
        if handle is None:
            self._outbox.send_error(req.peer, req.cid, err)
        elif not handle.done:
            handle.fail(err)

    def _hello(self, ident: bytes, cid: int, raw: msgspec.Raw) -> None:
        try:
            hello = decode_body(raw, _HELLO)
        except BadRequest as exc:
            self._refuse(ident, cid, Kind.HELLO, exc)
            return
        ref = ProcessRef(hello.pid, hello.start_ticks, hello.boot_id, hello.pidns)
        try:
            peer = self._peer_table.admit(ident, ref, hello.name, batches=hello.batches)
        except Unavailable as exc:  # too many peers
            self._refuse(ident, cid, Kind.HELLO, exc)
            return
        if peer is None:
            self._refuse(ident, cid, Kind.HELLO, BadRequest(f"no live process {hello.pid}"))
            return
        me = ProcessRef.current()
        welcome = Welcome(
            name=self.name,
            instance=self.instance,
            pid=me.pid,
            start_ticks=me.start_ticks,
            boot_id=me.boot_id,
            pidns=me.pidns,
            max_frame_bytes=self.limits.max_frame_bytes,
            max_header_bytes=self.limits.max_header_bytes,
            max_blobs=self.limits.max_blobs,
            ops={name: str(r.spec.kind) for name, r in self._routes.items()},
        )
        self._send(peer, Kind.REPLY, cid, welcome, (), op="$hello")
        log.debug("actor.peer_up", actor=self.name, peer_pid=ref.pid, peer=hello.name)

    def _fds_changed(self) -> None:
        self._items_dirty = True

    # -- refusals ------------------------------------------------------------

    def _refuse(self, ident: bytes, cid: int, kind: int | None, error: LlamadError) -> None:
        counts = self.stats.rejected
        counts[error.code] = counts.get(error.code, 0) + 1
        self._log_limited("actor.rejected", error.code, error=error.message)
        if kind in (Kind.CAST, Kind.CANCEL, Kind.BYE):
            return  # the sender expects no answer to these
        self.stats.errors += 1
        header = encode_envelope(Kind.ERROR, cid, "", error_body(error))
        if self._outbox.send_raw(ident, header, (), None) is None:
            self.stats.send_dropped += 1  # an unknown peer that does not read gets nothing

    def _log_limited(self, event: str, key: str, **fields: Any) -> None:
        now = time.monotonic()
        last, suppressed = self._log_state.get(key, (0.0, 0))
        if now - last < _LOG_EVERY_S:
            self._log_state[key] = (last, suppressed + 1)
            return
        self._log_state[key] = (now, 0)
        log.warning(event, actor=self.name, code=key, suppressed=suppressed, **fields)

    # -- built-in ops --------------------------------------------------------

    def _op_ping(self, req: Request[Any]) -> dict[str, Any]:
        return {"pid": self._pid, "instance": self.instance, "name": self.name}

    def _op_info(self, req: Request[Any]) -> dict[str, Any]:
        s = self.stats
        return {
            "name": self.name,
            "instance": self.instance,
            "pid": self._pid,
            "endpoint": self.endpoint,
            "tcp_endpoint": self.tcp_endpoint,
            "peers": len(self._peers),
            "open": self._peer_table.open_count(),
            "peer_idle_s": self.limits.peer_idle_s,
            "ops": {n: str(r.spec.kind) for n, r in self._routes.items()},
            "stats": {
                "received": s.received,
                "replies": s.replies,
                "errors": s.errors,
                "events": s.events,
                "event_batches": s.event_batches,
                "rejected": dict(s.rejected),
                "handler_failures": s.handler_failures,
                "send_dropped": s.send_dropped,
                "peers_down": s.peers_down,
                "peers_expired": s.peers_expired,
                "pings": s.pings,
            },
        }

    # -- internals -----------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.request_stop()

    def _check_process(self) -> None:
        if self._pid and os.getpid() != self._pid:
            raise WrongProcess(
                f"actor {self.name!r} was started in pid {self._pid}; ZeroMQ state "
                "cannot be used after fork"
            )

    def _teardown(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=round(self.limits.linger_s * 1000))
            self._sock = None
        if self._zap is not None:
            self._zap.stop()  # its socket closes first: term() waits for every socket
            self._zap = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
            self._items_dirty = True
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            os.close(self._wake_w)
            self._wake_fd = self._wake_w = -1
        self._peer_table.close()
        if self._registration is not None:
            self._registration.release()
            self._registration = None
        self._timers.clear()
        self._outbox.clear()
        for _, events in self._parked:
            close = getattr(events, "close", None)
            if close is not None:
                close()
        self._parked.clear()
        self._state = "closed"


def _is_tcp(endpoint: str) -> bool:
    return endpoint.startswith("tcp://")
