"""cache-meta: the sole writer's state machine (SPEC C4, C5, C8, C9).

One :class:`CacheMeta` owns everything mutable about the cache: the index of
published rows, the per-tier ledgers (bytes, quota, LRU), pins, the
reservation table of in-flight saves, and the waiters parked on those saves.
It is a plain object: every operation is a method call that returns its
answer or raises a typed error, time comes from an injected clock, and file
effects (delete a row, validate an orphan, persist hit counts) go through a
:class:`RowStore`. The process layer (:mod:`llamad.cache.meta_proc`) only
decodes messages, calls these methods and sends replies; unit tests step this
object directly.

Reservation stages follow the publish protocol (C5)::

    reserve_save ──► RESERVED ──check_reservation──► CHECKED ──mark_published──► LINKED
                        │                               │                          │
                        └──────── cancel / reap ────────┴──── announce_saved ──────┴─► row

``RESERVED`` means nothing can be on the final path yet; from ``CHECKED`` on
the writer may have linked, so reaping a ``CHECKED`` or ``LINKED``
reservation (TTL elapsed, or its owner died) validates the final file and
adopts it, or unlinks it.

Waiters (``lookup_exact_or_wait`` and a ``resolve`` with a ``parent_key``)
are deferred replies: the method returns :data:`~llamad.cache.waiters.WAIT`,
and when the save publishes, is abandoned or the deadline passes, the answer
is queued for the process layer to collect with :meth:`CacheMeta.take_ready`.
The pin and waiter tables are their own small modules (:mod:`.pins`,
:mod:`.waiters`); the transitions that use them all live here.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import msgspec
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
    LookupPolicy,
    RestorePlan,
    RowRef,
    choose_restore,
)
from llamad.cache.pins import PinTable
from llamad.cache.prefix import PrefixIndex
from llamad.cache.reservation import (
    Adopted,
    Owner,
    Reservation,
    SaveIntent,
    Stage,
    check_bytes,
    check_tokens,
)
from llamad.cache.tier_kind import TierKind, check_tier
from llamad.cache.waiters import WAIT, Deferred, Waiter, WaiterTable

log = structlog.get_logger("llamad.cache.meta")

_MAX_TOKEN_BYTES: Final = MAX_TOKENS * TOKEN_BYTES

_REASON_COUNTER: Final = {
    SaveReason.COLD: "saves_cold",
    SaveReason.CONTINUED: "saves_continued",
    SaveReason.FINISH: "saves_finish",
    SaveReason.EVICT: "saves_evict",
    SaveReason.SHUTDOWN: "saves_shutdown",
}


@dataclass(slots=True)
class Row:
    """A published row in the index. Its tokens live in the prefix index."""

    key: bytes
    namespace: bytes
    tier: TierKind
    size: int
    n_tokens: int
    location: str
    reason: SaveReason
    created_ns: int
    last_used_ns: int
    # The row's token ids (u32 LE): the very object the prefix index holds.
    tokens: bytes = b""
    hits: int = 0
    pins: int = 0
    lru_seq: int = 0
    stats_dirty: bool = False

    def ref(self, pin: int | None = None) -> RowRef:
        return RowRef(self.key, self.tier, self.location, self.size, self.n_tokens, pin)

    def describe(self) -> dict[str, Any]:
        return {
            "key": self.key.hex(),
            "tier": self.tier,
            "size": self.size,
            "n_tokens": self.n_tokens,
            "location": self.location,
            "reason": self.reason.name.lower(),
            "created_ns": self.created_ns,
            "last_used_ns": self.last_used_ns,
            "hits": self.hits,
            "pins": self.pins,
            "status": "available",
        }


class RowStore(Protocol):
    """File effects cache-meta needs from the tiers."""

    def delete(self, tier: TierKind, key: bytes, location: str) -> None:
        """Remove a row's bytes (missing is fine)."""

    def adopt(self, tier: TierKind, key: bytes, location: str | None) -> Adopted | None:
        """Validate the published file of ``key``; unlink it and return None if invalid."""

    def persist_stats(self, tier: TierKind, location: str, hits: int, last_used_ns: int) -> None:
        """Write a row's hit count and last-used time back into its file header."""

    def exists(self, tier: TierKind, location: str) -> bool:
        """Whether a row's bytes are still there."""


