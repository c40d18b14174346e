"""cache-meta: the sole writer's state machine (SPEC C4, C5, C8, C9, C12).

One :class:`CacheMeta` owns everything mutable about the cache: the index of
published rows and their copies, the per-tier ledgers (bytes, quota, LRU),
pins, the reservation table of in-flight saves, the waiters parked on those
saves, and the moves that copy rows between tiers. It is a plain object:
every operation is a method call that returns its answer or raises a typed
error, time comes from an injected clock, and file effects (delete a copy,
validate an orphan, persist hit counts) go through a :class:`RowStore`. The
process layer (:mod:`llamad.cache.meta_proc`) only decodes messages, calls
these methods, hands the moves they ask for to the mover
(:meth:`CacheMeta.take_moves`) and reports back how they ended
(:meth:`CacheMeta.move_done`); unit tests step this object directly.

Reservation stages follow the publish protocol (C5)::

    reserve_save ──► RESERVED ──check_reservation──► CHECKED ──mark_published──► LINKED
                        │                               │                          │
                        └──────── cancel / reap ────────┴──── announce_saved ──────┴─► row

``RESERVED`` means nothing can be on the final path yet; from ``CHECKED`` on
the writer may have linked, so reaping a ``CHECKED`` or ``LINKED``
reservation (TTL elapsed, or its owner died) validates the final file and
adopts it, or unlinks it.

The tier hierarchy (C12). A save with no tier lands in the fastest tier
(among those the writer names) that can take it, by headroom or by evicting
unpinned copies. Quota eviction *demotes*: a copy evicted from ``ram`` gets
a copy made in ``ram_file``, from ``ram_file`` in ``disk``; from ``disk``
(or when no tier below can take it) it is deleted, and a copy whose row
already has one in the tier below is just dropped. A row saved in ``ram`` or
``ram_file`` gets a ``disk`` copy behind it (write-behind), a row read often
enough from a slower tier gets a copy in a faster one the reader may read
(promotion), and a clean stop demotes the ``ram`` copies
(:meth:`CacheMeta.begin_stop`). The copy itself is made off this object, by
the mover: a move reserves its bytes in the destination's ledger when it is
asked for, and the destination becomes a copy only once the mover reports it
complete, linked and synced; the source copy of a demotion leaves its
tier's ledger at once (its room is what the eviction was for) and stays
served until then (see :mod:`llamad.cache.moves`).

Waiters (``lookup_exact_or_wait`` and a ``resolve`` with a ``parent_key``)
are deferred replies: the method returns :data:`~llamad.cache.waiters.WAIT`,
and when the save publishes, is abandoned or the deadline passes, the answer
is queued for the process layer to collect with :meth:`CacheMeta.take_ready`.
The pin and waiter tables are their own small modules (:mod:`.pins`,
:mod:`.waiters`), the index entries too (:mod:`.rows`); the transitions that
use them all live here.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Container, Iterable, Sequence
from typing import Any, Final, Protocol

import structlog

from llamad.cache.counters import CounterSink, DictCounters
from llamad.cache.errors import (
    AlreadyCached,
    CacheFull,
    InvalidCacheValue,
    PublishAbandoned,
    SaveInFlight,
)
from llamad.cache.eviction import TierLedger, plan_across_tiers
from llamad.cache.key import HEADER_LEN, KEY_LEN, TOKEN_BYTES
from llamad.cache.kvc import MAX_TOKENS, KvcMeta, SaveReason
from llamad.cache.lookup import (
    HitKind,
    Lookup,
    RestorePlan,
    RowRef,
    choose_restore,
)
from llamad.cache.meta_config import MetaConfig
from llamad.cache.meta_wire import GcResult
from llamad.cache.moves import MoveJob, MoveKind, MoveResult, MoveTable
from llamad.cache.pins import PinTable
from llamad.cache.prefix import PrefixIndex
from llamad.cache.reservation import (
    Adopted,
    Grant,
    Owner,
    Reservation,
    SaveIntent,
    Stage,
    check_bytes,
    check_tokens,
)
from llamad.cache.rows import Copy, Row
from llamad.cache.tier_kind import TIER_ORDER, TierKind, check_tier, slower_tiers
from llamad.cache.waiters import WAIT, Deferred, Waiter, WaiterTable

__all__ = ["CacheMeta", "CopyObserver", "MetaConfig", "Row", "RowStore"]

log = structlog.get_logger("llamad.cache.meta")

_MAX_TOKEN_BYTES: Final = MAX_TOKENS * TOKEN_BYTES

_REASON_COUNTER: Final = {
    SaveReason.COLD: "saves_cold",
    SaveReason.CONTINUED: "saves_continued",
    SaveReason.FINISH: "saves_finish",
    SaveReason.EVICT: "saves_evict",
    SaveReason.SHUTDOWN: "saves_shutdown",
}

_MOVE_COUNTER: Final = {
    MoveKind.DEMOTE: "demotions",
    MoveKind.PROMOTE: "promotions",
    MoveKind.WRITE_BEHIND: "write_behind_copies",
}

# Optional moves in flight at once (demotions are never deferred: their source
# has already left its tier). One disk stream for the write-behind keeps the
# disk's bandwidth for restores; two promotions let a second hot row go up
# while a large one is being copied.
_WRITE_BEHIND_IN_FLIGHT: Final = 1
_PROMOTIONS_IN_FLIGHT: Final = 2

# What _demotion_target answers when the row already has a copy below.
_COVERED: Final = "covered"


class RowStore(Protocol):
    """File effects cache-meta needs from the tiers."""

    def delete(self, tier: TierKind, key: bytes, location: str) -> None:
        """Remove a copy's file (missing is fine)."""

    def adopt(self, tier: TierKind, key: bytes, location: str | None) -> Adopted | None:
        """Validate the published file of ``key``; unlink it and return None if invalid."""

    def persist_stats(self, tier: TierKind, location: str, hits: int, last_used_ns: int) -> None:
        """Write a row's hit count and last-used time back into one copy's header."""

    def exists(self, tier: TierKind, location: str) -> bool:
        """Whether a copy's file is still there."""


class CopyObserver(Protocol):
    """Told of every copy entering or leaving the index (the KV event publisher)."""

    def copy_added(self, row: Row, tier: TierKind) -> None: ...

    def copy_dropped(self, row: Row, tier: TierKind) -> None: ...


