"""One connection of the asyncio actor client: a DEALER socket and the watch on
its actor's process, both driven by the event loop's readiness callbacks.

- **Readiness, not threads.** The socket's ``ZMQ_FD`` is registered with
  ``loop.add_reader``. That descriptor is edge-triggered (it says "the
  socket's events may have changed"), so each wake drains the socket while
  ``ZMQ_EVENTS`` says POLLIN, and every send schedules one more drain (a send
  may consume the edge a pending message would have raised).
- **Death.** The actor's pidfd (a :class:`~llamad.actors.monitor.ProcessWatch`)
  is registered with ``add_reader`` too, so its death is noticed at once;
  without a pidfd the watch is polled on a timer, and an actor that is not
  local is watched through a socket monitor's disconnect event. Answers the
  actor sent just before dying are drained for 10 ms before the link reports
  the death (the actors client's grace, for the same reason).
- **Refusal.** Over tcp the socket monitor also reports a handshake the
  actor refused (CURVE: :mod:`llamad.actors.curve`); the link then reports
  itself down with :attr:`AsyncLink.refusal` set, which the client raises
  as it is (``PermissionDenied``) instead of a crash.

The link knows nothing of requests, nor decides what watches the actor (the
client's :class:`~llamad.actors.connection.Connection` does): it hands every
header frame to ``on_message`` and reports a death once to ``on_down``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Final

import structlog
import zmq

from llamad.actors.connection import dealer, monitor_event
from llamad.actors.curve import CurveClient
from llamad.actors.monitor import ProcessRef, ProcessWatch
from llamad.actors.sockets import NOBLOCK, POLLIN
from llamad.actors.wire import Limits
from llamad.errors import PermissionDenied, Unavailable

__all__ = ["AsyncLink"]

log = structlog.get_logger("llamad.client")

_LATE_REPLY_GRACE_S: Final = 0.01


class AsyncLink:
    """A socket connected to ``endpoint`` on ``loop`` (see the module doc),
    watched by a socket monitor of the ``monitor`` events (0: none) and the
    pidfd of the ``watched`` process until the handshake says who answered."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        ctx: zmq.Context[zmq.Socket[bytes]],
        endpoint: str,
        limits: Limits,
        *,
        target: str,
        monitor: int,
        watched: ProcessRef | None,
        on_message: Callable[[bytes], None],
        on_down: Callable[[str], None],
        curve: CurveClient | None = None,
    ) -> None:
        self.loop = loop
        self.target = target
        self.on_message = on_message
        self.on_down = on_down
        self.going_down: asyncio.Future[None] | None = None
        """Set while a death is being reported (the 10 ms grace)."""
        self.closed = False
        self.refusal: PermissionDenied | None = None
        """Why the actor refused the handshake, once it did."""
        self.watch = ProcessWatch()
        """The actor's process, watched by its pidfd (or polled)."""
        self._watched_fds: list[int] = []
        self._poll_timer: asyncio.TimerHandle | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        sock = dealer(ctx, endpoint, limits, curve)
        self._sock = sock
        self._sock_fd = _fd(sock)
        loop.add_reader(self._sock_fd, self._drain)
        if monitor:
            self._monitor = sock.get_monitor_socket(monitor)
            loop.add_reader(_fd(self._monitor), self._on_monitor)
            # ZMQ_FD only signals a pipe its reader found empty once: read it
            # now, or no event would ever wake the loop.
            loop.call_soon(self._on_monitor)
        sock.connect(endpoint)
        if watched is not None:
            self.watch.watch(watched)
        self.rewatch()

    def send(self, header: bytes) -> None:
        """Queue one frame; ``Unavailable`` when the actor is not reading."""
        try:
            self._sock.send(header, NOBLOCK)
        except zmq.Again:
            raise Unavailable(f"actor {self.target!r} is not reading (send queue full)") from None
        self.loop.call_soon(self._drain)

    def send_quietly(self, header: bytes) -> None:
        """Queue one frame that needs no answer (CANCEL, BYE); never raises."""
        if not self.closed:
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send(header, NOBLOCK)

    @property
    def monitored(self) -> bool:
        """Whether a socket monitor watches the connection."""
        return self._monitor is not None

    def close(self) -> None:
        """Unregister everything and close the socket. Idempotent."""
        if self.closed:
            return
        self.closed = True
        loop = self.loop
        if not loop.is_closed():
            for fd in self._watched_fds:
                loop.remove_reader(fd)
            loop.remove_reader(self._sock_fd)
        self._watched_fds = []
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        self.close_monitor()
        self._sock.close(linger=0)
        self.watch.close()

    # -- readiness callbacks -------------------------------------------------

    def _drain(self) -> None:
        """Read until ``ZMQ_EVENTS`` says empty (``ZMQ_FD`` is edge-triggered)."""
        if self.closed:
            return
        sock = self._sock
        try:
            while _events(sock) & POLLIN:
                frames = sock.recv_multipart(NOBLOCK, copy=True)
                self.on_message(frames[0])
        except zmq.Again:
            return
        except zmq.ZMQError as exc:  # the socket was closed under us
            log.debug("actor.client.recv_failed", target=self.target, error=str(exc))

    def rewatch(self) -> None:
        """Register the watched pidfds (and a poll timer for a watch without one)."""
        loop = self.loop
        for fd in self._watched_fds:
            loop.remove_reader(fd)
        self._watched_fds = self.watch.fds()
        for fd in self._watched_fds:
            loop.add_reader(fd, self._on_exit)
        if self._poll_timer is not None:
            self._poll_timer.cancel()
            self._poll_timer = None
        interval = self.watch.poll_interval()
        if interval is not None:
            self._poll_timer = loop.call_later(interval, self._on_poll_timer)

    def _on_poll_timer(self) -> None:
        self._poll_timer = None
        self._on_exit()
        if not self.closed and self.going_down is None:
            self.rewatch()

    def _on_exit(self) -> None:
        if self.watch.exited():
            self._down("process exited")

    def _on_monitor(self) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        lost = False
        with contextlib.suppress(zmq.Again, zmq.ZMQError):
            while _events(monitor) & POLLIN:
                gone, refusal = monitor_event(monitor.recv_multipart(NOBLOCK))
                lost = lost or gone
                if self.refusal is None:
                    # The first refusal says why; retries that follow may say less.
                    self.refusal = refusal
        if lost:
            self._down("refused" if self.refusal is not None else "connection lost")

    def _down(self, reason: str) -> None:
        """The actor died: drain what it sent just before, then report it once."""
        if self.going_down is not None or self.closed:
            return
        for fd in self._watched_fds:
            self.loop.remove_reader(fd)
        self._watched_fds = []
        self._drain()
        self.going_down = self.loop.create_future()
        self.loop.call_later(_LATE_REPLY_GRACE_S, self._report_down, reason)

    def _report_down(self, reason: str) -> None:
        self._drain()
        self.close()
        self.on_down(reason)
        down, self.going_down = self.going_down, None
        if down is not None and not down.done():
            down.set_result(None)

    def close_monitor(self) -> None:
        monitor = self._monitor
        if monitor is None:
            return
        with contextlib.suppress(zmq.ZMQError, ValueError):
            if not self.loop.is_closed():
                self.loop.remove_reader(_fd(monitor))
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        monitor.close(linger=0)
        self._monitor = None


def _fd(sock: zmq.Socket[bytes]) -> int:
    """The socket's ZMQ_FD: readable when its events may have changed (edge-triggered)."""
    fd = sock.getsockopt(zmq.FD)
    assert isinstance(fd, int)
    return fd


def _events(sock: zmq.Socket[bytes]) -> int:
    events = sock.getsockopt(zmq.EVENTS)
    assert isinstance(events, int)
    return events