@dataclass(frozen=True, slots=True)
class MetaConfig:
    """Quotas and timings of cache-meta; invalid values raise naming the field.

    ``quotas`` maps tier → byte quota; a tier left out is not served.
    ``reservation_ttl_s`` bounds how long a silent writer keeps a key
    reserved (each protocol step renews it). ``max_wait_s`` caps the wait a
    lookup may ask for.
    """

    quotas: Mapping[TierKind, int]
    reservation_ttl_s: float = 60.0
    max_wait_s: float = 60.0
    lookup: LookupPolicy = field(default_factory=LookupPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.quotas, Mapping) or not self.quotas:
            raise InvalidCacheValue("quotas", "at least one tier needs a quota")
        quotas: dict[TierKind, int] = {}
        for tier, quota in self.quotas.items():
            if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
                raise InvalidCacheValue("quotas", f"{tier}: {quota!r} is not a byte count >= 0")
            quotas[check_tier(tier)] = quota
        object.__setattr__(self, "quotas", quotas)
        for name in ("reservation_ttl_s", "max_wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidCacheValue(name, f"{value!r} is not a positive number of seconds")
        if not isinstance(self.lookup, LookupPolicy):
            raise InvalidCacheValue("lookup", "expected a LookupPolicy")


class GcReport(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What :meth:`CacheMeta.gc` did; also the ``gc`` op's reply, as is."""

    evicted: int
    bytes_freed: int
    missing: int
    reaped: int


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
        self.ledgers: dict[TierKind, TierLedger[Row]] = {
            tier: TierLedger(tier, quota) for tier, quota in config.quotas.items()
        }
        self.rows: dict[bytes, Row] = {}
        self.prefix = PrefixIndex()
        self.reservations: dict[bytes, Reservation] = {}
        self.pins: PinTable[Row] = PinTable()
        self.waiters = WaiterTable()
        # Tokens and pin ids start at a random point so that a writer holding a
        # token from a previous cache-meta incarnation cannot match a new one.
        self._next_id = secrets.randbits(40) << 20
        self._lru_clock = 0

    # ------------------------------------------------------------------ helpers

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _ledger(self, tier: TierKind) -> TierLedger[Row]:
        ledger = self.ledgers.get(tier)
        if ledger is None:
            raise InvalidCacheValue("tier", f"tier {tier!r} is not configured")
        return ledger

    def _stamp(self, row: Row) -> None:
        self._lru_clock += 1
        row.lru_seq = self._lru_clock

    def _sync_bytes(self, tier: TierKind) -> None:
        self.counters.set(f"bytes_{tier}", self.ledgers[tier].used)

    def _touch(self, row: Row) -> None:
        self._stamp(row)
        row.last_used_ns = self._wall_ns()
        self.ledgers[row.tier].touch(row)

    def _pin(self, row: Row, owner: Owner) -> int:
        pin = self._new_id()
        self.pins.add(pin, owner, row)
        return pin

    def _hit(self, row: Row, owner: Owner | None) -> RowRef:
        """A row was served: LRU, hit count, and the pin if there is an owner."""
        self._touch(row)
        row.hits += 1
        row.stats_dirty = True
        pin = None
        if owner is not None:
            pin = self._next_id = self._next_id + 1
            self.pins.add(pin, owner, row)
        return RowRef(row.key, row.tier, row.location, row.size, row.n_tokens, pin)

    def _insert(self, row: Row, tokens: bytes) -> None:
        ledger = self.ledgers[row.tier]
        row.tokens = tokens
        self.prefix.add(row.namespace, tokens, row.key)
        self._stamp(row)
        ledger.add(row)
        self.rows[row.key] = row
        self._sync_bytes(row.tier)

    def _drop(self, row: Row, *, delete: bool) -> None:
        """Forget a row (and delete its bytes when asked)."""
        del self.rows[row.key]
        ledger = self.ledgers[row.tier]
        ledger.remove(row)
        self.prefix.remove(row.namespace, row.tokens)
        self._sync_bytes(row.tier)
        if delete:
            self._delete_file(row.tier, row.key, row.location)

    def _delete_file(self, tier: TierKind, key: bytes, location: str) -> None:
        try:
            self.store.delete(tier, key, location)
        except Exception as exc:
            # The row is out of the index either way; a file that could not
            # be removed is found again (and judged) by the next startup scan.
            log.warning("cache.delete_failed", key=key.hex(), tier=tier, error=str(exc))

    def _evict(self, victims: Sequence[Row]) -> int:
        freed = 0
        for row in victims:
            if row.pins:  # pragma: no cover - plans only ever hold unpinned rows
                raise AssertionError("eviction plan contains a pinned row")
            self._drop(row, delete=True)
            freed += row.size
            log.info("cache.evicted", key=row.key.hex(), tier=row.tier, size=row.size)
        if victims:
            self.counters.add("evictions", len(victims))
        return freed

    # ---------------------------------------------------------- publish (C5)

    def reserve_save(self, intent: SaveIntent, owner: Owner, *, ttl_s: float | None = None) -> int:
        """Stage 1: claim ``intent.key`` for one writer; returns the reservation token.

        Raises :class:`AlreadyCached` when the key is published (its LRU
        position is refreshed: the row is evidently still useful),
        :class:`SaveInFlight` when another live reservation holds it, and
        :class:`CacheFull` when the tier cannot make room without evicting
        pinned rows. Room is made by evicting the tier's least recently used
        unpinned rows, and only when enough of them exist.
        """
        ledger = self._ledger(intent.tier)
        ttl = self.config.reservation_ttl_s if ttl_s is None else ttl_s
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
            raise InvalidCacheValue("ttl_s", f"{ttl!r} is not a positive number of seconds")
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
        if intent.size > ledger.quota:
            self.counters.add("saves_dropped")
            raise CacheFull(
                f"{intent.size} bytes exceed the {intent.tier} quota of {ledger.quota}",
                details={"tier": intent.tier, "size": intent.size},
            )
        need = intent.size - ledger.headroom()
        if need > 0:
            victims, freed = ledger.plan(need)
            if freed < need:
                self.counters.add("saves_dropped")
                raise CacheFull(
                    f"{intent.tier} cannot free {need} bytes: the rest is pinned or reserved",
                    details={"tier": intent.tier, "size": intent.size, "need": need},
                )
            self._evict(victims)
        token = self._new_id()
        self.reservations[intent.key] = Reservation(
            token=token,
            intent=intent,
            owner=owner,
            stage=Stage.RESERVED,
            deadline=self._clock() + ttl,
        )
        ledger.reserved += intent.size
        return token

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
            tier=row.tier,
            size=row.size,
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
        ledger = self.ledgers[intent.tier]
        ledger.reserved -= intent.size
        row = Row(
            key=intent.key,
            namespace=intent.namespace,
            tier=intent.tier,
            size=size,
            n_tokens=intent.n_tokens,
            location=location,
            reason=intent.reason,
            created_ns=created_ns,
            last_used_ns=last_used_ns,
            hits=hits,
        )
        self._insert(row, intent.tokens)
        self.waiters.release(intent.key, True)
        # A file larger than promised may push the tier over quota.
        self._enforce_quota(ledger)
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
        self.ledgers[res.intent.tier].reserved -= res.intent.size
        self.waiters.release(res.intent.key, False)

    def _reap(self, res: Reservation, *, why: str) -> None:
        """Clean up after a writer that expired or died (two-stage, C5)."""
        if res.stage is Stage.RESERVED:
            self._drop_reservation(res)
            log.info("cache.reservation_dropped", key=res.intent.key.hex(), why=why)
            return
        try:
            adopted = self.store.adopt(res.intent.tier, res.intent.key, res.location)
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
        log.info("cache.orphan_adopted", key=res.intent.key.hex(), why=why, tier=res.intent.tier)

    # ------------------------------------------------------------- pins (C4)

    def forget(self, key: bytes) -> bool:
        """Drop a row a loader found corrupt or missing (its file is already gone).

        Pins on it stay valid to check in; the bytes are not served again.
        """
        row = self.rows.get(key)
        if row is None:
            return False
        self._drop(row, delete=True)
        log.warning("cache.row_forgotten", key=key.hex(), tier=row.tier)
        return True

    def checkout(self, key: bytes, owner: Owner) -> RowRef | None:
        """Pin a published row for ``owner`` without counting a lookup."""
        row = self.rows.get(key)
        if row is None:
            return None
        self._touch(row)
        return row.ref(self._pin(row, owner))

    def checkin(self, pin: int) -> bool:
        """Release a pin; returns whether it was held."""
        return self.pins.release(pin)

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
            self.pins.release(pin)
        for res in [r for r in self.reservations.values() if r.owner == owner]:
            self._reap(res, why="owner_down")
        self.waiters.drop_owner(owner)
        if pins:
            log.info("cache.pins_released", owner=owner, pins=len(pins))

    # ----------------------------------------------------------- lookups (C8)

    def lookup_exact(self, key: bytes, owner: Owner | None = None) -> RowRef | None:
        """The row of exactly ``key``, pinned for ``owner`` when one is given."""
        row = self.rows.get(key)
        if row is None:
            self.counters.add("misses")
            return None
        self.counters.add("hits_exact")
        return self._hit(row, owner)

    def lookup_exact_or_wait(
        self, key: bytes, owner: Owner, wait_s: float, handle: object
    ) -> RowRef | Deferred | None:
        """Like :meth:`lookup_exact`, but wait up to ``wait_s`` for an in-flight save.

        Returns :data:`WAIT` when a waiter was parked; ``handle`` comes back
        from :meth:`take_ready` with the row (pinned) or ``None``.
        """
        row = self.rows.get(key)
        if row is not None:
            self.counters.add("hits_exact")
            return self._hit(row, owner)
        if key not in self.reservations or wait_s <= 0:
            self.counters.add("misses")
            return None

        def finish(published: bool) -> RowRef | None:
            found = self.rows.get(key) if published else None
            if found is None:
                self.counters.add("misses")
                return None
            self.counters.add("hits_resume")
            return self._hit(found, owner)

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
    ) -> Lookup:
        """Longest saved prefix of the prompt, or the best row to restore and truncate.

        One call answers everything the worker needs: the chosen row (pinned
        for ``owner``), how many prompt tokens it covers, and the longest
        common prefix with any row of the namespace. The chosen row's own
        namespace and tokens are compared with the prompt before it is
        returned (see :meth:`_verified`), so an index fault can only ever
        produce a miss, never a wrong state.
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
        return self._longest_prefix(namespace, tokens, owner, parent_key=parent_key, resumed=False)

    def _longest_prefix(
        self,
        namespace: bytes,
        tokens: bytes,
        owner: Owner | None,
        *,
        parent_key: bytes | None,
        resumed: bool,
    ) -> Lookup:
        started = time.perf_counter_ns()
        match = self.prefix.match(namespace, tokens)
        plan = choose_restore(match, len(tokens) // TOKEN_BYTES, self.config.lookup)
        row = None if plan is None else self.rows.get(plan.key)
        if plan is None or row is None or not self._verified(row, plan, namespace, tokens):
            self.counters.add_many(
                ("longest_prefix_probes", match.probes),
                ("misses", 1),
                ("longest_prefix_ns", time.perf_counter_ns() - started),
            )
            return Lookup(
                None, None, 0, match.common_tokens, match.common_key, resumed, match.probes
            )
        if resumed and row.key == parent_key:
            hit = "hits_resume"
        elif row.key == parent_key or plan.kind is HitKind.EXACT:
            hit = "hits_exact"
        else:
            hit = "hits_longest_prefix"
        ref = self._hit(row, owner)
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
        )

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
    ) -> Lookup | Deferred:
        """The model worker's whole cache resolution in one round trip.

        With a ``parent_key`` whose save is still in flight, wait up to
        ``wait_s`` for it to publish (a deferred answer, :data:`WAIT`); then,
        or straight away, run :meth:`longest_prefix` on the prompt. The parent
        key is a hint, never trusted: the row is used only if its tokens are a
        prefix of the prompt.
        """
        namespace = check_bytes("namespace", namespace, HEADER_LEN)
        tokens = check_tokens(tokens)
        if parent_key is not None:
            parent_key = check_bytes("parent_key", parent_key, KEY_LEN)
            if parent_key not in self.rows and parent_key in self.reservations and wait_s > 0:

                def finish(published: bool) -> Lookup:
                    return self._longest_prefix(
                        namespace, tokens, owner, parent_key=parent_key, resumed=published
                    )

                self._park(parent_key, owner, wait_s, handle, finish)
                return WAIT
        return self._longest_prefix(namespace, tokens, owner, parent_key=parent_key, resumed=False)

    # ---------------------------------------------------- eviction, gc (C9)

    def _enforce_quota(self, ledger: TierLedger[Row]) -> tuple[int, int]:
        need = -ledger.headroom()
        if need <= 0:
            return 0, 0
        victims, _ = ledger.plan(need)
        return len(victims), self._evict(victims)

    def evict_bytes(self, n: int, tiers: Iterable[TierKind] | None = None) -> tuple[int, int]:
        """Free at least ``n`` bytes, globally least recently used first.

        Only unpinned rows of ``tiers`` (default: all) are candidates; returns
        ``(rows evicted, bytes freed)``, which may fall short of ``n`` when the
        rest is pinned.
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidCacheValue("n", f"{n!r} is not a byte count >= 0")
        names = list(self.ledgers) if tiers is None else [check_tier(t) for t in tiers]
        ledgers = [self.ledgers[t] for t in names if t in self.ledgers]
        victims, _ = plan_across_tiers(ledgers, n)
        return len(victims), self._evict(victims)

    def used_bytes(self, tiers: Iterable[TierKind] | None = None) -> int:
        names = list(self.ledgers) if tiers is None else list(tiers)
        return sum(self.ledgers[t].used for t in names if t in self.ledgers)

    def gc(self) -> GcReport:
        """A full maintenance pass: reap expired reservations, drop rows whose bytes
        vanished, bring every tier under its quota, persist hit counts."""
        reaped = self.reap_expired()
        missing = 0
        for row in list(self.rows.values()):
            if row.pins == 0 and not self.store.exists(row.tier, row.location):
                self._drop(row, delete=False)
                missing += 1
        evicted = freed = 0
        for ledger in self.ledgers.values():
            n, b = self._enforce_quota(ledger)
            evicted += n
            freed += b
        self.flush_stats()
        return GcReport(evicted=evicted, bytes_freed=freed, missing=missing, reaped=reaped)

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

        A key already indexed in a faster tier wins; the slower copy is
        deleted and counted as ``duplicate_dropped``. Call
        :meth:`finish_rebuild` after the last file.
        """
        tier = check_tier(tier)
        self._ledger(tier)
        existing = self.rows.get(meta.key)
        if existing is not None:
            self.counters.add("duplicate_dropped")
            if not tier.faster_than(existing.tier):
                self._delete_file(tier, meta.key, location)
                return False
            self._drop(existing, delete=True)
        row = Row(
            key=meta.key,
            namespace=meta.namespace.header(),
            tier=tier,
            size=meta.file_size,
            n_tokens=meta.n_tokens,
            location=location,
            reason=meta.reason,
            created_ns=meta.created_ns,
            last_used_ns=meta.last_used_ns,
            hits=meta.hit_count,
        )
        self._insert(row, meta.tokens)
        return True

    def finish_rebuild(self) -> tuple[int, int]:
        """Order each tier's LRU after a scan, then enforce quotas.

        Rows are ranked by popularity first (hit count in log2 buckets, as
        persisted in the file headers) and recency second, so rows that were
        hit often survive the first eviction walk after a restart even if
        their last use is older. Returns what quota enforcement evicted.
        """
        evicted = freed = 0
        for ledger in self.ledgers.values():
            ordered = sorted(ledger.rows(), key=lambda r: (r.hits.bit_length(), r.last_used_ns))
            for row in ordered:
                ledger.remove(row)
            for row in ordered:
                self._stamp(row)
                ledger.add(row)
            n, b = self._enforce_quota(ledger)
            evicted += n
            freed += b
            self._sync_bytes(ledger.name)
        return evicted, freed

    def flush_stats(self, limit: int | None = None) -> int:
        """Persist dirty hit counts of unpinned rows into their headers; returns how many."""
        done = 0
        for row in self.rows.values():
            if limit is not None and done >= limit:
                break
            if not row.stats_dirty or row.pins:
                continue
            try:
                self.store.persist_stats(
                    row.tier, row.location, min(row.hits, 2**32 - 1), row.last_used_ns
                )
            except Exception as exc:  # a vanished or damaged file must not stop the flush
                log.warning("cache.stats_persist_failed", key=row.key.hex(), error=str(exc))
            row.stats_dirty = False
            done += 1
        return done

    # ------------------------------------------------------------- inspection

    def dump(self) -> list[dict[str, Any]]:
        """Every row and reservation as plain dicts (for ``dump`` and debugging)."""
        out = [row.describe() for row in self.rows.values()]
        out.extend(res.describe() for res in self.reservations.values())
        return out

    def status(self) -> dict[str, Any]:
        return {
            "rows": len(self.rows),
            "reservations": len(self.reservations),
            "pins": len(self.pins),
            "waiters": self.waiting(),
            "tiers": {
                name: {
                    "quota": ledger.quota,
                    "used": ledger.used,
                    "reserved": ledger.reserved,
                    "rows": len(ledger),
                }
                for name, ledger in self.ledgers.items()
            },
        }
