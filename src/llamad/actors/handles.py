"""What a handler sees: the request, its peer, and handles to answer later.

A handler that can answer at once just returns the reply body (or a
:class:`~llamad.actors.wire.Message` with blobs). A handler that cannot —
cache-meta's ``lookup_exact_or_wait``, a model worker's ``infer`` — takes a
handle and returns; the owner's loop answers through the handle later:

- :meth:`Request.defer` → :class:`PendingReply` (``reply`` / ``fail``), with
  an optional timeout the runtime enforces;
- :meth:`Request.stream` → :class:`StreamSender` (``emit`` … then exactly one
  ``end`` or ``fail``).

Open handles belong to their peer: when the client cancels, closes, dies or
becomes unreachable, every handle it had is cancelled and its ``on_cancel``
callbacks run (this is how a model worker learns to stop generating for a
client that went away). After that, sending through the handle is a no-op
returning ``False``.

A handle sends through its actor's :class:`~llamad.actors.outbox.Outbox`
(replies, events, errors, its own timeout) and knows nothing else of the
actor.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import structlog

from llamad.actors.monitor import ProcessRef
from llamad.actors.wire import Blob, Kind
from llamad.errors import LlamadError, RequestTimeout

if TYPE_CHECKING:
    from llamad.actors.outbox import Outbox

__all__ = ["Peer", "PendingReply", "Request", "StreamSender", "internal_error"]

log = structlog.get_logger("llamad.actors")

B = TypeVar("B")

_REPLY: Final = int(Kind.REPLY)
_EVENT: Final = int(Kind.EVENT)
_END: Final = int(Kind.END)


@dataclass(eq=False, slots=True)
class Peer:
    """One connected client (one client socket, not one process).

    ``process`` is the client's process as it introduced itself in the
    handshake; ``local`` says whether the actor watches that process (same
    host and pid namespace). ``open`` maps correlation ids to the peer's
    unanswered deferred replies and streams; ``backlog`` holds messages that
    did not fit the peer's ZeroMQ queue, sent in order as it drains.
    ``heard`` is set by every message from the peer and ``seen`` is when the
    peer table last found it so, or found its connection there: the idle
    check's state (:mod:`llamad.actors.peers`). ``batches``: the client said in
    its handshake that it reads ``EVENTS`` (:attr:`llamad.actors.wire.Hello.batches`).
    """

    routing_id: bytes
    process: ProcessRef
    name: str
    local: bool
    open: dict[int, _Open] = field(default_factory=dict)
    connected: bool = True
    backlog: deque[tuple[bytes, tuple[Blob, ...]]] = field(default_factory=deque)
    heard: bool = True
    seen: float = 0.0
    batches: bool = False


class _Open:
    """Common part of an unanswered request: cancellation and bookkeeping."""

    __slots__ = ("_callbacks", "_cancel_reason", "_done", "_outbox", "cid", "op", "peer")

    def __init__(self, outbox: Outbox, peer: Peer, cid: int, op: str) -> None:
        self._outbox = outbox
        self.peer = peer
        self.cid = cid
        self.op = op
        self._done = False
        self._cancel_reason: str | None = None
        self._callbacks: list[Callable[[str], None]] = []
        peer.open[cid] = self

    @property
    def done(self) -> bool:
        """No more can be sent: answered, ended, failed or cancelled."""
        return self._done

    @property
    def cancelled(self) -> str | None:
        """Why the request was cancelled (``cancelled``, ``peer_died``,
        ``peer_closed``, ``unreachable``, ``backpressure``, ``idle_expired``),
        or ``None``."""
        return self._cancel_reason

    def on_cancel(self, callback: Callable[[str], None]) -> None:
        """Run ``callback(reason)`` once if the request is cancelled before it is
        answered (at once if it already was)."""
        if self._cancel_reason is not None:
            callback(self._cancel_reason)
        elif not self._done:
            self._callbacks.append(callback)

    def fail(self, error: BaseException) -> bool:
        """Answer with an error (terminal); ``False`` if it could not be sent."""
        if self._done:
            return False
        self._close()
        err = error if isinstance(error, LlamadError) else internal_error(error, self.op)
        return self._outbox.send_error(self.peer, self.cid, err)

    def _close(self) -> None:
        self._done = True
        self._callbacks.clear()
        if self.peer.open.get(self.cid) is self:
            del self.peer.open[self.cid]

    def _cancel(self, reason: str) -> None:
        if self._done:
            return
        self._cancel_reason = reason
        callbacks = self._callbacks[:]
        self._close()
        for cb in callbacks:
            try:
                cb(reason)
            except Exception:
                log.exception("actor.cancel_callback_failed", op=self.op, reason=reason)


class PendingReply(_Open):
    """A call answered later from the owner's loop (exactly once)."""

    __slots__ = ("_on_timeout",)

    def __init__(
        self,
        outbox: Outbox,
        peer: Peer,
        cid: int,
        op: str,
        on_timeout: Callable[[], Any] | None,
    ) -> None:
        super().__init__(outbox, peer, cid, op)
        self._on_timeout = on_timeout

    def reply(self, body: Any = None, blobs: Sequence[Blob] = ()) -> bool:
        """Send the reply; ``False`` if already answered/cancelled or undeliverable."""
        if self._done:
            return False
        self._close()
        return self._outbox.send(self.peer, _REPLY, self.cid, body, blobs, op=self.op)

    def _expire(self) -> None:
        if self._done:
            return
        if self._on_timeout is None:
            self.fail(RequestTimeout(f"{self.op}: no answer within the deferred timeout"))
            return
        try:
            value = self._on_timeout()
        except Exception as exc:
            log.exception("actor.on_timeout_failed", op=self.op)
            self.fail(exc)
            return
        if not self._done:
            self.reply(value)


