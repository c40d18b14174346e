"""The peer table's idle check and the timer heap, on a fake clock (no sockets).

The outbox is a fake whose ``probe`` answers what each test scripts: ``True``
(the PING went out: the connection is there), ``False`` (the socket no longer
routes to the peer) or ``None`` (its queue is full).
"""

from __future__ import annotations

from typing import Any, cast

import pytest

from llamad.actors.actor import ActorStats
from llamad.actors.errors import ActorConfigError
from llamad.actors.handles import Peer, PendingReply, StreamSender
from llamad.actors.monitor import ProcessRef
from llamad.actors.outbox import SocketOutbox
from llamad.actors.peers import TOO_MANY_PEERS, PeerTable
from llamad.actors.timers import Timers
from llamad.actors.wire import Limits
from llamad.errors import Unavailable

IDLE = 1.0
TICK = IDLE / 4


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeOutbox:
    """What the peer table uses of the outbox, and what a handle needs to answer."""

    def __init__(self) -> None:
        self.answers: dict[bytes, list[bool | None]] = {}
        self.probed: list[bytes] = []
        self.forgotten: list[bytes] = []
        self.lost: Any = None

    def probe(self, peer: Peer) -> bool | None:
        self.probed.append(peer.routing_id)
        script = self.answers.get(peer.routing_id, [True])
        return script.pop(0) if len(script) > 1 else script[0]

    def forget(self, peer: Peer) -> None:
        self.forgotten.append(peer.routing_id)

    def send(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def send_error(self, *args: Any) -> bool:
        return True

    def schedule(self, delay: float, handle: PendingReply) -> None:
        raise AssertionError("not in these tests")


FOREIGN = ProcessRef(4242, 7, "another-host-boot-id", 1)


class World:
    def __init__(self, **limits: Any) -> None:
        self.clock = Clock()
        self.timers = Timers(self.clock)
        self.outbox = FakeOutbox()
        self.stats = ActorStats()
        self.downs: list[tuple[bytes, str]] = []
        self.table = PeerTable(
            "t",
            self.stats,
            cast(SocketOutbox, self.outbox),
            self.timers,
            Limits(peer_idle_s=IDLE, **limits),
            fds_changed=lambda: None,
        )
        self.table.on_down.append(lambda peer, reason: self.downs.append((peer.routing_id, reason)))

    def admit(self, ident: bytes, ref: ProcessRef = FOREIGN) -> Peer:
        peer = self.table.admit(ident, ref, ident.decode())
        assert peer is not None
        return peer

    def advance(self, seconds: float) -> None:
        """Move the clock on in steps of an eighth of a check (exact in binary,
        so no deadline drifts), firing what is due."""
        end = self.clock.now + seconds
        while self.clock.now < end - 1e-9:
            self.clock.now = min(end, self.clock.now + TICK / 8)
            self.timers.fire()


def test_a_quiet_peer_whose_connection_is_gone_is_released_with_its_open_requests() -> None:
    w = World()
    peer = w.admit(b"gone")
    assert not peer.local
    w.outbox.answers[b"gone"] = [False]
    reasons: list[str] = []
    outbox = cast(Any, w.outbox)
    PendingReply(outbox, peer, 1, "hang", None).on_cancel(reasons.append)
    StreamSender(outbox, peer, 2, "infer").on_cancel(reasons.append)

    # Quiet for a window after the check that saw its handshake: still there.
    w.advance(IDLE + TICK - TICK / 4)
    assert w.outbox.probed == []
    assert b"gone" in w.table.by_ident
    # The next check PINGs it, and the socket no longer routes to it.
    w.advance(TICK / 4)
    assert w.outbox.probed == [b"gone"]
    assert b"gone" not in w.table.by_ident
    assert w.downs == [(b"gone", "idle_expired")]
    assert sorted(reasons) == ["idle_expired", "idle_expired"]
    assert peer.open == {}
    assert w.outbox.forgotten == [b"gone"]
    assert (w.stats.peers_down, w.stats.peers_expired, w.stats.pings) == (1, 1, 0)


def test_traffic_keeps_a_peer_from_being_asked_at_all() -> None:
    w = World()
    peer = w.admit(b"busy")
    w.outbox.answers[b"busy"] = [False]
    for _ in range(40):  # ten windows, a message every check
        peer.heard = True
        w.advance(TICK)
    assert w.outbox.probed == []
    assert w.downs == []


def test_a_quiet_peer_whose_ping_goes_out_stays_and_is_asked_once_a_window() -> None:
    w = World()
    w.admit(b"idle")
    w.advance(10 * IDLE + TICK)
    assert w.downs == []
    assert b"idle" in w.table.by_ident
    # Asked after its first quiet window, then once a window after each PING.
    assert 8 <= len(w.outbox.probed) <= 10
    assert w.stats.pings == len(w.outbox.probed)


def test_a_full_queue_is_asked_again_at_the_next_check() -> None:
    w = World()
    w.admit(b"full")
    w.outbox.answers[b"full"] = [None, None, False]
    w.advance(IDLE + TICK)
    assert w.outbox.probed == [b"full"]
    w.advance(TICK)
    assert w.outbox.probed == [b"full"] * 2
    assert w.downs == []
    w.advance(TICK)
    assert w.outbox.probed == [b"full"] * 3
    assert w.downs == [(b"full", "idle_expired")]


def test_local_peers_are_checked_too() -> None:
    # A local client that dropped its socket without BYE while its process
    # lives (a Client never closed) has no exit for the pidfd to report.
    w = World()
    me = ProcessRef.current()
    peer = w.admit(b"local", me)
    assert peer.local
    w.outbox.answers[b"local"] = [False]
    w.advance(IDLE + 2 * TICK)
    assert w.downs == [(b"local", "idle_expired")]
    assert len(w.table.watch) == 0


def test_the_check_runs_only_while_there_are_peers() -> None:
    w = World()
    assert w.timers.heap == []
    w.admit(b"a")
    assert len(w.timers.heap) == 1
    w.outbox.answers[b"a"] = [False]
    w.advance(IDLE + 2 * TICK)
    assert w.table.by_ident == {}
    assert w.timers.heap == []
    w.admit(b"b")
    w.admit(b"c")
    assert len(w.timers.heap) == 1


def test_the_table_is_bounded_and_a_released_peer_makes_room() -> None:
    w = World(max_peers=3)
    for ident in (b"p1", b"p2", b"p3"):
        w.admit(ident)
    with pytest.raises(Unavailable) as refused:
        w.admit(b"p4")
    assert refused.value.details == {"reason": TOO_MANY_PEERS, "limit": 3}
    assert len(w.table.by_ident) == 3
    w.admit(b"p2")  # a handshake again on a known routing id is no new peer
    w.outbox.answers[b"p1"] = [False]
    w.table.by_ident[b"p2"].heard = w.table.by_ident[b"p3"].heard = True
    w.advance(IDLE + 2 * TICK)
    assert [ident for ident, _ in w.downs] == [b"p1"]
    w.admit(b"p4")
    assert sorted(w.table.by_ident) == [b"p2", b"p3", b"p4"]


def test_peer_idle_s_is_checked() -> None:
    for bad in (0, 0.01, -1, 86_401, float("nan"), True, "30"):
        with pytest.raises(ActorConfigError, match="peer_idle_s"):
            Limits(peer_idle_s=bad)  # type: ignore[arg-type]
    with pytest.raises(ActorConfigError, match="max_peers"):
        Limits(max_peers=0)


# -- the timer heap -------------------------------------------------------------------


def test_timers_run_callbacks_and_expire_handles_in_deadline_order_on_their_clock() -> None:
    clock = Clock()
    timers = Timers(clock)
    order: list[str] = []
    timers.call_later(2.0, lambda: order.append("late"))
    timers.call_later(1.0, lambda: order.append("early"))
    outbox = FakeOutbox()
    peer = Peer(b"x", FOREIGN, "x", False)
    handle = PendingReply(cast(Any, outbox), peer, 1, "op", lambda: order.append("handle"))
    timers.add(1.5, handle)
    clock.now += 0.999
    timers.fire()
    assert order == []
    clock.now += 0.001
    timers.fire()
    assert order == ["early"]
    clock.now += 1.0
    timers.fire()
    assert order == ["early", "handle", "late"]
    assert timers.heap == []


def test_a_callback_may_schedule_the_next_one() -> None:
    clock = Clock()
    timers = Timers(clock)
    runs: list[float] = []

    def again() -> None:
        runs.append(clock.now)
        if len(runs) < 3:
            timers.call_later(1.0, again)

    timers.call_later(1.0, again)
    for _ in range(5):
        clock.now += 1.0
        timers.fire()
    assert runs == [1001.0, 1002.0, 1003.0]
