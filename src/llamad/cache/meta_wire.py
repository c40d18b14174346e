"""cache-meta's wire contract: op names and request schemas, declared once.

The actor runtime validates every request body against these msgspec types
before a handler runs, so the server only ever sees well-formed input (wrong
types, out-of-range numbers, unknown fields and bad key lengths are answered
with ``bad_request``). Token ids never ride inside msgpack: ops that carry a
prompt or a row's tokens take them as one binary frame of u32 little-endian
ids (:data:`TOKENS_BLOB`), which also lifts the msgpack header's size cap.

Lookups name the tiers the caller restores from (``tiers``; absent: any), and
a save may leave its tier to cache-meta (``ReserveSave.tier`` null; the
``tiers`` it may use), whose :class:`Reserved` reply names the tier chosen;
``forget`` names the copy (its tier) a loader found missing or damaged.

Rows and lookups are answered as :class:`~llamad.cache.lookup.RowRef` and
:class:`~llamad.cache.lookup.Lookup` msgspec structs, which travel as msgpack
arrays in field order; ``reserve_save``, ``evict_bytes`` and ``gc`` answer
:class:`Reserved`, :class:`Evicted` and :class:`GcResult`.
:class:`llamad.cache.client.CacheClient` builds its requests from the body
structs below and decodes replies straight back into these types. The
inspection ops (``dump``, ``counters``, ``status``, ``pressure_check``)
answer plain maps and lists.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from llamad.actors.ops import NoArgs, OpKind, OpSpec
from llamad.cache.tier_kind import TierKind

__all__ = [
    "ACTOR_NAME",
    "LIVENESS_S",
    "OPS",
    "TOKENS_BLOB",
    "Evicted",
    "GcResult",
    "NoArgs",
    "Reserved",
]

ACTOR_NAME: Final = "cache-meta"
"""The registry name cache-meta serves under."""

LIVENESS_S: Final = 10.0
"""cache-meta's heartbeat window by default (``[cache] liveness_s``): it beats
from its loop at least every quarter of it, and nothing it runs after it is
ready holds that loop for seconds (the scan at start comes before ready, the
slow file work is the mover's and the prefetcher's threads). Shorter than the
front's 15 s: while it is silent every lookup runs cold."""

TOKENS_BLOB: Final = 1
"""Ops with tokens take exactly one binary frame: the u32 little-endian ids."""

Key = Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]
Header = Annotated[bytes, msgspec.Meta(min_length=65, max_length=65)]
Location = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
Token = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
Bytes = Annotated[int, msgspec.Meta(ge=0, le=2**62)]
Wait = Annotated[float, msgspec.Meta(ge=0, le=3600)]


