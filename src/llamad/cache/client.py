"""CacheClient: how writers, model workers and tools talk to cache-meta.

Every method is one round trip to the cache-meta actor (found by name in the
actor registry, followed across restarts). Errors arrive as the typed
exceptions cache-meta raised (:class:`~llamad.cache.errors.AlreadyCached`,
:class:`~llamad.cache.errors.PublishAbandoned`, ...); a cache-meta crash
during a call raises :class:`~llamad.errors.WorkerCrashed` within ~0.1 s, and the
next call reconnects to the restarted process.

A model worker resolves a prompt like this::

    found = cache.resolve(namespace, prompt_tokens, parent_key=parent, wait_s=0.5)
    if found.row is not None:
        try:
            n = cache.load_into(found.row, buffer)      # straight from shm or a file
            if n is not None:
                ...  # llama_state_seq_set_data(buffer[:n]); keep found.use_tokens
        finally:
            cache.checkin(found.row.pin)

and a writer publishes with :meth:`reserve_save` → write the tmp file →
:meth:`check_reservation` → ``link(2)`` → :meth:`mark_published` → fsync
the directory → :meth:`announce_saved` (see :mod:`llamad.cache.publish`).

A client is not thread-safe: use one per thread.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

import msgspec

from llamad.actors.client import Client
from llamad.actors.registry import Registry
from llamad.cache import meta_wire as wire
from llamad.cache.key import HEADER_LEN, Namespace, TokenSeq, tokens_to_bytes
from llamad.cache.kvc import KvcMeta
from llamad.cache.lookup import Lookup, RowRef
from llamad.cache.meta_wire import GcResult
from llamad.cache.reservation import Grant, SaveIntent, check_bytes
from llamad.cache.tier_kind import TierKind, check_tier
from llamad.cache.tiers import LoadedRow, Tier, TierConfig, load_mapped_row, load_row
from llamad.errors import BadRequest

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from llamad.cache.counters import Counters
    from llamad.cache.settings import CacheSettings

__all__ = ["CacheClient"]


def _header(namespace: Namespace | bytes) -> bytes:
    if isinstance(namespace, Namespace):
        return namespace.header()
    return check_bytes("namespace", namespace, HEADER_LEN)


def _tier_list(tiers: Collection[TierKind] | None) -> list[TierKind] | None:
    # Sorted fastest first: the same set is always the same message.
    if tiers is None:
        return None
    return [t for t in TierKind if t in tiers]


# Replies decode straight into these msgspec types (validated in C).
_ROW_OR_NONE: Any = RowRef | None
_NO_ARGS: Final = wire.NoArgs()


class CacheClient:
    """A connection to cache-meta (see the module doc for the call patterns).

    ``registry`` / ``registry_root`` locate the actor registry (default: the
    daemon's runtime directory); ``endpoint`` bypasses it. ``tiers`` (or
    ``settings``) let :meth:`load_into` read rows; ``counters`` receives the
    loader's ``load_total_ns`` and ``corrupt_files``.
    """

    def __init__(
        self,
        *,
        name: str = wire.ACTOR_NAME,
        registry: Registry | None = None,
        registry_root: Path | str | None = None,
        endpoint: str | None = None,
        timeout: float | None = 30.0,
        connect_timeout: float = 5.0,
        tiers: Iterable[TierConfig] = (),
        counters: Counters | None = None,
        client_name: str = "cache-client",
    ) -> None:
        if endpoint is not None:
            self._client = Client(
                endpoint,
                timeout=timeout,
                connect_timeout=connect_timeout,
                client_name=client_name,
            )
        else:
            reg = registry if registry is not None else Registry(registry_root)
            self._client = Client(
                name=name,
                registry=reg,
                timeout=timeout,
                connect_timeout=connect_timeout,
                client_name=client_name,
            )
        self.tiers: dict[TierKind, Tier] = {cfg.kind: Tier(cfg) for cfg in tiers}
        self.load_counters = counters

    @classmethod
    def from_settings(cls, settings: CacheSettings, **kwargs: Any) -> CacheClient:
        """A client for the cache described by ``settings`` (registry, tiers)."""
        return cls(
            name=settings.actor_name,
            registry_root=settings.registry_root,
            tiers=settings.tiers,
            **kwargs,
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> CacheClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, op: str, body: msgspec.Struct, tokens: bytes | None = None, **kw: Any) -> Any:
        # Bodies are the request structs cache-meta validates against
        # (meta_wire), so both ends share one declaration of every field.
        blobs = () if tokens is None else (tokens,)
        return self._client.call(op, body, blobs=blobs, **kw)

    # -- the publish protocol (writers) -----------------------------------------

    def reserve_save(self, intent: SaveIntent, *, ttl_s: float | None = None) -> int:
        """Stage 1: claim ``intent.key``; returns the reservation token."""
        return self.reserve(intent, ttl_s=ttl_s).token

    def reserve(
        self,
        intent: SaveIntent,
        *,
        ttl_s: float | None = None,
        tiers: Collection[TierKind] | None = None,
    ) -> Grant:
        """Stage 1: claim ``intent.key``; returns the token and the tier to write to
        (``intent.tier``, or cache-meta's choice among ``tiers`` when it is None)."""
        body = wire.ReserveSave(
            key=intent.key,
            namespace=intent.namespace,
            tier=intent.tier,
            size=intent.size,
            reason=int(intent.reason),
            ttl_s=ttl_s,
            tiers=_tier_list(tiers),
        )
        reply: wire.Reserved = self._call(
            "reserve_save", body, intent.tokens, reply_type=wire.Reserved
        )
        tier = reply.tier if reply.tier is not None else intent.tier
        if tier is None:
            raise BadRequest("cache-meta chose no tier for the save")
        return Grant(reply.token, tier)

    def check_reservation(self, key: bytes, token: int) -> None:
        """Stage 3: raises :class:`~llamad.cache.errors.PublishAbandoned` if stale."""
        self._call("check_reservation", wire.TokenRef(key, token))

    def mark_published(self, key: bytes, token: int, location: str) -> None:
        """Stage 4 done: the final file is linked at ``location``."""
        self._call("mark_published", wire.MarkPublished(key, token, location))

    def announce_saved(
        self, key: bytes, token: int, *, location: str | None = None, size: int | None = None
    ) -> RowRef:
        """Stage 5: make the row visible (and wake whoever waits for it)."""
        body = wire.AnnounceSaved(key, token, location=location, size=size)
        ref: RowRef = self._call("announce_saved", body, reply_type=RowRef)
        return ref

    def cancel_reservation(self, key: bytes, token: int) -> bool:
        """Give up a save; returns whether the reservation was still live."""
        return bool(self._call("cancel_reservation", wire.TokenRef(key, token), reply_type=bool))

    # -- lookups (model workers) ----------------------------------------------

    def lookup_exact(
        self, key: bytes, *, pin: bool = True, tiers: Collection[TierKind] | None = None
    ) -> RowRef | None:
        """The row of exactly ``key`` (pinned for this process unless ``pin=False``).

        ``tiers``: the tiers the caller reads (default any); the answer is the
        row's fastest copy among them, and a row with none there is a miss.
        The same holds for every lookup below."""
        body = wire.LookupExact(key, pin=pin, tiers=_tier_list(tiers))
        ref: RowRef | None = self._call("lookup_exact", body, reply_type=_ROW_OR_NONE)
        return ref

    def lookup_exact_or_wait(
        self, key: bytes, wait_s: float, *, tiers: Collection[TierKind] | None = None
    ) -> RowRef | None:
        """Like :meth:`lookup_exact`, waiting up to ``wait_s`` for an in-flight save."""
        ref: RowRef | None = self._call(
            "lookup_exact_or_wait",
            wire.LookupWait(key, wait_s, tiers=_tier_list(tiers)),
            timeout=wait_s + 30.0,
            reply_type=_ROW_OR_NONE,
        )
        return ref

    def longest_prefix(
        self,
        namespace: Namespace | bytes,
        tokens: TokenSeq,
        *,
        parent_key: bytes | None = None,
        pin: bool = True,
        tiers: Collection[TierKind] | None = None,
    ) -> Lookup:
        """Longest saved prefix of ``tokens`` (or a row to restore and truncate)."""
        body = wire.LongestPrefix(
            _header(namespace), parent_key=parent_key, pin=pin, tiers=_tier_list(tiers)
        )
        found: Lookup = self._client.call(
            "longest_prefix", body, blobs=(tokens_to_bytes(tokens),), reply_type=Lookup
        )
        return found

    def resolve(
        self,
        namespace: Namespace | bytes,
        tokens: TokenSeq,
        *,
        parent_key: bytes | None = None,
        wait_s: float = 0.0,
        timeout: float | None = None,
        tiers: Collection[TierKind] | None = None,
        heard_within: float | None = None,
    ) -> Lookup:
        """A model worker's whole cache resolution in one round trip (pinned).

        ``timeout`` bounds the whole call, the wait included (default
        ``wait_s + 30``); past it :class:`~llamad.errors.RequestTimeout`.
        ``tiers``: the tiers this worker restores from (the answer is a copy
        in one of them; default any). ``heard_within``: with a ``wait_s``,
        cache-meta must answer the lookup, or a ``$ping`` that follows a
        lookup not answered at once, within this many seconds (a stopped
        cache-meta then costs this, not the wait; see
        :meth:`llamad.actors.Client.call`).
        """
        body = wire.Resolve(
            _header(namespace), parent_key=parent_key, wait_s=wait_s, tiers=_tier_list(tiers)
        )
        limit = wait_s + 30.0 if timeout is None else timeout
        found: Lookup = self._call(
            "resolve",
            body,
            tokens_to_bytes(tokens),
            timeout=limit,
            reply_type=Lookup,
            heard_within=heard_within if wait_s > 0 else None,
        )
        return found

    def ping(self, timeout: float | None = None) -> None:
        """Return once cache-meta's loop answers (the actor's ``$ping``), within
        ``timeout`` (default: the client's) or :class:`~llamad.errors.RequestTimeout`."""
        if timeout is None:
            self._client.call("$ping")
        else:
            self._client.call("$ping", timeout=timeout)

    def checkout(self, key: bytes) -> RowRef | None:
        """Pin a row without counting a lookup."""
        ref: RowRef | None = self._call("checkout", wire.KeyBody(key), reply_type=_ROW_OR_NONE)
        return ref

    def checkin(self, pin: int | None) -> bool:
        """Release a pin (``None`` is accepted and ignored, for unpinned rows)."""
        if pin is None:
            return False
        return bool(self._call("checkin", wire.Checkin(pin), reply_type=bool))

    def release(self, pin: int | None) -> None:
        """:meth:`checkin` as a cast: nothing comes back, and nothing waits for
        cache-meta (a worker releases a row's pin between a restore and its
        first token). Pin ids start at random, so a release that reaches a
        restarted cache-meta cannot free another process's pin."""
        if pin is not None:
            self._client.cast("release", wire.Checkin(pin))

    def forget(self, key: bytes, *, tier: TierKind | None = None) -> bool:
        """Tell cache-meta a row's copy in ``tier`` is gone or corrupt so it stops
        serving it (its copies elsewhere stay); without ``tier``, the whole row."""
        return bool(self._call("forget", wire.Forget(key, tier), reply_type=bool))

    @contextmanager
    def pinned(self, ref: RowRef | None) -> Iterator[RowRef | None]:
        """Check ``ref``'s pin back in when the block ends, however it ends."""
        try:
            yield ref
        finally:
            if ref is not None and ref.pin is not None:
                self.checkin(ref.pin)

    def load_into(self, ref: RowRef, buffer: Buffer) -> int | None:
        """Validate ``ref``'s file and read its payload into ``buffer``.

        Returns the payload length, or ``None`` on a miss (missing or corrupt:
        the row is then forgotten by cache-meta and never restored).
        """
        meta = self.load_row_into(ref, buffer)
        return None if meta is None else meta.payload_len

    def load_row_into(self, ref: RowRef, buffer: Buffer) -> KvcMeta | None:
        """:meth:`load_into`, answering the row's validated meta: its
        ``payload_len`` and the logits it keeps (``meta.logits``), if any."""
        meta = load_row(self._tier(ref), ref.location, buffer, self.load_counters)
        if meta is None:
            self.forget(ref.key, tier=ref.tier)
        return meta

    @contextmanager
    def load_mapped(self, ref: RowRef) -> Iterator[memoryview | None]:
        """A ``ram`` row's validated payload in place, for a restore with no copy.

        Yields the view (valid only inside the block; hand it straight to
        ``llama_state_seq_set_data``) or ``None`` on a miss, which, like
        :meth:`load_into`, deleted and counted a damaged row and made
        cache-meta forget it. The row must be pinned for the whole block.
        """
        with self.load_mapped_row(ref) as row:
            yield None if row is None else row.payload

    @contextmanager
    def load_mapped_row(self, ref: RowRef) -> Iterator[LoadedRow | None]:
        """:meth:`load_mapped` with the row's validated meta beside the payload
        (``row.meta.logits``: the logits the row keeps, if any)."""
        with load_mapped_row(self._tier(ref), ref.location, self.load_counters) as row:
            if row is None:
                self.forget(ref.key, tier=ref.tier)
            yield row

    def _tier(self, ref: RowRef) -> Tier:
        tier = self.tiers.get(ref.tier)
        if tier is None:
            raise BadRequest(f"this client has no {ref.tier!r} tier configured")
        return tier

    # -- administration -------------------------------------------------------

    def report_live(self, entries: list[wire.LiveEntry]) -> None:
        """Tell cache-meta which idle entries this process keeps live (a cast:
        nothing comes back, and nothing waits for cache-meta)."""
        self._client.cast("live_entries", wire.LiveEntries(entries))

    def evict_bytes(self, n: int, tiers: Iterable[TierKind] | None = None) -> tuple[int, int]:
        """Free at least ``n`` bytes (LRU, unpinned only); returns (rows, bytes)."""
        names = None if tiers is None else [check_tier(t, "tiers") for t in tiers]
        reply: wire.Evicted = self._call(
            "evict_bytes", wire.EvictBytes(n, names), reply_type=wire.Evicted
        )
        return reply.rows, reply.bytes

    def gc(self) -> GcResult:
        """Reap, drop vanished rows, enforce quotas, persist hit counts."""
        report: GcResult = self._call("gc", _NO_ARGS, reply_type=GcResult)
        return report

    def dump(self) -> list[dict[str, Any]]:
        """Every row and in-flight reservation."""
        return list(self._call("dump", _NO_ARGS, reply_type=list[dict[str, Any]]))

    def counters(self) -> dict[str, int]:
        """All SPEC C10 counters and gauges, summed over processes."""
        return dict(self._call("counters", _NO_ARGS, reply_type=dict[str, int]))

    def reset_counters(self) -> None:
        self._call("reset_counters", _NO_ARGS)

    def status(self) -> dict[str, Any]:
        """Rows, reservations, pins, waiters, per-tier bytes and the pressure scheduler."""
        return dict(self._call("status", _NO_ARGS, reply_type=dict[str, Any]))

    def pressure_check(self) -> dict[str, Any]:
        """Run the pressure scheduler's check now (evicts only when enabled)."""
        return dict(self._call("pressure_check", _NO_ARGS, reply_type=dict[str, Any]))
