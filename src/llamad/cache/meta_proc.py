"""cache-meta as a process: the actor loop around :class:`~llamad.cache.meta.CacheMeta`.

:func:`run_meta` is the supervised child's entry point. It rebuilds the index
from the tiers (``ram_file`` and ``disk`` scans, plus this daemon run's
``ram`` segments), serves the ops of :mod:`llamad.cache.meta_wire` on the
actor endpoint ``cache-meta``, and steps everything that is due between
messages: reservation TTLs and waiter deadlines, the pressure scheduler, the
write-back of hit counts, and the moves between tiers (handed to the
:class:`~llamad.cache.mover.Mover`'s threads, whose results come back
through an eventfd in the same poll). A clean stop demotes the ``ram`` rows
first (:meth:`MetaServer.close`).

Owners. Every pin, reservation and waiter belongs to the process that asked
for it (the caller's pid from the actor handshake). cache-meta watches each
owner with a pidfd in the same poll as its socket, so a process that dies
(SIGKILL included) loses its pins and its reservations are reaped at once,
without waiting for a TTL. Only local processes may own state: a remote peer
could never be watched, so such requests are refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Final

import structlog
import zmq

from llamad import logs
from llamad.actors.actor import Actor
from llamad.actors.handles import Peer, PendingReply, Request
from llamad.actors.monitor import ProcessRef, ProcessWatch
from llamad.actors.registry import Registry
from llamad.actors.wire import Limits
from llamad.cache import meta_wire as wire
from llamad.cache.activity import CopyActivity
from llamad.cache.counters import Counters
from llamad.cache.kv_publish import KvEventPublisher
from llamad.cache.kvc import SaveReason
from llamad.cache.lookup import Lookup, RowRef
from llamad.cache.meta import CacheMeta
from llamad.cache.mover import MoveHook, Mover
from llamad.cache.prefetch import Prefetcher, plan
from llamad.cache.pressure import PressureScheduler, PressureSource, make_source
from llamad.cache.reservation import Owner, SaveIntent
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tier_lock import TierLocks
from llamad.cache.tiers import Tier, TierStore, build_tiers
from llamad.cache.waiters import WAIT
from llamad.errors import BadRequest
from llamad.supervisor.child import heartbeat, heartbeat_interval, notifies_ready, notify_ready

__all__ = ["MetaServer", "main", "run_meta"]

log = structlog.get_logger("llamad.cache.meta_proc")

# Bounds on how much maintenance one loop iteration may do, so a lookup never
# waits behind a long flush.
_STATS_BATCH: Final = 256
_OWNER_SWEEP_S: Final = 30.0
# Housekeeping runs when something is due and after any op not listed here
# (they may add a deadline or release a waiter); nothing else wakes an idle
# cache-meta (a 50 ms floor once woke it 20 times a second, each wakeup taking
# a core from a decode beside it).
_QUIET_OPS: Final = frozenset(
    {
        "lookup_exact",
        "longest_prefix",
        "checkout",
        "checkin",
        "release",
        "forget",
        "dump",
        "counters",
        "reset_counters",
        "status",
    }
)

_ANSWERED_PINS_KEPT: Final = 4096
"""Answers with a pin remembered for a late CANCEL (:meth:`MetaServer._late_cancel`):
a client gives up on a call within seconds, long before this many more
pinned answers have gone out."""

# The tokens frame of a request can be as long as the longest prompt.
_LIMITS: Final = Limits(max_frame_bytes=128 * 1024 * 1024)


class MetaServer:
    """cache-meta's process layer: one actor, one :class:`CacheMeta`, one loop.

    Usable in-process too (tests, the standalone example): :meth:`start`,
    then call :meth:`step` from a loop or :meth:`serve` until stopped.
    """

    def __init__(
        self,
        settings: CacheSettings,
        *,
        pressure_source: PressureSource | None = None,
        mover_hook: MoveHook | None = None,
    ) -> None:
        """``pressure_source`` overrides the configured one (e.g. a
        :class:`~llamad.cache.pressure.CallablePressure` when embedding);
        ``mover_hook`` runs after each step of a move (fault tests)."""
        self.settings = settings
        self.tiers: dict[TierKind, Tier] = build_tiers(list(settings.tiers))
        with contextlib.ExitStack() as undo:
            # First of all, before this instance reads or deletes a tier file
            # or touches its counters, permits or registry: a second
            # cache-meta over the same tiers refuses here (TierLocked),
            # having changed nothing.
            self.tier_locks = TierLocks.take(self.tiers.values())
            undo.callback(self.tier_locks.release)
            self.counters = Counters.open_or_create(settings.counters_path)
            undo.callback(self.counters.close)
            # The writers' daemon-wide cap lives beside the counters; creating
            # it again after a crash keeps the permits live writers hold.
            settings.create_permits()
            self.store = TierStore(self.tiers, self.counters)
            self.meta = CacheMeta(settings.meta_config(), self.store, counters=self.counters)
            source = (
                pressure_source if pressure_source is not None else make_source(settings.pressure)
            )
            self.pressure = PressureScheduler(settings.pressure, source, self.meta.evict_bytes)
            registry = Registry(settings.registry_root)
            self.actor = Actor(settings.actor_name, registry=registry, limits=_LIMITS)
            # Where the model workers see this process's copies (activity.py).
            self.copies = CopyActivity.create(settings.copies_file())
            undo.callback(self.copies.close)
            self.mover = Mover(
                self.tiers, counters=self.counters, hook=mover_hook, activity=self.copies
            )
            undo.callback(self.mover.close)
            # Bound before the rebuild, so the rows it finds are announced.
            self.kv_events: KvEventPublisher | None = None
            if settings.kv_events is not None:
                try:
                    self.kv_events = KvEventPublisher(settings.kv_events)
                except zmq.ZMQError as exc:
                    # Routing hints are not worth a cache that cannot start:
                    # serve without them, and say so.
                    log.error(
                        "cache.kv_events_unavailable",
                        endpoint=settings.kv_events.endpoint,
                        error=str(exc),
                    )
                else:
                    undo.callback(self.kv_events.close)
                    self.meta.observer = self.kv_events
            undo.pop_all()  # from here on close() releases them
        self.actor.add_reader(self.mover.fileno(), self._moves_done)
        if self.kv_events is not None and (fd := self.kv_events.replay_fd()) is not None:
            self.actor.add_reader(fd, self.kv_events.serve_replay)
        self._owners = ProcessWatch()
        self._owner_refs: dict[Owner, ProcessRef] = {}
        self._owner_fds: set[int] = set()
        self._next_flush = 0.0
        self._next_sweep = 0.0
        self._due = 0.0  # when housekeeping must run next
        self._dirty = True  # an op may have changed what is due
        self.prefetch = Prefetcher((), budget=settings.prefetch_bytes)
        self._answered_pins: dict[tuple[Peer, int], int] = {}
        for name, spec in wire.OPS.items():
            self.actor.add_op(spec, self._handler(name))
        self.actor.on_late_cancel(self._late_cancel)

    # -- lifecycle ------------------------------------------------------------

    def rebuild(self) -> dict[TierKind, int]:
        """Index every valid row the tiers hold; returns rows adopted per tier."""
        adopted: dict[TierKind, int] = {}
        started = time.monotonic()
        for name, tier in self.tiers.items():
            tier.prepare()
            # A restarted cache-meta of this daemon run keeps its ram segments
            # (a new daemon purges them before cache-meta starts), so a crash
            # loses no row of any tier.
            n = 0
            for row in tier.scan(self.counters, adopt_ram=True):
                n += self.meta.adopt_file(row, name, tier.location_for(row.key))
            adopted[name] = n
        evicted, _ = self.meta.finish_rebuild()
        log.info(
            "cache.index_rebuilt",
            rows=len(self.meta.rows),
            per_tier={tier.value: n for tier, n in adopted.items()},
            evicted_over_quota=evicted,
            seconds=round(time.monotonic() - started, 3),
        )
        return adopted

    def start(self) -> str:
        """Rebuild the index, then bind and register the actor; returns the endpoint.

        The newest ``disk`` rows are then read into the page cache in the
        background (:mod:`llamad.cache.prefetch`): serving does not wait for it.
        """
        self.rebuild()
        self._ram_back()
        endpoint = self.actor.start()
        if self.kv_events is not None:
            self.kv_events.flush()
            self.kv_events.write_info()
        now = time.monotonic()
        self._next_flush = now + self.settings.stats_flush_s
        self._next_sweep = now + _OWNER_SWEEP_S
        budget = self.settings.prefetch_bytes
        fastest = [c for r in self.meta.rows.values() if (c := r.fastest()) is not None]
        self.prefetch = Prefetcher(plan(fastest, budget), budget=budget)
        self.prefetch.start()
        return endpoint

    def _ram_back(self) -> None:
        """Link the newest ``ram_file`` rows back into ``ram`` while it has room.

        A clean stop demoted the ``ram`` rows into ``ram_file`` (by a link)
        before the purge. Linking them back costs no byte and no memory, and
        the first repeats after a restart are then served from ``ram`` (a
        worker maps a segment and copies it once) instead of read from a
        file into a buffer the new worker must first allocate (a 2048-token
        row: 52 ms from ram_file on the benchmark VM, 11 ms from ram in a
        running worker). Only where both tiers share a filesystem: elsewhere
        the move would be a copy, doubling memory.
        """
        ram, ram_file = self.tiers.get(TierKind.RAM), self.tiers.get(TierKind.RAM_FILE)
        if ram is None or ram_file is None:
            return
        try:
            same_fs = os.stat(ram.root).st_dev == os.stat(ram_file.root).st_dev
        except OSError:
            return
        if same_fs:
            n = self.meta.promote_newest(TierKind.RAM_FILE, TierKind.RAM)
            if n:
                log.info("cache.ram_back", rows=n)

    def close(self) -> None:
        """Demote the ``ram`` rows, persist hit counts, close the actor, release
        watches, counters and the tiers."""
        self.prefetch.stop()
        try:
            self._stop_moves()
            self.meta.flush_stats()
        finally:
            try:
                # The poller lets go of the eventfd's number before it is closed.
                self.actor.remove_reader(self.mover.fileno())
                self.mover.close()
                self.copies.close()
                if self.kv_events is not None:
                    if (fd := self.kv_events.replay_fd()) is not None:
                        self.actor.remove_reader(fd)
                    try:
                        self.kv_events.stop()
                    except Exception:
                        log.exception("cache.kv_events_stop_failed")
                self.actor.close()
                self._owners.close()
                source_close = getattr(self.pressure.source, "close", None)
                if callable(source_close):
                    source_close()
                self.counters.close()
            finally:
                # Last: the flush above still wrote into tier files.
                self.tier_locks.release()

    def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or :meth:`Actor.request_stop`), then close.

        ``ready`` runs once the stop signals are wired, before the first poll:
        announce readiness there, so a SIGTERM sent right after the
        announcement stops the server cleanly instead of killing it.
        """
        # The actor's own signal wiring: its wake pipe doubles as the signal
        # wakeup fd, so a SIGTERM landing just before a blocking poll is not lost.
        restore = self.actor.stop_on_signals()
        try:
            if ready is not None:
                ready()
            while not self.actor.stop_requested:
                self.step(self._timeout())
        finally:
            restore()
            self.close()

    def step(self, timeout: float | None = 0.0) -> None:
        """Handle pending messages (waiting up to ``timeout``), then run what is due.

        Housekeeping (reaping, waiter deadlines, deferred answers, pressure,
        hit-count flushes, owner sweeps, heartbeats, handing moves to the
        mover) is skipped after a lookup when nothing is due: it costs more
        than the lookup's own bookkeeping, and a lookup changes no deadline
        (one that asked for a promotion leaves a move to hand over).
        """
        self.actor.poll(timeout)
        if self._dirty or self.meta.has_moves or time.monotonic() >= self._due:
            self._maintain()
        if self.kv_events is not None:
            # One batch per step: whatever the messages and moves just changed.
            self.kv_events.flush()
            # A replay request that came in while the poll served others.
            self.kv_events.serve_replay()

    def _timeout(self) -> float:
        return max(0.0, self._due - time.monotonic())

    def _next_due(self, now: float) -> float:
        due = [self._next_flush, self._next_sweep]
        for candidate in (self.meta.next_deadline(), self.pressure.next_due()):
            if candidate is not None:
                due.append(candidate)
        interval = self._owners.poll_interval()
        if interval is not None:
            due.append(now + interval)
        if (beat := heartbeat_interval()) is not None:
            due.append(now + beat)
        return min(due)

    def _maintain(self) -> None:
        self._dirty = False
        now = time.monotonic()
        if self._owners.poll_interval() is not None:
            self._owners_exited()
        deadline = self.meta.next_deadline()
        if deadline is not None and deadline <= now:
            self.meta.tick()
        self._deliver()
        self.pressure.poll()
        if now >= self._next_flush:
            self.meta.flush_stats(limit=_STATS_BATCH)
            self._next_flush = now + self.settings.stats_flush_s
        if now >= self._next_sweep:
            self._sweep_owners()
            self._next_sweep = now + _OWNER_SWEEP_S
        for job in self.meta.take_moves():
            self.mover.submit(job)
        heartbeat()
        self._due = self._next_due(now)

    # -- moves between tiers --------------------------------------------------

    def _moves_done(self) -> None:
        for result in self.mover.drain():
            self.meta.move_done(result)
        # Landed moves may free a write-behind slot or ask for more moves.
        self._dirty = True

    def _stop_moves(self) -> None:
        """A clean stop: demote ``ram`` rows and finish the moves in flight, for
        at most ``settings.stop_moves_s``.

        What the budget leaves undone loses nothing: a demoted copy's file is
        only deleted once its destination is indexed, the daemon's purge of
        ``ram`` links what is left into ``ram_file``
        (:func:`llamad.cache.ram_purge.purge_ram`), and the next start asks again
        for the write-behind copies rows lack.
        """
        asked = self.meta.begin_stop()
        deadline = time.monotonic() + self.settings.stop_moves_s
        for job in self.meta.take_moves():
            self.mover.submit(job)
        while self.meta.moves_in_flight():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self.mover.wait(left):
                for result in self.mover.drain():
                    self.meta.move_done(result)
                for job in self.meta.take_moves():
                    self.mover.submit(job)
        log.info(
            "cache.stop_moves",
            demotions=asked,
            unfinished=self.meta.moves_in_flight(),
            write_behind_waiting=self.meta.moves.behind,
        )

    # -- owners ---------------------------------------------------------------

    def _owner(self, req: Request[Any]) -> Owner:
        ref = req.peer.process
        if not req.peer.local:
            raise BadRequest("cache-meta serves only processes on its own host and pid namespace")
        known = self._owner_refs.get(ref.pid)
        if known is not ref and known != ref:
            if known is not None:
                # The pid was recycled: whatever the old process held is released.
                del self._owner_refs[ref.pid]
                self.meta.owner_down(ref.pid)
                self._dirty = True
            watching = self._owners.watch(ref)
            # watch() may have closed the old incarnation's pidfd, and the new
            # one may even reuse its number: resync the poller both ways.
            self._forget_fds()
            for fd in set(self._owners.fds()) - self._owner_fds:
                self.actor.add_reader(fd, self._owners_exited)
                self._owner_fds.add(fd)
            if not watching:
                raise BadRequest("the calling process is not alive")
            self._owner_refs[ref.pid] = ref
        return ref.pid

    def _owners_exited(self) -> None:
        for ref in self._owners.exited():
            self._drop_owner(ref)

    def _drop_owner(self, ref: ProcessRef) -> None:
        if self._owner_refs.get(ref.pid) != ref:
            return
        self._dirty = True
        del self._owner_refs[ref.pid]
        self._forget_fds()
        self.meta.owner_down(ref.pid)
        if self.kv_events is not None:
            self.kv_events.live_set(ref.pid, [])
        self._deliver()
        log.info("cache.owner_down", pid=ref.pid)

    def _forget_fds(self) -> None:
        # A watch closes its pidfd when it ends; the poller must let go of the
        # number before anything reuses it.
        for fd in self._owner_fds - set(self._owners.fds()):
            self.actor.remove_reader(fd)
            self._owner_fds.discard(fd)

    def _sweep_owners(self) -> None:
        """Stop watching processes that no longer hold anything."""
        holding = self.meta.owners()
        if self.kv_events is not None:
            holding |= self.kv_events.live_owners()
        for pid, ref in list(self._owner_refs.items()):
            if pid not in holding:
                self._owners.unwatch(ref)
                del self._owner_refs[pid]
        self._forget_fds()

    # -- deferred answers -----------------------------------------------------

    def _deliver(self) -> None:
        for handle, answer in self.meta.take_ready():
            assert isinstance(handle, PendingReply)
            self._reply(handle, answer)

    def _reply(self, handle: PendingReply, answer: object) -> None:
        # RowRef and Lookup are msgspec structs: the actor encodes them as
        # their wire arrays directly.
        body: Any = answer if isinstance(answer, (RowRef, Lookup)) else None
        pin = _pin_of(answer)
        if not handle.reply(body):
            if pin is not None:
                # Nobody is there to check the pin in: release it now.
                self.meta.checkin(pin)
        elif pin is not None:
            self._note_pinned(handle.peer, handle.cid, pin)

    def _note_pinned(self, peer: Peer, cid: int, pin: int) -> None:
        """Remember which call a pin answered, for :meth:`_late_cancel`."""
        answered = self._answered_pins
        answered[peer, cid] = pin
        if len(answered) > _ANSWERED_PINS_KEPT:
            del answered[next(iter(answered))]

    def _late_cancel(self, peer: Peer, cid: int) -> None:
        """A client cancelled a call already answered: its timeout ran out
        before the answer reached it, so it never takes the pin the answer
        carried, and nobody would ever check it in (a worker's lookup sent
        while cache-meta was stopped, answered once it ran again). Checked in
        here; a pin checked in meanwhile is just not held any more."""
        pin = self._answered_pins.pop((peer, cid), None)
        if pin is not None and self.meta.checkin(pin):
            self._dirty = True
            log.info("cache.unclaimed_pin_released", pin=pin, peer=peer.name)

    # -- ops ------------------------------------------------------------------

    def _handler(self, name: str) -> Callable[[Request[Any]], Any]:
        method: Callable[[Request[Any]], Any] = getattr(self, f"_op_{name}")
        quiet = name in _QUIET_OPS

        def handler(req: Request[Any]) -> Any:
            if not quiet:
                self._dirty = True
            answer = method(req)
            pin = _pin_of(answer)
            if pin is not None:
                self._note_pinned(req.peer, req.cid, pin)
            return answer

        return handler

    def _op_reserve_save(self, req: Request[wire.ReserveSave]) -> wire.Reserved:
        b = req.body
        intent = SaveIntent(
            key=b.key,
            namespace=b.namespace,
            tokens=bytes(req.blobs[0]),
            tier=b.tier,
            size=b.size,
            reason=SaveReason(b.reason),
        )
        grant = self.meta.reserve(intent, self._owner(req), ttl_s=b.ttl_s, tiers=_tiers(b.tiers))
        return wire.Reserved(grant.token, grant.tier)

    def _op_check_reservation(self, req: Request[wire.TokenRef]) -> None:
        self.meta.check_reservation(req.body.key, req.body.token)

    def _op_mark_published(self, req: Request[wire.MarkPublished]) -> None:
        b = req.body
        self._check_location(b.key, b.location)
        self.meta.mark_published(b.key, b.token, b.location)

    def _op_announce_saved(self, req: Request[wire.AnnounceSaved]) -> RowRef:
        b = req.body
        if b.location is not None:
            self._check_location(b.key, b.location)
        return self.meta.announce_saved(b.key, b.token, location=b.location, size=b.size)

    def _check_location(self, key: bytes, location: str) -> None:
        # A location will later be read and deleted: it must be this key's
        # file in one of our tiers, never an arbitrary path from a message.
        if not any(t.key_of(location) == key for t in self.tiers.values()):
            raise BadRequest(
                "location is not this key's file in any tier", details={"field": "location"}
            )

    def _op_cancel_reservation(self, req: Request[wire.TokenRef]) -> bool:
        return self.meta.cancel_reservation(req.body.key, req.body.token)

    def _op_checkout(self, req: Request[wire.KeyBody]) -> RowRef | None:
        return self.meta.checkout(req.body.key, self._owner(req))

    def _op_checkin(self, req: Request[wire.Checkin]) -> bool:
        return self.meta.checkin(req.body.pin)

    def _op_release(self, req: Request[wire.Checkin]) -> None:
        self.meta.checkin(req.body.pin)

    def _op_forget(self, req: Request[wire.Forget]) -> bool:
        return self.meta.forget(req.body.key, req.body.tier)

    def _op_lookup_exact(self, req: Request[wire.LookupExact]) -> RowRef | None:
        b = req.body
        owner = self._owner(req) if b.pin else None
        return self.meta.lookup_exact(b.key, owner, _tiers(b.tiers))

    def _op_lookup_exact_or_wait(self, req: Request[wire.LookupWait]) -> None:
        b = req.body
        owner = self._owner(req)
        handle = req.defer()
        found = self.meta.lookup_exact_or_wait(b.key, owner, b.wait_s, handle, _tiers(b.tiers))
        if found is not WAIT:
            self._reply(handle, found)

    def _op_longest_prefix(self, req: Request[wire.LongestPrefix]) -> Lookup:
        b = req.body
        owner = self._owner(req) if b.pin else None
        return self.meta.longest_prefix(
            b.namespace, bytes(req.blobs[0]), owner, parent_key=b.parent_key, tiers=_tiers(b.tiers)
        )

    def _op_resolve(self, req: Request[wire.Resolve]) -> None:
        b = req.body
        owner = self._owner(req)
        handle = req.defer()
        found = self.meta.resolve(
            b.namespace,
            bytes(req.blobs[0]),
            owner,
            parent_key=b.parent_key,
            wait_s=b.wait_s,
            handle=handle,
            tiers=_tiers(b.tiers),
        )
        if found is not WAIT:
            self._reply(handle, found)

    def _op_evict_bytes(self, req: Request[wire.EvictBytes]) -> wire.Evicted:
        rows, freed = self.meta.evict_bytes(req.body.n, req.body.tiers)
        return wire.Evicted(rows, freed)

    def _op_gc(self, req: Request[wire.NoArgs]) -> wire.GcResult:
        return self.meta.gc()

    def _op_dump(self, req: Request[wire.NoArgs]) -> list[dict[str, Any]]:
        return self.meta.dump()

    def _op_counters(self, req: Request[wire.NoArgs]) -> dict[str, int]:
        return self.counters.snapshot()

    def _op_reset_counters(self, req: Request[wire.NoArgs]) -> None:
        self.counters.reset()

    def _op_status(self, req: Request[wire.NoArgs]) -> dict[str, Any]:
        status = self.meta.status()
        status["pressure"] = self.pressure.status()
        status["owners"] = len(self._owner_refs)
        status["prefetch"] = self.prefetch.status()
        if self.kv_events is not None:
            status["kv_events"] = self.kv_events.info()
        return status

    def _op_pressure_check(self, req: Request[wire.NoArgs]) -> dict[str, Any]:
        return self.pressure.force_check().to_wire()

    def _op_live_entries(self, req: Request[wire.LiveEntries]) -> None:
        if self.kv_events is None:
            return
        entries = [(e.seq, e.namespace, e.tokens) for e in req.body.entries]
        # Watched like any owner: a worker that dies takes its live blocks with it.
        self.kv_events.live_set(self._owner(req), entries)


