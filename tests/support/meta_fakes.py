"""Fakes for stepping CacheMeta in unit tests: a clock, a file store, intents."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field

from llamad.cache.counters import DictCounters
from llamad.cache.key import FingerprintMode, Namespace
from llamad.cache.kvc import KvcMeta, SaveReason
from llamad.cache.meta import CacheMeta, MetaConfig
from llamad.cache.mover import move_file
from llamad.cache.moves import MoveJob, MoveResult
from llamad.cache.reservation import Adopted, SaveIntent
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier

NS = Namespace(fingerprint=b"f" * 32, quant=3, ctx_hash=b"c" * 32)
OTHER_NS = Namespace(fingerprint=b"g" * 32, quant=3, ctx_hash=b"c" * 32)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class FakeStore:
    """Files by (tier, location); ``linked`` holds what a writer linked before dying."""

    files: dict[tuple[str, str], bytes] = field(default_factory=dict)
    linked: dict[bytes, KvcMeta] = field(default_factory=dict)
    deleted: list[bytes] = field(default_factory=list)
    unlinked_orphans: list[bytes] = field(default_factory=list)
    stats: dict[str, tuple[int, int]] = field(default_factory=dict)

    def delete(self, tier: str, key: bytes, location: str) -> None:
        self.deleted.append(key)
        self.files.pop((tier, location), None)

    def adopt(self, tier: str, key: bytes, location: str | None) -> Adopted | None:
        meta = self.linked.pop(key, None)
        if meta is None:
            self.unlinked_orphans.append(key)
            return None
        where = location or f"/{tier}/{key.hex()}.kvc"
        self.files[(tier, where)] = key
        return Adopted(meta=meta, location=where)

    def persist_stats(self, tier: str, location: str, hits: int, last_used_ns: int) -> None:
        self.stats[location] = (hits, last_used_ns)

    def exists(self, tier: str, location: str) -> bool:
        return (tier, location) in self.files


def le(tokens: list[int] | range) -> bytes:
    tokens = list(tokens)
    return struct.pack(f"<{len(tokens)}I", *tokens)


def intent(
    tokens: list[int] | range,
    *,
    tier: TierKind = TierKind.DISK,
    size: int = 1000,
    ns: Namespace = NS,
    reason: SaveReason = SaveReason.COLD,
) -> SaveIntent:
    data = le(tokens)
    return SaveIntent(
        key=ns.key(data), namespace=ns.header(), tokens=data, tier=tier, size=size, reason=reason
    )


def kvc_meta(it: SaveIntent, *, hits: int = 0, last_used_ns: int = 0) -> KvcMeta:
    ns = Namespace(
        fingerprint=it.namespace[:32], quant=it.namespace[32], ctx_hash=it.namespace[33:]
    )
    return KvcMeta(
        key=it.key,
        namespace=ns,
        mode=FingerprintMode.SAFE,
        reason=it.reason,
        reason_detail="",
        tokens=it.tokens,
        n_tokens=it.n_tokens,
        hit_count=hits,
        context_size=4096,
        created_ns=1,
        last_used_ns=last_used_ns,
        payload_offset=4096,
        payload_len=it.size - 4096 if it.size > 4096 else 0,
        payload_crc32c=0,
        file_size=it.size,
        hostname="h",
        llamad_version="0",
        prefix=b"",  # a fake row is never loaded, so never re-checked against it
    )


def make_meta(
    quotas: dict[str, int] | None = None, *, ttl: float = 60.0, **kwargs: object
) -> tuple[CacheMeta, FakeStore, FakeClock, DictCounters]:
    # Off unless a test asks: each asks for moves a test has to land
    # (test_tier_hierarchy.py is about them).
    kwargs.setdefault("write_behind", False)
    kwargs.setdefault("promote_hits", 0)
    store = FakeStore()
    clock = FakeClock()
    counters = DictCounters()
    config = MetaConfig(
        quotas=quotas or {TierKind.RAM: 10**9, TierKind.RAM_FILE: 10**9, TierKind.DISK: 10**9},
        reservation_ttl_s=ttl,
        **kwargs,  # type: ignore[arg-type]
    )
    meta = CacheMeta(
        config, store, counters=counters, clock=clock, wall_ns=lambda: int(clock.now * 1e9)
    )
    return meta, store, clock, counters


def publish(meta: CacheMeta, store: FakeStore, it: SaveIntent, owner: int = 7) -> bytes:
    """Run the whole protocol for one intent; returns its key."""
    token = meta.reserve_save(it, owner)
    meta.check_reservation(it.key, token)
    location = f"/{it.tier}/{it.key.hex()}.kvc"
    meta.mark_published(it.key, token, location)
    store.files[(it.tier, location)] = it.key
    meta.announce_saved(it.key, token)
    return it.key


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def run_moves(meta: CacheMeta, tiers: Mapping[TierKind, Tier]) -> list[MoveResult]:
    """Carry out every move cache-meta asks for, with real files, until none is left."""
    results = []
    while jobs := meta.take_moves():
        for job in jobs:
            result = move_file(tiers[job.src_tier], tiers[job.dst_tier], job)
            meta.move_done(result)
            results.append(result)
    return results


def land(meta: CacheMeta, store: FakeStore, job: MoveJob, *, linked: bool = False) -> None:
    """The fake mover: ``job``'s destination file exists; tell cache-meta."""
    location = f"/{job.dst_tier}/{job.key.hex()}.kvc"
    store.files[(job.dst_tier, location)] = job.key
    meta.move_done(MoveResult(job.id, location, size=job.size, linked=linked))


def land_all(meta: CacheMeta, store: FakeStore) -> list[MoveJob]:
    """Land every move asked for (and those they ask for in turn); returns them."""
    done = []
    while jobs := meta.take_moves():
        for job in jobs:
            land(meta, store, job)
            done.append(job)
    return done