class StreamSender(_Open):
    """The sending end of one stream: ``emit`` events, then ``end`` or ``fail``."""

    __slots__ = ("events",)

    def __init__(self, outbox: Outbox, peer: Peer, cid: int, op: str) -> None:
        super().__init__(outbox, peer, cid, op)
        self.events = 0

    def emit(self, body: Any = None, blobs: Sequence[Blob] = ()) -> bool:
        """Push one event; ``False`` if the stream is over or the client is gone."""
        if self._done:
            return False
        self.events += 1
        return self._outbox.send(self.peer, _EVENT, self.cid, body, blobs, op=self.op, stream=self)

    def end(self, body: Any = None, blobs: Sequence[Blob] = ()) -> bool:
        """Send the terminal event; the stream is over whatever the result."""
        if self._done:
            return False
        self._close()
        return self._outbox.send(self.peer, _END, self.cid, body, blobs, op=self.op)


class Request(Generic[B]):
    """One validated inbound call, cast or stream request.

    ``body`` has already been decoded into the op's declared type; ``blobs``
    are zero-copy views of the extra frames, valid as long as they are
    referenced.
    """

    __slots__ = ("_handle", "_outbox", "blobs", "body", "cid", "kind", "op", "peer")

    def __init__(
        self,
        outbox: Outbox,
        peer: Peer,
        kind: Kind,
        cid: int,
        op: str,
        *,
        body: B,
        blobs: tuple[memoryview, ...],
    ) -> None:
        self._outbox = outbox
        self.peer = peer
        self.kind = kind
        self.cid = cid
        self.op = op
        self.body = body
        self.blobs = blobs
        self._handle: _Open | None = None

    @property
    def handle(self) -> _Open | None:
        """The handle taken by :meth:`defer` or :meth:`stream`, if any."""
        return self._handle

    def defer(
        self, *, timeout: float | None = None, on_timeout: Callable[[], Any] | None = None
    ) -> PendingReply:
        """Answer this call later; the handler's return value is then ignored.

        With ``timeout`` (seconds), the runtime answers by itself when it
        expires: with ``on_timeout()``'s value if given, else a ``timeout``
        error.
        """
        if self.kind != Kind.CALL:
            raise TypeError(f"defer() is for call ops; {self.op!r} is a {self.kind.name} op")
        if self._handle is not None:
            raise RuntimeError("the request was already deferred")
        handle = PendingReply(self._outbox, self.peer, self.cid, self.op, on_timeout)
        self._handle = handle
        if timeout is not None:
            self._outbox.schedule(timeout, handle)
        return handle

    def stream(self) -> StreamSender:
        """Take the stream's sending end to push events later from the loop."""
        if self.kind != Kind.STREAM:
            raise TypeError(f"stream() is for stream ops; {self.op!r} is a {self.kind.name} op")
        if self._handle is None:
            self._handle = StreamSender(self._outbox, self.peer, self.cid, self.op)
        assert isinstance(self._handle, StreamSender)
        return self._handle


def internal_error(error: BaseException, op: str) -> LlamadError:
    """``error`` (not a :class:`LlamadError`) as the ``internal`` error answering ``op``."""
    return LlamadError(f"{type(error).__name__}: {error}", details={"op": op})
