"""The clients an actor knows: :class:`PeerTable`.

A client becomes a peer with its handshake (:meth:`PeerTable.admit`), by
routing id, with the process it introduced itself as. A local client's
process is watched with a pidfd (:class:`~llamad.actors.monitor.ProcessWatch`,
one per actor, whose fds sit in the actor's poll), so its death is noticed
at once. A peer goes away (:meth:`PeerTable.gone`) when it says ``BYE``,
when its process exits, when a send finds it unreachable or stuck, when a
new process takes over its routing id, or when the idle check finds its
connection gone; its open requests are then cancelled and the actor's
``on_peer_down`` callbacks told. Everything runs on the actor's thread.

**The idle check.** A peer whose process cannot be watched (another host's
boot id, another pid namespace) would otherwise stay forever once its
connection closed without ``BYE``: a crashed remote client, or a local one
that dropped its socket. So every peer that has sent nothing for
``Limits.peer_idle_s`` is sent a ``PING`` (:meth:`SocketOutbox.probe`,
through ``ROUTER_MANDATORY``): when the socket no longer routes to it, its
connection is gone and so is the peer (reason ``idle_expired``); when the
``PING`` goes out the connection is there and the peer stays, for another
idle window. "There" is ZeroMQ's judgement: over tcp both ends exchange
ZMTP heartbeats (1 s, 3 s timeout; :mod:`llamad.actors.sockets`) from their
I/O threads, so a connection whose host or process went silent is closed
within seconds even while its owner's code is idle; over ipc the kernel
closes it when the process dies. That is why a live client needs to send
nothing to stay: the blocking client, which has no thread of its own to send
keepalives while its owner does not call it, is never expired for being
idle. The check runs every quarter of the window (a timer on the actor's
heap, armed while there are peers), reads no clock per message (a message
only sets ``Peer.heard``), so a peer whose connection closed is released
between one and one and a quarter windows after its last message (a second
window if the close was still under way at the first ``PING``).

The table is bounded: a handshake that would make more than
``Limits.max_peers`` peers is refused with ``unavailable``
(``details["reason"] == "too_many_peers"``), so churn can hold at most the
peers whose connections closed within the last window and a bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import structlog

from llamad.actors.handles import Peer
from llamad.actors.monitor import ProcessRef, ProcessWatch
from llamad.errors import Unavailable

if TYPE_CHECKING:
    from llamad.actors.actor import ActorStats
    from llamad.actors.outbox import SocketOutbox
    from llamad.actors.timers import Timers
    from llamad.actors.wire import Limits

__all__ = ["PeerTable"]

log = structlog.get_logger("llamad.actors")

TOO_MANY_PEERS: Final = "too_many_peers"
"""``details["reason"]`` of the ``unavailable`` refusing a handshake over
``Limits.max_peers``."""
_CHECKS_PER_WINDOW: Final = 4


class PeerTable:
    """Connected peers by routing id and by process (see module doc).

    ``by_ident`` is read on every inbound message, so the actor holds it
    directly; ``watch`` watches the peers' processes (its fds and poll
    interval are the actor's to poll). ``fds_changed()`` is called whenever
    the watch's fd set changes, so the actor rebuilds its poll set. The idle
    check runs from ``timers`` (on its clock), with the window and the bound
    of ``limits``.
    """

    __slots__ = (
        "_by_pid",
        "_checking",
        "_fds_changed",
        "_idle_s",
        "_max_peers",
        "_name",
        "_outbox",
        "_stats",
        "_timers",
        "by_ident",
        "on_down",
        "watch",
    )

    def __init__(
        self,
        name: str,
        stats: ActorStats,
        outbox: SocketOutbox,
        timers: Timers,
        limits: Limits,
        *,
        fds_changed: Callable[[], None],
    ) -> None:
        self._name = name
        self._stats = stats
        self._outbox = outbox
        self._timers = timers
        self._idle_s = limits.peer_idle_s
        self._max_peers = limits.max_peers
        self._checking = False
        self._fds_changed = fds_changed
        self.by_ident: dict[bytes, Peer] = {}
        self._by_pid: dict[int, set[bytes]] = {}
        self.watch = ProcessWatch()
        self.on_down: list[Callable[[Peer, str], None]] = []
        outbox.lost = self.gone

    def admit(
        self, ident: bytes, ref: ProcessRef, name: str, *, batches: bool = False
    ) -> Peer | None:
        """The peer for a handshake from ``ident`` by process ``ref``; ``None``
        if ``ref`` is local and no longer alive (nothing to watch). Raises
        :class:`~llamad.errors.Unavailable` when a new peer would pass
        ``Limits.max_peers``."""
        old = self.by_ident.get(ident)
        if old is None and len(self.by_ident) >= self._max_peers:
            raise Unavailable(
                f"actor {self._name!r} has {len(self.by_ident)} clients, its limit; "
                "try again later",
                details={"reason": TOO_MANY_PEERS, "limit": self._max_peers},
            )
        local = ref.is_local()
        if local and not self.watch.watch(ref):
            return None
        if old is not None and old.process != ref:
            self.gone(old, "peer_closed")
        peer = Peer(ident, ref, name, local, batches=batches)
        peer.seen = self._timers.clock()
        if old is not None and old.process == ref:
            peer.open = old.open
        self.by_ident[ident] = peer
        self._by_pid.setdefault(ref.pid, set()).add(ident)
        self._fds_changed()
        if not self._checking:
            self._arm()
        return peer

    def check_idle(self) -> None:
        """The idle check (see the module doc): ``PING`` every peer quiet for a
        window, release those whose connection is gone; runs again a quarter
        window later while any peer is left."""
        self._checking = False
        now = self._timers.clock()
        idle_s = self._idle_s
        for peer in list(self.by_ident.values()):
            if peer.heard:
                peer.heard = False
                peer.seen = now
            elif now - peer.seen >= idle_s:
                sent = self._outbox.probe(peer)
                if sent:
                    self._stats.pings += 1
                    peer.seen = now
                elif sent is False:
                    self._stats.peers_expired += 1
                    self.gone(peer, "idle_expired")
                # None: no answer yet (a full queue, a backlog); asked again
                # at the next check.
        if self.by_ident:
            self._arm()

    def _arm(self) -> None:
        self._checking = True
        self._timers.call_later(self._idle_s / _CHECKS_PER_WINDOW, self.check_idle)

    def exited(self, dead: list[ProcessRef]) -> None:
        """Processes the watch saw exit: their peers are gone (``peer_died``)."""
        for ref in dead:
            self._fds_changed()
            for ident in list(self._by_pid.get(ref.pid, ())):
                peer = self.by_ident.get(ident)
                if peer is not None and peer.process == ref:
                    self.gone(peer, "peer_died")

    def gone(self, peer: Peer, reason: str) -> None:
        """Forget ``peer`` (once): drop its backlog, cancel its open requests
        with ``reason``, unwatch its process if it was its last peer, and run
        the ``on_down`` callbacks."""
        if not peer.connected:
            return
        peer.connected = False
        self._outbox.forget(peer)
        self._stats.peers_down += 1
        if self.by_ident.get(peer.routing_id) is peer:
            del self.by_ident[peer.routing_id]
        same_pid = self._by_pid.get(peer.process.pid)
        if same_pid is not None:
            same_pid.discard(peer.routing_id)
            if not same_pid:
                del self._by_pid[peer.process.pid]
                self.watch.unwatch(peer.process)
                self._fds_changed()
        cancelled = len(peer.open)
        for handle in list(peer.open.values()):
            handle._cancel(reason)
        log.info(
            "actor.peer_down",
            actor=self._name,
            peer_pid=peer.process.pid,
            peer=peer.name,
            reason=reason,
            cancelled=cancelled,
        )
        for callback in self.on_down:
            try:
                callback(peer, reason)
            except Exception:
                log.exception("actor.peer_down_callback_failed", actor=self._name)

    def open_count(self) -> int:
        """Unanswered deferred replies and streams, over every peer."""
        return sum(len(p.open) for p in self.by_ident.values())

    def close(self) -> None:
        """Stop watching and forget every peer (the actor is closing)."""
        self._checking = False
        self.watch.close()
        self.by_ident.clear()
        self._by_pid.clear()