def _pin_of(answer: object) -> int | None:
    """The pin an answer hands its caller, if any."""
    if isinstance(answer, RowRef):
        return answer.pin
    if isinstance(answer, Lookup) and answer.row is not None:
        return answer.row.pin
    return None


def _tiers(tiers: Collection[TierKind] | None) -> frozenset[TierKind] | None:
    return None if tiers is None else frozenset(tiers)


@notifies_ready
def run_meta(settings: dict[str, Any]) -> None:
    """Supervised entry point: rebuild, report ready, serve until SIGTERM."""
    logs.configure()
    server = MetaServer(CacheSettings.from_wire(settings))
    server.start()
    server.serve(notify_ready)


def main(argv: list[str] | None = None) -> None:
    """``python -m llamad.cache.meta_proc SETTINGS.json``: cache-meta outside a supervisor.

    Prints ``READY <endpoint> <pid>`` once it serves (what
    :class:`llamad.testing.MetaProcess` waits for); SIGTERM stops it.
    """
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m llamad.cache.meta_proc SETTINGS.json")
    logs.configure()
    settings = CacheSettings.from_wire(json.loads(Path(args[0]).read_text()))
    server = MetaServer(settings)
    endpoint = server.start()
    server.serve(lambda: print(f"READY {endpoint} {os.getpid()}", flush=True))


if __name__ == "__main__":
    main()