class _Body(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    pass


# The tiers a caller may read from (lookups) or write to (a save whose tier
# cache-meta chooses); absent: any.
Tiers = Annotated[list[TierKind], msgspec.Meta(min_length=1, max_length=len(TierKind))]


class ReserveSave(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key
    namespace: Header
    # None: cache-meta chooses (the fastest of ``tiers`` with room).
    tier: TierKind | None
    size: Annotated[int, msgspec.Meta(gt=0, le=2**62)]
    reason: Annotated[int, msgspec.Meta(ge=1, le=5)]
    ttl_s: Annotated[float, msgspec.Meta(gt=0, le=86_400)] | None = None
    tiers: Tiers | None = None


class TokenRef(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key
    token: Token


class MarkPublished(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key
    token: Token
    location: Location


class AnnounceSaved(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key
    token: Token
    location: Location | None = None
    size: Annotated[int, msgspec.Meta(gt=0, le=2**62)] | None = None


class KeyBody(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key


class Forget(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key
    # The copy the loader found missing or damaged (None: every copy).
    tier: TierKind | None = None


class LookupExact(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key
    pin: bool = True
    tiers: Tiers | None = None


class LookupWait(_Body, frozen=True, forbid_unknown_fields=True):
    key: Key
    wait_s: Wait
    tiers: Tiers | None = None


class LongestPrefix(_Body, frozen=True, forbid_unknown_fields=True):
    namespace: Header
    parent_key: Key | None = None
    pin: bool = True
    tiers: Tiers | None = None


class Resolve(_Body, frozen=True, forbid_unknown_fields=True):
    namespace: Header
    parent_key: Key | None = None
    wait_s: Wait = 0.0
    tiers: Tiers | None = None


class Checkin(_Body, frozen=True, forbid_unknown_fields=True):
    pin: Token


class EvictBytes(_Body, frozen=True, forbid_unknown_fields=True):
    n: Bytes
    tiers: list[TierKind] | None = None


class LiveEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True, array_like=True):
    """One idle entry a worker keeps live: its sequence, namespace header, tokens (u32 LE)."""

    seq: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)]
    namespace: Annotated[bytes, msgspec.Meta(min_length=1, max_length=256)]
    tokens: bytes


class LiveEntries(_Body, frozen=True, forbid_unknown_fields=True):
    """Every idle entry of the sending worker (replacing what it sent before)."""

    entries: list[LiveEntry]


# -- replies -------------------------------------------------------------------


class Reserved(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``reserve_save``'s answer: the reservation token for the later stages, and
    the tier the row goes to (the one asked for, or cache-meta's choice)."""

    token: Token
    tier: TierKind | None = None


class GcResult(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What :meth:`~llamad.cache.meta.CacheMeta.gc` did; also the ``gc`` op's
    reply, as is. ``missing`` counts copies whose files had vanished."""

    evicted: int
    bytes_freed: int
    missing: int
    reaped: int


class Evicted(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``evict_bytes``'s answer: rows evicted and bytes they freed."""

    rows: Annotated[int, msgspec.Meta(ge=0)]
    bytes: Bytes


def _call(name: str, body: Any, doc: str, *, tokens: bool = False) -> OpSpec:
    blobs = TOKENS_BLOB if tokens else 0
    return OpSpec(name, OpKind.CALL, body=body, min_blobs=blobs, max_blobs=blobs, doc=doc)


OPS: Final = {
    spec.name: spec
    for spec in (
        _call("reserve_save", ReserveSave, "stage 1: claim a key; -> {token, tier}", tokens=True),
        _call("check_reservation", TokenRef, "stage 3: is the token still live?"),
        _call("mark_published", MarkPublished, "stage 4 done: final file linked"),
        _call("announce_saved", AnnounceSaved, "stage 5: row visible; -> row"),
        _call("cancel_reservation", TokenRef, "writer gave up; -> bool"),
        _call("checkout", KeyBody, "pin a row; -> row | nil"),
        _call("checkin", Checkin, "release a pin; -> bool"),
        _call("forget", Forget, "drop a copy (or row) a loader found corrupt; -> bool"),
        _call("lookup_exact", LookupExact, "-> row | nil (pinned unless pin=false)"),
        _call("lookup_exact_or_wait", LookupWait, "-> row | nil, waiting for an in-flight save"),
        _call("longest_prefix", LongestPrefix, "-> lookup", tokens=True),
        _call("resolve", Resolve, "-> lookup, waiting for parent_key's save", tokens=True),
        _call("evict_bytes", EvictBytes, "-> {rows, bytes}"),
        _call("gc", NoArgs, "-> {evicted, bytes_freed, missing, reaped}"),
        _call("dump", NoArgs, "-> [row | reservation]"),
        _call("counters", NoArgs, "-> {name: value}"),
        _call("reset_counters", NoArgs, "-> nil"),
        _call("status", NoArgs, "-> {rows, reservations, pins, waiters, moves, tiers, ...}"),
        _call("pressure_check", NoArgs, "force a pressure check; -> report"),
        OpSpec(
            "release",
            OpKind.CAST,
            body=Checkin,
            doc="release a pin, no reply (a worker's checkin, off its request's path)",
        ),
        OpSpec(
            "live_entries",
            OpKind.CAST,
            body=LiveEntries,
            doc="a worker's idle entries, for the KV events (no reply)",
        ),
    )
}
