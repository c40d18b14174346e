"""Everything an actor sends: :class:`Outbox` (the handles' door) and :class:`SocketOutbox`.

A handle (:mod:`llamad.actors.handles`) answers through the narrow
:class:`Outbox` protocol: send one reply, event or end; send an error;
schedule its own timeout. :class:`SocketOutbox` is the actor's one
implementation, over its ROUTER socket:

- a message goes out in two non-blocking sends when the peer's queue has
  room and nothing is waiting ahead of it (the common case, on every
  token's path);
- otherwise it joins the peer's ordered backlog, which the actor's loop
  retries (:meth:`SocketOutbox.flush`) until it drains; a peer whose backlog
  passes ``Limits.max_backlog`` is dropped as stuck (``backpressure``), and
  one the socket no longer routes to is dropped as ``unreachable``: both go
  to the peer table through :attr:`SocketOutbox.lost`;
- a ``PING`` asks whether a quiet peer's connection is still there
  (:meth:`SocketOutbox.probe`, for the peer table's idle check);
- inside :meth:`SocketOutbox.batched` (the model worker's delivery of one
  tick), the EVENTs for a peer that reads ``EVENTS`` are held and leave as
  one message per peer when the block ends: a gateway with 16 streams on one
  worker gets one message a tick, not 16 (one send and one wake-up of each
  side's I/O thread, one receive, instead of one per stream). Anything else
  for that peer sends its held events first, so its order is unchanged;
- a body that cannot be encoded becomes an ``internal`` error to the peer
  (and ends the stream it was for).

Everything runs on the actor's thread.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec
import structlog
import zmq

from llamad.actors.sockets import SNDMORE, SNDMORE_NOBLOCK, send_frame
from llamad.actors.wire import (
    MAX_BATCH_EVENTS,
    Blob,
    Kind,
    Limits,
    encode_envelope,
    error_body,
)
from llamad.errors import BadRequest, LlamadError

if TYPE_CHECKING:
    from llamad.actors.actor import ActorStats
    from llamad.actors.handles import Peer, PendingReply, StreamSender
    from llamad.actors.timers import Timers

__all__ = ["Outbox", "SocketOutbox"]

log = structlog.get_logger("llamad.actors")

_EVENT: Final = int(Kind.EVENT)
_EVENTS: Final = int(Kind.EVENTS)
_PING: Final = encode_envelope(Kind.PING, 0, "", None)
_BODY: Final = msgspec.msgpack.Encoder()


class Outbox(Protocol):
    """What a handle needs from its actor (the handles' only door to it)."""

    def send(
        self,
        peer: Peer,
        kind: int,
        cid: int,
        body: Any,
        blobs: Sequence[Blob],
        *,
        op: str,
        stream: StreamSender | None = None,
    ) -> bool:
        """Send one ``REPLY``, ``EVENT`` or ``END`` for request ``cid`` of ``peer``;
        ``False`` if it could not be (the peer is gone, or the body could not
        be encoded: then ``stream``, if given, is closed and an error goes
        out instead)."""
        ...

    def send_error(self, peer: Peer, cid: int, error: LlamadError) -> bool:
        """Send an ``ERROR`` answering request ``cid`` of ``peer``."""
        ...

    def schedule(self, delay: float, handle: PendingReply) -> None:
        """Expire ``handle`` after ``delay`` seconds unless it is answered first."""
        ...


def _encoded(body: Any) -> msgspec.Raw | None:
    """``body`` as msgpack, or ``None`` when it cannot be (the caller then takes
    the path that reports it)."""
    try:
        return msgspec.Raw(_BODY.encode(body))
    except (TypeError, ValueError, OverflowError, msgspec.EncodeError):
        return None


def _no_peer_table(peer: Peer, reason: str) -> None:
    raise RuntimeError("the outbox has no peer table")


class SocketOutbox:
    """The actor's sending side (see module doc).

    ``sock`` is the actor's ROUTER socket while it runs (``None`` before and
    after). ``backlogged`` holds the peers with a non-empty backlog; the loop
    checks it on every poll. ``lost(peer, reason)`` forgets a peer a send
    found unreachable or stuck; the peer table sets it.
    """

    __slots__ = (
        "_held",
        "_limits",
        "_name",
        "_pending",
        "_stats",
        "_timers",
        "backlogged",
        "lost",
        "sock",
    )

    def __init__(self, name: str, limits: Limits, stats: ActorStats, timers: Timers) -> None:
        self._name = name
        self._limits = limits
        self._stats = stats
        self._timers = timers
        self.sock: zmq.Socket[bytes] | None = None
        self.backlogged: set[Peer] = set()
        self.lost: Callable[[Peer, str], None] = _no_peer_table
        self._held = 0  # depth of batched() blocks
        # Per peer, the events held in a batched() block: (cid, encoded body).
        self._pending: dict[Peer, list[tuple[int, msgspec.Raw]]] = {}

    @contextmanager
    def batched(self) -> Iterator[None]:
        """Hold the EVENTs sent in the block to peers that read ``EVENTS``;
        when the outermost block ends, each such peer gets its held events in
        one message (one event alone goes as a plain ``EVENT``). Events with
        blobs, and peers that did not say they read batches, are not held."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._pending:
                for peer in list(self._pending):
                    self._release(peer)

    # -- the handles' door (Outbox) ------------------------------------------

    def send(
        self,
        peer: Peer,
        kind: int,
        cid: int,
        body: Any,
        blobs: Sequence[Blob],
        *,
        op: str,
        stream: StreamSender | None = None,
    ) -> bool:
        if self._held and kind == _EVENT and peer.batches and not blobs:
            raw = _encoded(body)
            if raw is not None:
                return self._hold(peer, cid, raw)
            # Not encodable: answered below, as outside a batch.
        if self._pending and peer in self._pending:
            self._release(peer)  # what was held for it goes first
        try:
            header = encode_envelope(kind, cid, "", body)
        # BadRequest: text that is not Unicode (encode_envelope refuses it).
        except (TypeError, ValueError, OverflowError, msgspec.EncodeError, BadRequest) as exc:
            self._stats.handler_failures += 1
            log.error(
                "actor.unencodable", actor=self._name, op=op, kind=Kind(kind).name, error=str(exc)
            )
            err = LlamadError(f"{op}: the answer could not be encoded: {exc}", details={"op": op})
            if stream is not None:
                stream._close()
            self.send_error(peer, cid, err)
            return False
        if kind == _EVENT:
            self._stats.events += 1
        else:
            self._stats.replies += 1
        if not blobs:
            return self._send_header(peer, header)
        return self._send_or_queue(peer, header, blobs)

    def send_error(self, peer: Peer, cid: int, error: LlamadError) -> bool:
        if self._pending and peer in self._pending:
            self._release(peer)
        self._stats.errors += 1
        header = encode_envelope(Kind.ERROR, cid, "", error_body(error))
        return self._send_or_queue(peer, header, ())

    def schedule(self, delay: float, handle: PendingReply) -> None:
        self._timers.add(delay, handle)

    # -- the actor's side ----------------------------------------------------

    def flush(self) -> None:
        """Send what the peers' backlogs hold, in order, as far as their queues take it."""
        for peer in list(self.backlogged):
            backlog = peer.backlog
            while backlog and peer.connected:
                header, blobs = backlog[0]
                sent = self.send_raw(peer.routing_id, header, blobs, peer)
                if sent is None:
                    break
                backlog.popleft()
            if not backlog or not peer.connected:
                self.backlogged.discard(peer)

    def forget(self, peer: Peer) -> None:
        """Drop whatever ``peer`` still had queued (it is gone)."""
        peer.backlog.clear()
        self.backlogged.discard(peer)
        self._pending.pop(peer, None)

    def send_raw(
        self, ident: bytes, header: bytes, blobs: Sequence[Blob], peer: Peer | None
    ) -> bool | None:
        """Send one message to routing id ``ident`` now: ``True`` sent,
        ``False`` unreachable (``peer``, if given, is then lost), ``None`` its
        queue is full."""
        sock = self.sock
        assert sock is not None
        try:
            send_frame(sock, ident, SNDMORE_NOBLOCK)
        except zmq.ZMQError as exc:
            if exc.errno == errno.EHOSTUNREACH:
                if peer is not None:
                    self.lost(peer, "unreachable")
                return False
            if exc.errno == errno.EAGAIN:
                return None
            raise
        # After the routing frame is accepted the rest of the message cannot
        # fail: ZeroMQ queues multipart messages atomically.
        if not blobs:
            send_frame(sock, header, 0)
            return True
        send_frame(sock, header, SNDMORE)
        last = len(blobs) - 1
        for i, blob in enumerate(blobs):
            send_frame(sock, blob, 0 if i == last else SNDMORE, False)
        return True

    def probe(self, peer: Peer) -> bool | None:
        """Send ``peer`` a ``PING``, the idle check's question to its connection:
        ``True`` it went out (the connection is there), ``False`` the socket
        no longer routes to it (gone; the caller decides what that means),
        ``None`` no answer now (its queue is full, or a backlog ahead of it is
        being retried, whose own sends will tell)."""
        if peer.backlog or not peer.connected or self.sock is None:
            return None
        return self.send_raw(peer.routing_id, _PING, (), None)

    def clear(self) -> None:
        """Forget the socket and every backlog (the actor is closing)."""
        self.sock = None
        self.backlogged.clear()
        self._pending.clear()

    # -- batches -------------------------------------------------------------

    def _hold(self, peer: Peer, cid: int, raw: msgspec.Raw) -> bool:
        held = self._pending.get(peer)
        if held is None:
            held = self._pending[peer] = []
        held.append((cid, raw))
        self._stats.events += 1
        if len(held) >= MAX_BATCH_EVENTS:
            self._release(peer)
        return True

    def _release(self, peer: Peer) -> None:
        """Send what is held for ``peer``: one ``EVENT``, or one ``EVENTS``."""
        held = self._pending.pop(peer, None)
        if not held:
            return
        if len(held) == 1:
            cid, raw = held[0]
            header = encode_envelope(_EVENT, cid, "", raw)
        else:
            header = encode_envelope(_EVENTS, 0, "", held)
            self._stats.event_batches += 1
        self._send_header(peer, header)

    def _send_header(self, peer: Peer, header: bytes) -> bool:
        """A message without blobs: in two sends when the peer's queue has room
        and nothing waits ahead of it (the common case, on every token's path);
        on any refusal the general path tries again and handles it (nothing
        was queued)."""
        sock = self.sock
        if not peer.backlog and peer.connected and sock is not None:
            try:
                send_frame(sock, peer.routing_id, SNDMORE_NOBLOCK)
            except zmq.ZMQError:
                pass
            else:
                send_frame(sock, header, 0)
                return True
        return self._send_or_queue(peer, header, ())

    def _send_or_queue(self, peer: Peer, header: bytes, blobs: Sequence[Blob]) -> bool:
        if not peer.connected or self.sock is None:
            return False
        if not peer.backlog:
            sent = self.send_raw(peer.routing_id, header, blobs, peer)
            if sent is not None:
                return sent
        # The peer's ZeroMQ queue is full (or already has a backlog ahead of
        # this message): keep order by queueing here, up to a bound.
        if len(peer.backlog) >= self._limits.max_backlog:
            self._stats.send_dropped += 1
            log.warning(
                "actor.peer_stuck", actor=self._name, peer_pid=peer.process.pid, peer=peer.name
            )
            self.lost(peer, "backpressure")
            return False
        peer.backlog.append((header, tuple(blobs)))
        self.backlogged.add(peer)
        return True
