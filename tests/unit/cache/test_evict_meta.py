"""Quota-driven LRU eviction, evict_bytes, gc and the rebuild order."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.cache.counters import DictCounters
from llamad.cache.errors import CacheFull
from llamad.cache.key import FingerprintMode, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.meta import CacheMeta, MetaConfig
from llamad.cache.publish import LocalMeta
from llamad.cache.publish import publish as publish_file
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import TierConfig, TierStore, build_tiers
from meta_fakes import NS, intent, kvc_meta, make_meta, publish, run_moves

pytestmark = pytest.mark.timeout(60)


@given(
    sizes=st.lists(st.integers(1, 4000), min_size=1, max_size=60),
    pin_every=st.integers(0, 5),
)
@settings(max_examples=150, deadline=None)
def test_quotas_hold_under_a_stream_of_saves(sizes: list[int], pin_every: int) -> None:
    quota = 10_000
    meta, store, _, _ = make_meta({TierKind.DISK: quota, TierKind.RAM: quota // 2})
    pinned: set[bytes] = set()
    for i, size in enumerate(sizes):
        tier = "ram" if i % 3 == 0 else "disk"
        it = intent([i, i + 1], tier=tier, size=size)
        try:
            publish(meta, store, it, owner=1)
        except CacheFull:
            continue
        if pin_every and i % pin_every == 0:
            meta.checkout(it.key, owner=2)
            pinned.add(it.key)
        for ledger in meta.ledgers.values():
            assert ledger.used + ledger.reserved <= ledger.quota
            assert ledger.used == sum(r.size for r in ledger.rows())
        # Room is only ever made from unpinned rows.
        assert pinned <= set(meta.rows)


def test_quota_eviction_takes_the_least_recently_used_row() -> None:
    meta, store, _, counters = make_meta({TierKind.DISK: 3000})
    a = publish(meta, store, intent([1]))
    b = publish(meta, store, intent([2]))
    c = publish(meta, store, intent([3]))
    meta.lookup_exact(a)  # a is now the most recently used
    d = publish(meta, store, intent([4]))
    assert set(meta.rows) == {a, c, d}
    assert store.deleted == [b]
    assert counters.get("evictions") == 1


def test_evict_bytes_is_globally_lru_across_the_requested_tiers() -> None:
    meta, store, _, _ = make_meta()
    keys = []
    for i, tier in enumerate(["disk", "ram", "ram_file", "ram", "disk"]):
        keys.append(publish(meta, store, intent([i], tier=tier)))
    assert meta.evict_bytes(1500, [TierKind.RAM, TierKind.RAM_FILE]) == (2, 2000)
    assert store.deleted == [keys[1], keys[2]]
    assert meta.evict_bytes(1) == (1, 1000)
    assert store.deleted[-1] == keys[0]


def test_evict_bytes_of_zero_evicts_nothing() -> None:
    meta, store, _, _ = make_meta()
    publish(meta, store, intent([1]))
    assert meta.evict_bytes(0) == (0, 0)


def test_gc_drops_rows_whose_files_vanished_and_reaps_expired_reservations() -> None:
    meta, store, clock, _ = make_meta(ttl=5)
    gone = publish(meta, store, intent([1]))
    kept = publish(meta, store, intent([2]))
    store.files = {k: v for k, v in store.files.items() if v != gone}
    meta.reserve_save(intent([3]), owner=9)
    clock.advance(10)
    report = meta.gc()
    assert (report.missing, report.reaped) == (1, 1)
    assert set(meta.rows) == {kept}
    assert meta.ledgers[TierKind.DISK].used == 1000 and meta.ledgers[TierKind.DISK].reserved == 0


def test_rebuild_keeps_popular_rows_through_the_first_eviction_walk() -> None:
    meta, _store, _, _ = make_meta({TierKind.DISK: 3000})
    popular = intent([1])
    stale = intent([2])
    fresh = intent([3])
    for it, hits, used in ((popular, 40, 100), (stale, 0, 200), (fresh, 0, 300)):
        meta.adopt_file(
            kvc_meta(it, hits=hits, last_used_ns=used), TierKind.DISK, f"/disk/{it.key.hex()}"
        )
    meta.finish_rebuild()
    assert meta.evict_bytes(2000) == (2, 2000)
    assert set(meta.rows) == {popular.key}


def test_rebuild_over_quota_evicts_down_to_it() -> None:
    meta, _, _, counters = make_meta({TierKind.DISK: 2500})
    for i in range(5):
        it = intent([i])
        meta.adopt_file(kvc_meta(it, last_used_ns=i), TierKind.DISK, f"/disk/{i}")
    evicted, freed = meta.finish_rebuild()
    assert (evicted, freed) == (3, 3000)
    assert meta.ledgers[TierKind.DISK].used == 2000
    assert counters.get("bytes_disk") == 2000


def test_a_key_found_in_two_tiers_at_rebuild_is_one_row_with_two_copies() -> None:
    # A row written behind to disk (or demoted by a link) has a file in two
    # tiers: the scan keeps both, and the row is served from the faster one.
    meta, store, _, counters = make_meta()
    it = intent([1])
    assert meta.adopt_file(kvc_meta(it, hits=3, last_used_ns=5), TierKind.DISK, "/disk/a")
    assert meta.adopt_file(kvc_meta(it, hits=1, last_used_ns=9), TierKind.RAM_FILE, "/shm/a")
    row = meta.rows[it.key]
    assert set(row.copies) == {TierKind.DISK, TierKind.RAM_FILE}
    assert row.tier is TierKind.RAM_FILE
    assert (row.hits, row.last_used_ns) == (3, 9)
    assert meta.ledgers[TierKind.DISK].used == meta.ledgers[TierKind.RAM_FILE].used == 1000
    # A second file of the key in one tier is not a copy: it is deleted.
    assert not meta.adopt_file(kvc_meta(it), TierKind.DISK, "/disk/b")
    assert counters.get("duplicate_dropped") == 1
    assert store.deleted == [it.key]
    assert meta.rows[it.key].copies[TierKind.DISK].location == "/disk/a"


def test_eviction_removes_rows_from_the_prefix_index() -> None:
    meta, store, _, _ = make_meta()
    keys = [publish(meta, store, intent(list(range(n)))) for n in (5, 10, 20)]
    random.Random(1).shuffle(keys)
    meta.evict_bytes(3000)
    assert len(meta.prefix) == 0 and meta.rows == {}


def test_eviction_drops_the_row_even_when_its_file_cannot_be_deleted() -> None:
    meta, store, _, counters = make_meta()
    key = publish(meta, store, intent([1]))

    def broken(tier: str, key: bytes, location: str) -> None:
        raise PermissionError("EACCES")

    store.delete = broken  # type: ignore[method-assign]
    assert meta.evict_bytes(1) == (1, 1000)
    assert key not in meta.rows and meta.ledgers[TierKind.DISK].used == 0
    assert counters.get("evictions") == 1


def test_rebuild_survives_a_duplicate_file_that_cannot_be_deleted() -> None:
    meta, store, _, counters = make_meta()
    it = intent([1])
    assert meta.adopt_file(kvc_meta(it), TierKind.RAM_FILE, "/shm/a")

    def broken(tier: str, key: bytes, location: str) -> None:
        raise PermissionError("EACCES")

    store.delete = broken  # type: ignore[method-assign]
    # A second file of the key in one tier is not indexed; it is left to the next scan.
    assert not meta.adopt_file(kvc_meta(it), TierKind.RAM_FILE, "/shm/b")
    assert meta.rows[it.key].copies[TierKind.RAM_FILE].location == "/shm/a"
    # A copy in another tier is still indexed, and served first when faster.
    assert meta.adopt_file(kvc_meta(it), TierKind.RAM, "/ram/a")
    assert meta.rows[it.key].tier is TierKind.RAM
    assert meta.ledgers[TierKind.RAM_FILE].used == 1000
    assert counters.get("duplicate_dropped") == 1


def test_tier_files_stay_within_quota_under_a_stream_of_saves(tmp_path: Path) -> None:
    # The same invariant on real files: evicted rows' bytes really leave the
    # tier once the moves they asked for (demotions, write-behind) have run.
    quota = 300_000
    tiers = build_tiers(
        [
            TierConfig(TierKind.RAM_FILE, tmp_path / "ram_file", quota),
            TierConfig(TierKind.DISK, tmp_path / "disk", quota),
        ]
    )
    for tier in tiers.values():
        tier.prepare()
    counters = DictCounters()
    meta = CacheMeta(
        MetaConfig(quotas={n: quota for n in tiers}), TierStore(tiers), counters=counters
    )
    writer = LocalMeta(meta, owner=1)
    rnd = random.Random(5)
    stored = 0
    for i in range(60):
        tier = tiers["disk" if i % 2 else "ram_file"]
        spec = KvcSpec(NS, tokens_to_bytes([i, *range(50)]), FingerprintMode.SAFE, SaveReason.COLD)
        result = publish_file(writer, tier, spec, bytes(rnd.randrange(10_000, 90_000)))
        stored += result.stored
        for t in tiers.values():
            # Before the mover ran: over the quota by the demoted copies at most.
            ledger = meta.ledgers[t.name]
            assert t.usage() == ledger.used + ledger.leaving
            assert ledger.used + ledger.reserved <= quota
        run_moves(meta, tiers)
        for t in tiers.values():
            assert t.usage() <= quota
            assert t.usage() == meta.ledgers[t.name].used
    assert stored == 60  # every save fitted by evicting older rows
    assert counters.get("evictions") > 0
    assert counters.get("demotions") > 0 and counters.get("write_behind_copies") > 0
