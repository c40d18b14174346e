"""The clients an actor knows: :class:`PeerTable`.

A client becomes a peer with its handshake (:meth:`PeerTable.admit`), by
routing id, with the process it introduced itself as. A local client's
process is watched with a pidfd (:class:`~llamad.actors.monitor.ProcessWatch`,
one per actor, whose fds sit in the actor's poll), so its death is noticed
at once. A peer goes away (:meth:`PeerTable.gone`) when it says ``BYE``,
when its process exits, when a send finds it unreachable or stuck, or when a
new process takes over its routing id; its open requests are then cancelled
and the actor's ``on_peer_down`` callbacks told. Everything runs on the
actor's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import structlog

from llamad.actors.handles import Peer
from llamad.actors.monitor import ProcessRef, ProcessWatch

if TYPE_CHECKING:
    from llamad.actors.actor import ActorStats
    from llamad.actors.outbox import SocketOutbox

__all__ = ["PeerTable"]

log = structlog.get_logger("llamad.actors")


class PeerTable:
    """Connected peers by routing id and by process (see module doc).

    ``by_ident`` is read on every inbound message, so the actor holds it
    directly; ``watch`` watches the peers' processes (its fds and poll
    interval are the actor's to poll). ``fds_changed()`` is called whenever
    the watch's fd set changes, so the actor rebuilds its poll set.
    """

    __slots__ = (
        "_by_pid",
        "_fds_changed",
        "_name",
        "_outbox",
        "_stats",
        "by_ident",
        "on_down",
        "watch",
    )

    def __init__(
        self,
        name: str,
        stats: ActorStats,
        outbox: SocketOutbox,
        *,
        fds_changed: Callable[[], None],
    ) -> None:
        self._name = name
        self._stats = stats
        self._outbox = outbox
        self._fds_changed = fds_changed
        self.by_ident: dict[bytes, Peer] = {}
        self._by_pid: dict[int, set[bytes]] = {}
        self.watch = ProcessWatch()
        self.on_down: list[Callable[[Peer, str], None]] = []
        outbox.lost = self.gone

    def admit(self, ident: bytes, ref: ProcessRef, name: str) -> Peer | None:
        """The peer for a handshake from ``ident`` by process ``ref``; ``None``
        if ``ref`` is local and no longer alive (nothing to watch)."""
        local = ref.is_local()
        if local and not self.watch.watch(ref):
            return None
        old = self.by_ident.get(ident)
        if old is not None and old.process != ref:
            self.gone(old, "peer_closed")
        peer = Peer(ident, ref, name, local)
        if old is not None and old.process == ref:
            peer.open = old.open
        self.by_ident[ident] = peer
        self._by_pid.setdefault(ref.pid, set()).add(ident)
        self._fds_changed()
        return peer

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
        self.watch.close()
        self.by_ident.clear()
        self._by_pid.clear()