class CacheMeta:
    """The cache's single source of truth. Not thread-safe: one caller at a time."""

    def __init__(
        self,
        config: MetaConfig,
        store: RowStore,
        *,
        counters: CounterSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.config = config
        self.store = store
        self.counters: CounterSink = counters if counters is not None else DictCounters()
        self._clock = clock
        self._wall_ns = wall_ns
        self.ledgers: dict[TierKind, TierLedger[Copy]] = {
            tier: TierLedger(tier, quota) for tier, quota in config.quotas.items()
        }
        # Tiers that can hold a byte, fastest first: where saves, demotions,
        # promotions and write-behind copies may go.
        self._usable: tuple[TierKind, ...] = tuple(
            t for t in TIER_ORDER if config.quotas.get(t, 0) > 0
        )
        self.rows: dict[bytes, Row] = {}
        self.prefix = PrefixIndex()
        self.reservations: dict[bytes, Reservation] = {}
        # The tokens of every save in flight, by namespace: a lookup that a
        # row still being written would serve better than any published row
        # says so (Lookup.inflight_*), and may wait for it (SPEC M18).
        self.inflight = PrefixIndex()
        self.pins: PinTable[Copy] = PinTable()
        self.waiters = WaiterTable()
        self.moves = MoveTable()
        self._promote_hits = config.promote_hits
        self._write_behind = config.write_behind and TierKind.DISK in self._usable
        self._stopping = False
        # Tokens and pin ids start at a random point so that a writer holding a
        # token from a previous cache-meta incarnation cannot match a new one.
        # (os.urandom, as secrets reads it: ``secrets`` brings OpenSSL, P9.)
        self._next_id = int.from_bytes(os.urandom(5), "big") << 20
        self._lru_clock = 0
        # The KV event publisher, when [kv_events] is on (set by cache-meta's
        # process layer): _add_copy and _drop_copy are the only two places a
        # copy enters or leaves the index, so it misses none.
        self.observer: CopyObserver | None = None

    # ------------------------------------------------------------------ helpers

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _ledger(self, tier: TierKind) -> TierLedger[Copy]:
        ledger = self.ledgers.get(tier)
        if ledger is None:
            raise InvalidCacheValue("tier", f"tier {tier!r} is not configured")
        return ledger

    def _stamp(self, copy: Copy) -> None:
        self._lru_clock += 1
        copy.lru_seq = self._lru_clock

    def _sync_bytes(self, tier: TierKind) -> None:
        ledger = self.ledgers[tier]
        # The files the tier holds: its copies, and those being demoted out of it.
        self.counters.set(f"bytes_{tier}", ledger.used + ledger.leaving)

    def _touch(self, row: Row) -> None:
        """The row was used: every copy of it is now its tier's most recent.

        All of them, not only the one served: a hot row's ``disk`` copy is
        its insurance against a reboot and must not age out beneath it.
        """
        row.last_used_ns = self._wall_ns()
        for copy in row.copies.values():
            if not copy.leaving:
                self._lru_clock += 1
                copy.lru_seq = self._lru_clock
                self.ledgers[copy.tier].touch(copy)

    def _pin(self, copy: Copy, owner: Owner) -> int:
        pin = self._new_id()
        self.pins.add(pin, owner, copy)
        return pin

    def _hit(
        self, row: Row, copy: Copy, owner: Owner | None, tiers: Container[TierKind] | None
    ) -> RowRef:
        """``copy`` of ``row`` was served: LRU, hit count, the pin if there is an
        owner, and a promotion if the row is now hot."""
        self._touch(row)
        row.hits += 1
        row.stats_dirty = True
        pin = None
        if owner is not None:
            pin = self._next_id = self._next_id + 1
            self.pins.add(pin, owner, copy)
        if self._promote_hits and row.hits >= self._promote_hits and copy.tier is not TIER_ORDER[0]:
            self._promote(row, copy, tiers)
        return RowRef(row.key, copy.tier, copy.location, copy.size, row.n_tokens, pin)

    def _insert(self, row: Row, tokens: bytes) -> None:
        """Index a new row (its copies are added with :meth:`_add_copy`)."""
        row.tokens = tokens
        self.prefix.add(row.namespace, tokens, row.key)
        self.rows[row.key] = row

    def _add_copy(self, row: Row, tier: TierKind, location: str, size: int) -> Copy:
        copy = Copy(row, tier, location, size)
        self._stamp(copy)
        self.ledgers[tier].add(copy)
        row.copies[tier] = copy
        self._sync_bytes(tier)
        if self.observer is not None:
            self.observer.copy_added(row, tier)
        if (
            self._write_behind
            and TierKind.DISK not in row.copies
            and not self.moves.to(row.key, TierKind.DISK)
        ):
            self.moves.want_behind(row.key)
        return copy

    def _drop(self, row: Row, *, delete: bool) -> None:
        """Forget a row and all its copies (deleting their files when asked)."""
        for copy in list(row.copies.values()):
            self._drop_copy(copy, delete=delete, now=True)

    def _drop_copy(self, copy: Copy, *, delete: bool, now: bool = False) -> None:
        """Take one copy out of the index; the row goes with its last copy.

        With ``delete``, its file is removed: at once when ``now`` or nobody
        holds a pin on it, else at the last checkin (a loader may be about to
        read it; a copy elsewhere serves everyone else from here on).
        """
        row = copy.row
        if row.copies.get(copy.tier) is copy:
            del row.copies[copy.tier]
            if self.observer is not None:
                self.observer.copy_dropped(row, copy.tier)
        ledger = self.ledgers[copy.tier]
        if copy.leaving:
            ledger.leaving -= copy.size
            copy.leaving = False
        else:
            ledger.remove(copy)
        self._sync_bytes(copy.tier)
        if not row.copies and self.rows.get(row.key) is row:
            del self.rows[row.key]
            self.prefix.remove(row.namespace, row.tokens)
        if delete:
            if copy.pins and not now:
                copy.doomed = True
            else:
                self._delete_file(copy.tier, row.key, copy.location)

    def _delete_file(self, tier: TierKind, key: bytes, location: str) -> None:
        try:
            self.store.delete(tier, key, location)
        except Exception as exc:
            # The copy is out of the index either way; a file that could not
            # be removed is found again (and judged) by the next startup scan.
            log.warning("cache.delete_failed", key=key.hex(), tier=tier, error=str(exc))

    def _unpinned(self, copy: Copy) -> None:
        """A pin on ``copy`` was released: a doomed copy's file goes with its last pin."""
        if copy.doomed and copy.pins == 0:
            copy.doomed = False
            self._delete_file(copy.tier, copy.key, copy.location)

    # ----------------------------------------------------- room and eviction

    def _room_in(self, tier: TierKind, size: int) -> list[Copy] | None:
        """The copies to evict so that ``tier`` can take ``size`` more bytes
        (``[]``: it has the headroom), or None when it cannot: the size is over
        its quota, or the rest is pinned, reserved or already leaving."""
        ledger = self.ledgers.get(tier)
        if ledger is None or size > ledger.quota:
            return None
        need = size - ledger.headroom()
        if need <= 0:
            return []
        victims, freed = ledger.plan(need)
        return victims if freed >= need else None

    def _evict(self, victims: Sequence[Copy], *, demote: bool) -> int:
        """Evict ``victims`` (unpinned copies); returns the bytes their tiers got back.

        With ``demote`` (quota eviction) each copy moves down a tier when one
        can take it and its row has no copy there yet; a copy whose row has
        one there already is just dropped, and one nothing can take is
        deleted (``evictions`` counts what was dropped or deleted).
        """
        freed = dropped = 0
        for copy in victims:
            if copy.pins:  # pragma: no cover - plans only ever hold unpinned copies
                raise AssertionError("eviction plan contains a pinned copy")
            freed += copy.size
            target = self._demotion_target(copy) if demote else None
            if isinstance(target, tuple):
                self._demote(copy, *target)
                continue
            dropped += 1
            row = copy.row
            pending = None
            if not any(c is not copy and not c.leaving for c in row.copies.values()):
                # Its last copy, while one is being made elsewhere (a write-behind,
                # say): it leaves its tier now and goes when that one lands.
                pending = self.moves.elsewhere(row.key, copy.tier)
            if pending is not None:
                self._leave(copy, pending.id)
            else:
                self._drop_copy(copy, delete=True)
            log.info(
                "cache.evicted",
                key=copy.key.hex(),
                tier=copy.tier,
                size=copy.size,
                kept_elsewhere=target == _COVERED or pending is not None,
            )
        if dropped:
            self.counters.add("evictions", dropped)
        return freed

    def _demotion_target(self, copy: Copy) -> tuple[TierKind, list[Copy]] | str | None:
        """Where an evicted copy goes: the first usable tier below it that can
        take it (and the copies to evict there first), :data:`_COVERED` when
        the row already has (or is getting) a copy in that tier, or None."""
        row = copy.row
        for tier in slower_tiers(copy.tier):
            if tier not in self._usable:
                continue
            if tier in row.copies or self.moves.to(row.key, tier):
                return _COVERED
            victims = self._room_in(tier, copy.size)
            if victims is not None:
                return tier, victims
        return None

    def _demote(self, copy: Copy, tier: TierKind, victims: list[Copy]) -> None:
        """``copy`` leaves its tier now and is copied into ``tier``; it is served
        until the copy there lands (then dropped, see :meth:`move_done`)."""
        self._leave(copy, 0)
        copy.waits_for = self._start_move(MoveKind.DEMOTE, copy, tier, victims).id

    def _leave(self, copy: Copy, waits_for: int) -> None:
        """``copy`` is out of its tier's ledger but kept, and served, until move
        ``waits_for`` ends."""
        ledger = self.ledgers[copy.tier]
        ledger.remove(copy)
        ledger.leaving += copy.size
        copy.leaving = True
        copy.waits_for = waits_for
        self._sync_bytes(copy.tier)

    def _start_move(
        self, kind: MoveKind, source: Copy, tier: TierKind, victims: list[Copy]
    ) -> MoveJob:
        # Room first: the victims may demote in turn, a tier further down.
        self._evict(victims, demote=True)
        self.ledgers[tier].reserved += source.size
        job = MoveJob(
            id=self._new_id(),
            kind=kind,
            key=source.key,
            src_tier=source.tier,
            src_location=source.location,
            dst_tier=tier,
            size=source.size,
        )
        self.moves.add(job, source)
        log.debug("cache.move_started", key=job.key.hex(), kind=kind, src=job.src_tier, dst=tier)
        return job

    def _enforce_quota(self, ledger: TierLedger[Copy]) -> tuple[int, int]:
        need = -ledger.headroom()
        if need <= 0:
            return 0, 0
        victims, _ = ledger.plan(need)
        return len(victims), self._evict(victims, demote=True)

    # -------------------------------------------------------- moves (C12)

    def _promote(self, row: Row, copy: Copy, tiers: Container[TierKind] | None) -> None:
        """A hot row served from ``copy``: copy it into the fastest tier above
        that the reader may restore from and that can take it."""
        if self._stopping or self.moves.in_flight(MoveKind.PROMOTE) >= _PROMOTIONS_IN_FLIGHT:
            return
        for tier in self._usable:
            if tier is copy.tier or not tier.faster_than(copy.tier):
                return
            if tiers is not None and tier not in tiers:
                continue
            if tier in row.copies or self.moves.to(row.key, tier):
                return
            victims = self._room_in(tier, copy.size)
            if victims is not None:
                self._start_move(MoveKind.PROMOTE, copy, tier, victims)
                return

    def promote_newest(self, src: TierKind, dst: TierKind) -> int:
        """Promote the rows whose fastest copy is in ``src`` into ``dst``, the
        most recently used first, while ``dst`` has headroom (nothing is
        evicted for them); returns how many moves started.

        For a start (SPEC C12): a clean stop demoted the ``ram`` rows into
        ``ram_file`` before the purge, and the caller links them back, so a
        restart begins with the rows it stopped with, restored from ``ram``
        like before it. The caller asks only where the move is a link.
        """
        if self._stopping or src not in self._usable or dst not in self._usable:
            return 0
        rows = [
            row
            for row in self.rows.values()
            if (copy := row.fastest()) is not None
            and copy.tier is src
            and dst not in row.copies
            and not self.moves.to(row.key, dst)
        ]
        rows.sort(key=lambda r: r.last_used_ns, reverse=True)
        started = 0
        for row in rows:
            copy = row.copies[src]
            if self._room_in(dst, copy.size) == []:
                self._start_move(MoveKind.PROMOTE, copy, dst, [])
                started += 1
        return started

    def _pump(self) -> None:
        """Ask for the next write-behind copies while there is a slot for them."""
        while (
            self._write_behind
            and self.moves.in_flight(MoveKind.WRITE_BEHIND) < _WRITE_BEHIND_IN_FLIGHT
        ):
            key = self.moves.next_behind()
            if key is None:
                return
            row = self.rows.get(key)
            if row is None or TierKind.DISK in row.copies or self.moves.to(key, TierKind.DISK):
                continue
            source = row.fastest()
            assert source is not None, "an indexed row has a copy"
            victims = self._room_in(TierKind.DISK, source.size)
            if victims is None:
                # No room on disk now (pinned or reserved): the row is offered
                # again when cache-meta next starts.
                continue
            self._start_move(MoveKind.WRITE_BEHIND, source, TierKind.DISK, victims)

    @property
    def has_moves(self) -> bool:
        """Whether :meth:`take_moves` has something (cheap; for the process loop)."""
        return self.moves.has_new

    def take_moves(self) -> list[MoveJob]:
        """The moves asked for since the last call: the process hands them to the mover."""
        self._pump()
        return self.moves.take_new()

    def moves_in_flight(self) -> int:
        return len(self.moves)

    def move_done(self, result: MoveResult) -> None:
        """The mover finished a job: index the new copy, or clean up after it.

        The destination becomes a copy only now, when it is complete, linked
        and synced, and only if its row still wants it. The copies that left
        their tier waiting for this move (the source of a demotion) are
        dropped whatever happened to it: their tiers gave their room away
        when they left.
        """
        entry = self.moves.finish(result.job_id)
        if entry is None:
            log.warning("cache.move_unknown", job=result.job_id)
            return
        job, source = entry
        self.ledgers[job.dst_tier].reserved -= job.size
        row = source.row
        alive = self.rows.get(job.key) is row
        if result.location is not None:
            if alive and job.dst_tier not in row.copies:
                self._add_copy(row, job.dst_tier, result.location, result.size)
                self.counters.add(_MOVE_COUNTER[job.kind])
                if result.linked:
                    self.counters.add("moves_linked")
                log.info(
                    "cache.moved",
                    key=job.key.hex(),
                    kind=job.kind,
                    src=job.src_tier,
                    dst=job.dst_tier,
                    linked=result.linked,
                )
                # A file larger than the source said may push the tier over.
                self._enforce_quota(self.ledgers[job.dst_tier])
            elif not alive:
                # The row went (forgotten, evicted) while its copy was made;
                # no save can have taken the key meanwhile (reserve refuses a
                # key with a move in flight), so the file is the mover's.
                self._delete_file(job.dst_tier, job.key, result.location)
        else:
            self.counters.add("moves_failed")
            log.warning(
                "cache.move_failed",
                key=job.key.hex(),
                kind=job.kind,
                src=job.src_tier,
                dst=job.dst_tier,
                error=result.error,
            )
            if result.source_damaged and row.copies.get(source.tier) is source:
                # The mover found the damage and removed the file, as a loader would.
                self._drop_copy(source, delete=False)
            elif (
                job.kind is MoveKind.WRITE_BEHIND
                and result.source_missing
                and alive
                and self._write_behind
            ):
                # Its source went meanwhile (demoted, say): another copy may serve.
                self.moves.want_behind(job.key)
        for copy in [c for c in row.copies.values() if c.leaving and c.waits_for == job.id]:
            if result.location is None and copy is source and job.kind is MoveKind.DEMOTE:
                self.counters.add("evictions")  # a demotion that failed is an eviction
            self._drop_copy(copy, delete=True)
        self._pump()

    def begin_stop(self) -> int:
        """A clean stop: demote every unpinned ``ram`` copy, most recent first.

        ``ram`` is purged when the daemon stops; its rows go down a tier the
        way quota eviction would send them (``ram_file``, by a link where the
        two share a filesystem), where the next start finds them. No
        promotion starts from here on. Returns the demotions asked for.
        """
        self._stopping = True
        ram = self.ledgers.get(TierKind.RAM)
        if ram is None:
            return 0
        started = 0
        for copy in reversed(list(ram.rows())):
            if copy.pins:
                continue
            target = self._demotion_target(copy)
            if isinstance(target, tuple):
                self._demote(copy, *target)
                started += 1
        return started

    # ---------------------------------------------------------- publish (C5)

    def reserve_save(
        self,
        intent: SaveIntent,
        owner: Owner,
        *,
        ttl_s: float | None = None,
        tiers: Container[TierKind] | None = None,
    ) -> int:
        """:meth:`reserve`, answering the token alone."""
        return self.reserve(intent, owner, ttl_s=ttl_s, tiers=tiers).token

    def reserve(
        self,
        intent: SaveIntent,
        owner: Owner,
        *,
        ttl_s: float | None = None,
        tiers: Container[TierKind] | None = None,
    ) -> Grant:
        """Stage 1: claim ``intent.key`` for one writer; returns the token and the tier.

        ``intent.tier`` None lets cache-meta choose: the fastest tier with a
        quota (among ``tiers``, when given) that can take the row, by
        headroom or by evicting unpinned copies (which demote). Raises
        :class:`AlreadyCached` when the key is published (its LRU position is
        refreshed: the row is evidently still useful), :class:`SaveInFlight`
        when another live reservation holds it or a copy of it is being made,
        and :class:`CacheFull` when no allowed tier can make room without
        evicting pinned copies. Room is made only when enough of them exist.
        """
        ttl = self.config.reservation_ttl_s if ttl_s is None else ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
            raise InvalidCacheValue("ttl_s", f"{ttl!r} is not a positive number of seconds")
        if intent.tier is not None:
            self._ledger(intent.tier)
        row = self.rows.get(intent.key)
        if row is not None:
            self._touch(row)
            self.counters.add("duplicate_dropped")
            raise AlreadyCached("key is already published", details={"key": intent.key.hex()})
        current = self.reservations.get(intent.key)
        if current is not None:
            if current.deadline > self._clock():
                self.counters.add("duplicate_dropped")
                raise SaveInFlight(
                    "another save of this key is in flight", details={"key": intent.key.hex()}
                )
            self._reap(current, why="expired")
        if self.moves.moving(intent.key):
            # Its row went while a copy of it is being made: the mover's file
            # and this save would race for one final path.
            self.counters.add("duplicate_dropped")
            raise SaveInFlight(
                "a copy of this key is being made", details={"key": intent.key.hex()}
            )
        tier, victims = self._place(intent, tiers)
        self._evict(victims, demote=True)
        token = self._new_id()
        self.reservations[intent.key] = Reservation(
            token=token,
            intent=intent,
            owner=owner,
            stage=Stage.RESERVED,
            deadline=self._clock() + ttl,
            tier=tier,
        )
        self.inflight.add(intent.namespace, intent.tokens, intent.key)
        self.ledgers[tier].reserved += intent.size
        return Grant(token, tier)

    def _place(
        self, intent: SaveIntent, tiers: Container[TierKind] | None
    ) -> tuple[TierKind, list[Copy]]:
        """The tier a save goes to and the copies to evict there, or :class:`CacheFull`."""
        if intent.tier is not None:
            ledger = self.ledgers[intent.tier]
            if intent.size > ledger.quota:
                self.counters.add("saves_dropped")
                raise CacheFull(
                    f"{intent.size} bytes exceed the {intent.tier} quota of {ledger.quota}",
                    details={"tier": intent.tier, "size": intent.size},
                )
            victims = self._room_in(intent.tier, intent.size)
            if victims is None:
                self.counters.add("saves_dropped")
                raise CacheFull(
                    f"{intent.tier} cannot free {intent.size - ledger.headroom()} bytes: "
                    "the rest is pinned or reserved",
                    details={
                        "tier": intent.tier,
                        "size": intent.size,
                        "need": intent.size - ledger.headroom(),
                    },
                )
            return intent.tier, victims
        for tier in self._usable:
            if tiers is not None and tier not in tiers:
                continue
            victims = self._room_in(tier, intent.size)
            if victims is not None:
                return tier, victims
        self.counters.add("saves_dropped")
        raise CacheFull(
            f"no tier can take {intent.size} bytes: each is too small, or the rest is "
            "pinned or reserved",
            details={"tier": "auto", "size": intent.size},
        )

    def _live(self, key: bytes, token: int) -> Reservation:
        res = self.reservations.get(key)
        if res is None or res.token != token:
            raise PublishAbandoned(
                "reservation is gone (expired, cancelled or superseded)",
                details={"key": key.hex(), "reason": "superseded" if res else "expired"},
            )
        return res

    def _renew(self, res: Reservation) -> None:
        res.deadline = max(res.deadline, self._clock() + self.config.reservation_ttl_s)

    def check_reservation(self, key: bytes, token: int) -> None:
        """Stage 3: confirm the token is still the live one, right before ``link(2)``.

        Raises :class:`PublishAbandoned` when it is not; the writer must then
        delete its tmp file and give up.
        """
        res = self._live(key, token)
        if res.stage is Stage.RESERVED:
            res.stage = Stage.CHECKED
        self._renew(res)

    def mark_published(self, key: bytes, token: int, location: str) -> None:
        """Stage 4 done: the final file is linked at ``location`` (not yet announced)."""
        if not isinstance(location, str) or not location:
            raise InvalidCacheValue("location", "expected a non-empty string")
        res = self._live(key, token)
        if res.stage is Stage.RESERVED:
            raise InvalidCacheValue("token", "check_reservation must come before the link")
        res.stage = Stage.LINKED
        res.location = location
        self._renew(res)

    def announce_saved(
        self, key: bytes, token: int, *, location: str | None = None, size: int | None = None
    ) -> RowRef:
        """Stage 5: the row is durable; make it visible and wake its waiters.

        ``location`` is required unless :meth:`mark_published` gave it;
        ``size`` corrects the reserved size when the file came out different.
        """
        res = self._live(key, token)
        if res.stage is Stage.RESERVED:
            raise InvalidCacheValue("token", "check_reservation must come before announce_saved")
        where = location if location is not None else res.location
        if not isinstance(where, str) or not where:
            raise InvalidCacheValue("location", "announce_saved needs the row's location")
        actual = res.intent.size if size is None else size
        if isinstance(actual, bool) or not isinstance(actual, int) or actual <= 0:
            raise InvalidCacheValue("size", f"{actual!r} is not a positive byte count")
        now = self._wall_ns()
        row = self._publish(res, where, actual, hits=0, created_ns=now, last_used_ns=now)
        self.counters.add(_REASON_COUNTER[res.intent.reason])
        log.info(
            "cache.published",
            key=key.hex(),
            tier=res.tier,
            size=actual,
            n_tokens=row.n_tokens,
            reason=res.intent.reason.name.lower(),
        )
        return row.ref()

    def _publish(
        self,
        res: Reservation,
        location: str,
        size: int,
        *,
        hits: int,
        created_ns: int,
        last_used_ns: int,
    ) -> Row:
        intent = res.intent
        del self.reservations[intent.key]
        self.inflight.remove(intent.namespace, intent.tokens)
        ledger = self.ledgers[res.tier]
        ledger.reserved -= intent.size
        row = Row(
            key=intent.key,
            namespace=intent.namespace,
            n_tokens=intent.n_tokens,
            reason=intent.reason,
            created_ns=created_ns,
            last_used_ns=last_used_ns,
            hits=hits,
        )
        self._insert(row, intent.tokens)
        self._add_copy(row, res.tier, location, size)
        self.waiters.release(intent.key, True)
        # A file larger than promised may push the tier over quota.
        self._enforce_quota(ledger)
        self._pump()
        return row

    def cancel_reservation(self, key: bytes, token: int) -> bool:
        """The writer gave up; returns whether the reservation was still live."""
        res = self.reservations.get(key)
        if res is None or res.token != token:
            return False
        self._drop_reservation(res)
        return True

    def _drop_reservation(self, res: Reservation) -> None:
        del self.reservations[res.intent.key]
        self.inflight.remove(res.intent.namespace, res.intent.tokens)
        self.ledgers[res.tier].reserved -= res.intent.size
        self.waiters.release(res.intent.key, False)

    def _reap(self, res: Reservation, *, why: str) -> None:
        """Clean up after a writer that expired or died (two-stage, C5)."""
        if res.stage is Stage.RESERVED:
            self._drop_reservation(res)
            log.info("cache.reservation_dropped", key=res.intent.key.hex(), why=why)
            return
        try:
            adopted = self.store.adopt(res.tier, res.intent.key, res.location)
        except Exception as exc:
            # Reaping runs from cache-meta's loop and must never take it down; a
            # file that could not be judged now is judged by the next startup scan.
            log.warning("cache.adopt_failed", key=res.intent.key.hex(), error=str(exc))
            adopted = None
        if adopted is None:
            self._drop_reservation(res)
            log.info(
                "cache.reservation_dropped", key=res.intent.key.hex(), why=why, stage=res.stage.name
            )
            return
        meta = adopted.meta
        self._publish(
            res,
            adopted.location,
            meta.file_size,
            hits=meta.hit_count,
            created_ns=meta.created_ns,
            last_used_ns=meta.last_used_ns,
        )
        self.counters.add(_REASON_COUNTER[res.intent.reason])
        log.info("cache.orphan_adopted", key=res.intent.key.hex(), why=why, tier=res.tier)

    # ------------------------------------------------------------- pins (C4)

    def forget(self, key: bytes, tier: TierKind | None = None) -> bool:
        """Drop a copy a loader found corrupt or missing (its file is already gone).

        ``tier`` names the copy the loader read; the row's other copies stay
        served (a reader that lost a race to a deleted copy must not take the
        row's other copies with it). Without ``tier``, every copy goes. Pins
        on a dropped copy stay valid to check in; its bytes are not served again.
        """
        row = self.rows.get(key)
        if row is None:
            return False
        if tier is None:
            self._drop(row, delete=True)
            log.warning("cache.row_forgotten", key=key.hex())
            return True
        copy = row.copies.get(check_tier(tier))
        if copy is None:
            return False
        self._drop_copy(copy, delete=True, now=True)
        log.warning("cache.copy_forgotten", key=key.hex(), tier=copy.tier)
        return True

    def checkout(
        self, key: bytes, owner: Owner, tiers: Container[TierKind] | None = None
    ) -> RowRef | None:
        """Pin a published row's fastest copy (in ``tiers``) for ``owner`` without
        counting a lookup."""
        row = self.rows.get(key)
        copy = None if row is None else row.fastest(tiers)
        if row is None or copy is None:
            return None
        self._touch(row)
        return copy.ref(self._pin(copy, owner))

    def checkin(self, pin: int) -> bool:
        """Release a pin; returns whether it was held."""
        copy = self.pins.take(pin)
        if copy is None:
            return False
        self._unpinned(copy)
        return True

    def pins_of(self, owner: Owner) -> int:
        return len(self.pins.of_owner(owner))

    def owners(self) -> set[Owner]:
        """Every owner currently holding a pin, a reservation or a waiter."""
        found = self.pins.owners()
        found.update(res.owner for res in self.reservations.values())
        found.update(self.waiters.owners())
        return found

    def owner_down(self, owner: Owner) -> None:
        """``owner`` died: release its pins, reap its reservations, drop its waiters."""
        pins = self.pins.of_owner(owner)
        for pin in pins:
            self.checkin(pin)
        for res in [r for r in self.reservations.values() if r.owner == owner]:
            self._reap(res, why="owner_down")
        self.waiters.drop_owner(owner)
        if pins:
            log.info("cache.pins_released", owner=owner, pins=len(pins))

    # ----------------------------------------------------------- lookups (C8)

    def lookup_exact(
        self, key: bytes, owner: Owner | None = None, tiers: Container[TierKind] | None = None
    ) -> RowRef | None:
        """The row of exactly ``key`` (its fastest copy in ``tiers``), pinned for
        ``owner`` when one is given."""
        row = self.rows.get(key)
        copy = None if row is None else row.fastest(tiers)
        if row is None or copy is None:
            self.counters.add("misses")
            return None
        self.counters.add("hits_exact")
        return self._hit(row, copy, owner, tiers)

    def lookup_exact_or_wait(
        self,
        key: bytes,
        owner: Owner,
        wait_s: float,
        handle: object,
        tiers: Container[TierKind] | None = None,
    ) -> RowRef | Deferred | None:
        """Like :meth:`lookup_exact`, but wait up to ``wait_s`` for an in-flight save.

        Returns :data:`WAIT` when a waiter was parked; ``handle`` comes back
        from :meth:`take_ready` with the row (pinned) or ``None``.
        """
        row = self.rows.get(key)
        if row is not None:
            return self.lookup_exact(key, owner, tiers)
        if key not in self.reservations or wait_s <= 0:
            self.counters.add("misses")
            return None

        def finish(published: bool) -> RowRef | None:
            found = self.rows.get(key) if published else None
            copy = None if found is None else found.fastest(tiers)
            if found is None or copy is None:
                self.counters.add("misses")
                return None
            self.counters.add("hits_resume")
            return self._hit(found, copy, owner, tiers)

        self._park(key, owner, wait_s, handle, finish)
        return WAIT

    def _park(
        self,
        key: bytes,
        owner: Owner,
        wait_s: float,
        handle: object,
        finish: Callable[[bool], object],
    ) -> None:
        wait = min(float(wait_s), self.config.max_wait_s)
        self.waiters.park(Waiter(handle, key, owner, self._clock() + wait, finish))

    def longest_prefix(
        self,
        namespace: bytes,
        tokens: bytes,
        owner: Owner | None = None,
        *,
        parent_key: bytes | None = None,
        tiers: Container[TierKind] | None = None,
    ) -> Lookup:
        """Longest saved prefix of the prompt, or the best row to restore and truncate.

        One call answers everything the worker needs: the chosen row (its
        fastest copy among ``tiers``, the tiers the caller restores from;
        default any), pinned for ``owner``, how many prompt tokens it covers,
        and the longest common prefix with any row of the namespace. The
        chosen row's own namespace and tokens are compared with the prompt
        before it is returned (see :meth:`_verified`), so an index fault can
        only ever produce a miss, never a wrong state.
        """
        # The common case (bytes of the right shapes) is checked inline; the
        # helpers raise (or convert a bytearray) otherwise.
        if type(namespace) is not bytes or len(namespace) != HEADER_LEN:
            namespace = check_bytes("namespace", namespace, HEADER_LEN)
        if (
            type(tokens) is not bytes
            or not 0 < len(tokens) <= _MAX_TOKEN_BYTES
            or len(tokens) % TOKEN_BYTES
        ):
            tokens = check_tokens(tokens)
        return self._longest_prefix(
            namespace, tokens, owner, parent_key=parent_key, resumed=False, tiers=tiers
        )

    def _longest_prefix(
        self,
        namespace: bytes,
        tokens: bytes,
        owner: Owner | None,
        *,
        parent_key: bytes | None,
        resumed: bool,
        tiers: Container[TierKind] | None,
    ) -> Lookup:
        started = time.perf_counter_ns()
        match = self.prefix.match(namespace, tokens)
        n_prompt = len(tokens) // TOKEN_BYTES
        plan = choose_restore(match, n_prompt, self.config.lookup)
        row = None if plan is None else self.rows.get(plan.key)
        copy = None
        if plan is not None and row is not None and self._verified(row, plan, namespace, tokens):
            # A row the caller cannot read (no copy in its tiers) is a miss
            # here, not a row the caller would have to turn into one.
            copy = row.fastest(tiers)
        if plan is None or row is None or copy is None:
            inflight_key, inflight_tokens = self._inflight_beyond(namespace, tokens, 0)
            self.counters.add_many(
                ("longest_prefix_probes", match.probes),
                ("misses", 1),
                ("longest_prefix_ns", time.perf_counter_ns() - started),
            )
            return Lookup(
                None,
                None,
                0,
                match.common_tokens,
                match.common_key,
                resumed,
                match.probes,
                inflight_key,
                inflight_tokens,
            )
        if resumed and row.key == parent_key:
            hit = "hits_resume"
        elif row.key == parent_key or plan.use_tokens == n_prompt:
            # The whole prompt is restored: from a row of exactly the prompt,
            # or from a longer one that starts with it (the prompt's previous
            # turn saved with its reply), truncated to the prompt.
            hit = "hits_exact"
        else:
            hit = "hits_longest_prefix"
        ref = self._hit(row, copy, owner, tiers)
        inflight_key, inflight_tokens = self._inflight_beyond(namespace, tokens, plan.use_tokens)
        self.counters.add_many(
            ("longest_prefix_probes", match.probes),
            (hit, 1),
            ("longest_prefix_ns", time.perf_counter_ns() - started),
        )
        return Lookup(
            plan.kind,
            ref,
            plan.use_tokens,
            match.common_tokens,
            match.common_key,
            resumed,
            match.probes,
            inflight_key,
            inflight_tokens,
        )

    def _inflight_beyond(
        self, namespace: bytes, tokens: bytes, use: int
    ) -> tuple[bytes | None, int]:
        """The save in flight that would serve the prompt better than ``use``
        tokens (the published answer), as ``(key, tokens it would cover)``;
        ``(None, 0)`` when none would. No pin, no count: it is a report."""
        if not len(self.inflight):
            return None, 0
        match = self.inflight.match(namespace, tokens)
        plan = choose_restore(match, len(tokens) // TOKEN_BYTES, self.config.lookup)
        if plan is None or plan.use_tokens <= use:
            return None, 0
        return plan.key, plan.use_tokens

    def _verified(self, row: Row, plan: RestorePlan, namespace: bytes, prompt: bytes) -> bool:
        """Whether ``row`` holds the prompt's first ``plan.use_tokens`` tokens.

        Every row's key was derived from its namespace and tokens when it
        entered the index (a :class:`~llamad.cache.reservation.SaveIntent`
        and the ``.kvc`` scan both recompute ``sha256(namespace || tokens)``
        and refuse a mismatch), and those bytes never change. Comparing the
        row's namespace and tokens with the prompt byte for byte therefore
        proves that the row's key is the key of the prompt's covered tokens,
        as hashing them again would, at the cost of a ``memcmp`` instead of a
        ``sha256`` over up to the whole row (which made a hit cost tens of
        µs more than a miss). A token string filed under another row's key
        fails the comparison: a miss, never a wrong state.
        """
        span = plan.use_tokens * TOKEN_BYTES
        own = row.tokens
        if plan.kind is HitKind.COMMON:
            # The whole row is restored, then truncated to the shared span.
            ok = len(own) >= span and own.startswith(memoryview(prompt)[:span])
        else:
            ok = len(own) == span and prompt.startswith(own)
        if ok and row.namespace == namespace:
            return True
        log.error("cache.index_mismatch", key=row.key.hex())
        self._drop(row, delete=False)
        return False

    def resolve(
        self,
        namespace: bytes,
        tokens: bytes,
        owner: Owner,
        *,
        parent_key: bytes | None = None,
        wait_s: float = 0.0,
        handle: object = None,
        tiers: Container[TierKind] | None = None,
    ) -> Lookup | Deferred:
        """The model worker's whole cache resolution in one round trip.

        With ``wait_s`` > 0, a save still in flight is waited for (a deferred
        answer, :data:`WAIT`) when it is ``parent_key``'s, or when it would
        serve the prompt better than every published row (SPEC M18: a lookup
        never runs cold past a save in flight without saying so); then, or
        straight away, run :meth:`longest_prefix` on the prompt (answering a
        copy in ``tiers``). An answer that waited says ``resumed``. The
        parent key is a hint, never trusted: the row is used only if its
        tokens are a prefix of the prompt.
        """
        namespace = check_bytes("namespace", namespace, HEADER_LEN)
        tokens = check_tokens(tokens)
        awaited: bytes | None = None
        if parent_key is not None:
            parent_key = check_bytes("parent_key", parent_key, KEY_LEN)
            if parent_key not in self.rows and parent_key in self.reservations:
                awaited = parent_key
        if awaited is None and wait_s > 0 and len(self.inflight):
            match = self.prefix.match(namespace, tokens)
            plan = choose_restore(match, len(tokens) // TOKEN_BYTES, self.config.lookup)
            published = 0 if plan is None else plan.use_tokens
            awaited = self._inflight_beyond(namespace, tokens, published)[0]
        if awaited is not None and wait_s > 0:
            key = awaited

            def finish(published: bool) -> Lookup:
                return self._longest_prefix(
                    namespace,
                    tokens,
                    owner,
                    parent_key=key,
                    resumed=published,
                    tiers=tiers,
                )

            self._park(key, owner, wait_s, handle, finish)
            return WAIT
        return self._longest_prefix(
            namespace, tokens, owner, parent_key=parent_key, resumed=False, tiers=tiers
        )

    # ---------------------------------------------------- eviction, gc (C9)

    def evict_bytes(self, n: int, tiers: Iterable[TierKind] | None = None) -> tuple[int, int]:
        """Free at least ``n`` bytes of ``tiers`` (default: all), globally least
        recently used first.

        Copies are dropped, not demoted (this is how memory pressure and an
        operator take bytes back); a row keeps its copies in the other tiers.
        Only unpinned copies are candidates; returns ``(copies evicted, bytes
        freed)``, which may fall short of ``n`` when the rest is pinned.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidCacheValue("n", f"{n!r} is not a byte count >= 0")
        names = list(self.ledgers) if tiers is None else [check_tier(t) for t in tiers]
        ledgers = [self.ledgers[t] for t in names if t in self.ledgers]
        victims, _ = plan_across_tiers(ledgers, n)
        return len(victims), self._evict(victims, demote=False)

    def used_bytes(self, tiers: Iterable[TierKind] | None = None) -> int:
        names = list(self.ledgers) if tiers is None else list(tiers)
        return sum(self.ledgers[t].used for t in names if t in self.ledgers)

    def gc(self) -> GcResult:
        """A full maintenance pass: reap expired reservations, drop copies whose
        files vanished, bring every tier under its quota, persist hit counts."""
        reaped = self.reap_expired()
        missing = 0
        for row in list(self.rows.values()):
            for copy in list(row.copies.values()):
                if (
                    copy.pins == 0
                    and not copy.leaving
                    and not self.store.exists(copy.tier, copy.location)
                ):
                    self._drop_copy(copy, delete=False)
                    missing += 1
        evicted = freed = 0
        for ledger in self.ledgers.values():
            n, b = self._enforce_quota(ledger)
            evicted += n
            freed += b
        self.flush_stats()
        return GcResult(evicted=evicted, bytes_freed=freed, missing=missing, reaped=reaped)

    # ------------------------------------------------------ time, waiters

    def reap_expired(self) -> int:
        """Reap every reservation whose TTL elapsed; returns how many."""
        now = self._clock()
        expired = [res for res in self.reservations.values() if res.deadline <= now]
        for res in expired:
            self._reap(res, why="expired")
        return len(expired)

    def tick(self) -> None:
        """Run everything that is due: reservation TTLs and waiter deadlines."""
        self.reap_expired()
        self.waiters.expire(self._clock())

    def next_deadline(self) -> float | None:
        """The earliest clock value at which :meth:`tick` has work, if any."""
        waiting = self.waiters.next_deadline()
        deadlines = [res.deadline for res in self.reservations.values()]
        if waiting is not None:
            deadlines.append(waiting)
        return min(deadlines, default=None)

    def take_ready(self) -> list[tuple[object, object]]:
        """Deferred answers that became ready: ``(handle, answer)`` pairs."""
        return self.waiters.take_ready()

    def waiting(self) -> int:
        return len(self.waiters)

    # ------------------------------------------------ startup and hit counts

    def adopt_file(self, meta: KvcMeta, tier: TierKind, location: str) -> bool:
        """Index a valid file found by a startup scan; returns whether it was kept.

        A key already indexed gets this file as its copy in ``tier`` (a row
        written behind to ``disk``, or demoted by a link, has a file in two
        tiers); the row keeps the highest hit count and latest use of its
        copies. Call :meth:`finish_rebuild` after the last file.
        """
        tier = check_tier(tier)
        self._ledger(tier)
        row = self.rows.get(meta.key)
        if row is not None:
            if tier in row.copies:
                # One file per key and tier: a second one is not ours to serve.
                self.counters.add("duplicate_dropped")
                self._delete_file(tier, meta.key, location)
                return False
            row.hits = max(row.hits, meta.hit_count)
            row.last_used_ns = max(row.last_used_ns, meta.last_used_ns)
        else:
            row = Row(
                key=meta.key,
                namespace=meta.namespace.header(),
                n_tokens=meta.n_tokens,
                reason=meta.reason,
                created_ns=meta.created_ns,
                last_used_ns=meta.last_used_ns,
                hits=meta.hit_count,
            )
            self._insert(row, meta.tokens)
        self._add_copy(row, tier, location, meta.file_size)
        return True

    def finish_rebuild(self) -> tuple[int, int]:
        """Order each tier's LRU after a scan, then enforce quotas.

        Copies are ranked by their row's popularity first (hit count in log2
        buckets, as persisted in the file headers) and recency second, so rows
        that were hit often survive the first eviction walk after a restart
        even if their last use is older. Quota enforcement demotes as usual
        (the mover carries it out once cache-meta serves). Returns what it
        evicted: copies, and the bytes their tiers got back.
        """
        evicted = freed = 0
        for ledger in self.ledgers.values():
            ordered = sorted(
                ledger.rows(), key=lambda c: (c.row.hits.bit_length(), c.row.last_used_ns)
            )
            for copy in ordered:
                ledger.remove(copy)
            for copy in ordered:
                self._stamp(copy)
                ledger.add(copy)
            n, b = self._enforce_quota(ledger)
            evicted += n
            freed += b
            self._sync_bytes(ledger.name)
        return evicted, freed

    def flush_stats(self, limit: int | None = None) -> int:
        """Persist dirty hit counts into every copy's header; returns how many rows.

        Only rows with no pinned copy and no move in flight: a loader or the
        mover may be reading a copy's header (copies made by ``link(2)`` share
        one file), and a header rewritten under a reader could fail its check.
        """
        done = 0
        for row in self.rows.values():
            if limit is not None and done >= limit:
                break
            if not row.stats_dirty or row.pins or self.moves.moving(row.key):
                continue
            for copy in row.copies.values():
                try:
                    self.store.persist_stats(
                        copy.tier, copy.location, min(row.hits, 2**32 - 1), row.last_used_ns
                    )
                except Exception as exc:  # a vanished or damaged file must not stop the flush
                    log.warning("cache.stats_persist_failed", key=row.key.hex(), error=str(exc))
            row.stats_dirty = False
            done += 1
        return done

    # ------------------------------------------------------------- inspection

    def dump(self) -> list[dict[str, Any]]:
        """Every row (its fastest copy, and all its copies) and reservation as plain dicts."""
        out = [row.describe() for row in self.rows.values()]
        out.extend(res.describe() for res in self.reservations.values())
        return out

    def status(self) -> dict[str, Any]:
        return {
            "rows": len(self.rows),
            "reservations": len(self.reservations),
            "pins": len(self.pins),
            "waiters": self.waiting(),
            "moves": {
                "in_flight": len(self.moves),
                "demote": self.moves.in_flight(MoveKind.DEMOTE),
                "promote": self.moves.in_flight(MoveKind.PROMOTE),
                "write_behind": self.moves.in_flight(MoveKind.WRITE_BEHIND),
                "write_behind_waiting": self.moves.behind,
            },
            "tiers": {
                name: {
                    "quota": ledger.quota,
                    "used": ledger.used,
                    "reserved": ledger.reserved,
                    "leaving": ledger.leaving,
                    "rows": len(ledger),
                }
                for name, ledger in self.ledgers.items()
            },
        }
