"""The tier hierarchy in cache-meta (SPEC C12), stepped with a fake store and clock.

A save with no tier lands in the fastest tier that can take it; quota
eviction demotes ram → ram_file → disk and deletes from disk; a row has
copies in several tiers (write-behind, links), served fastest first among
the caller's tiers; a hot row read from a slower tier is promoted; a clean
stop demotes ram. Moves are asked for here and landed by the test
(``land``), as the mover would after its file work.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.cache.errors import AlreadyCached, CacheFull, SaveInFlight
from llamad.cache.lookup import HitKind
from llamad.cache.meta import CacheMeta
from llamad.cache.moves import MoveKind, MoveResult
from llamad.cache.reservation import SaveIntent
from llamad.cache.tier_kind import TierKind
from meta_fakes import NS, FakeStore, intent, kvc_meta, land, land_all, le, make_meta, publish

pytestmark = pytest.mark.timeout(60)

RAM, RAM_FILE, DISK = TierKind.RAM, TierKind.RAM_FILE, TierKind.DISK


def auto(tokens: list[int] | range, size: int = 1000) -> SaveIntent:
    """A save that lets cache-meta choose its tier."""
    it = intent(tokens, size=size)
    return SaveIntent(it.key, it.namespace, it.tokens, None, size, it.reason)


def save(meta: CacheMeta, store: FakeStore, it: SaveIntent, owner: int = 7) -> TierKind:
    """The whole protocol for an auto save; returns the tier cache-meta chose."""
    token, tier = meta.reserve(it, owner)
    meta.check_reservation(it.key, token)
    location = f"/{tier}/{it.key.hex()}.kvc"
    meta.mark_published(it.key, token, location)
    store.files[(tier, location)] = it.key
    meta.announce_saved(it.key, token)
    return tier


def tiers_of(meta: CacheMeta, key: bytes) -> set[TierKind]:
    row = meta.rows.get(key)
    return set() if row is None else set(row.copies)


def hierarchy(
    ram: int = 2000, ram_file: int = 2000, disk: int = 10_000, **kwargs: object
) -> tuple[CacheMeta, FakeStore]:
    quotas = {RAM: ram, RAM_FILE: ram_file, DISK: disk}
    kwargs.setdefault("write_behind", False)
    kwargs.setdefault("promote_hits", 0)
    meta, store, _, _ = make_meta({k: v for k, v in quotas.items() if v is not None}, **kwargs)
    return meta, store


# -- where a save lands ---------------------------------------------------------------


def test_an_auto_save_lands_in_the_fastest_tier_with_room() -> None:
    meta, store = hierarchy()
    a, b = auto([1]), auto([2])
    assert save(meta, store, a) is RAM
    assert save(meta, store, b) is RAM
    # ram is full: its least recently used copy demotes, and the save still lands in ram.
    c = auto([3])
    assert save(meta, store, c) is RAM
    [job] = meta.take_moves()
    assert (job.kind, job.key, job.src_tier, job.dst_tier) == (
        MoveKind.DEMOTE,
        a.key,
        RAM,
        RAM_FILE,
    )
    assert meta.ledgers[RAM].used == 2000 and meta.ledgers[RAM_FILE].reserved == 1000


def test_an_auto_save_skips_a_tier_that_cannot_make_room() -> None:
    meta, store = hierarchy()
    for i in (1, 2):
        save(meta, store, auto([i]))
        assert meta.checkout(auto([i]).key, owner=9) is not None  # pinned: never evicted
    assert save(meta, store, auto([3])) is RAM_FILE
    # A row bigger than ram's whole quota goes where it fits.
    assert save(meta, store, auto([4], size=5000)) is DISK


def test_an_auto_save_chooses_among_the_writers_tiers_only() -> None:
    meta, _ = hierarchy()
    assert meta.reserve(auto([1]), 7, tiers={RAM_FILE, DISK}).tier is RAM_FILE
    assert meta.reserve(auto([2]), 7, tiers={DISK}).tier is DISK


def test_an_auto_save_no_tier_can_take_is_refused() -> None:
    meta, _ = hierarchy(ram=500, ram_file=500, disk=500)
    with pytest.raises(CacheFull) as err:
        meta.reserve(auto([1]), 7)
    assert err.value.details["tier"] == "auto"
    assert meta.counters.get("saves_dropped") == 1  # type: ignore[attr-defined]
    assert all(ledger.reserved == 0 for ledger in meta.ledgers.values())


def test_an_explicit_tier_keeps_its_behaviour() -> None:
    meta, store = hierarchy(ram=1000)
    publish(meta, store, intent([1], tier=DISK))
    assert tiers_of(meta, intent([1]).key) == {DISK}
    publish(meta, store, intent([2], tier=RAM))
    with pytest.raises(CacheFull):
        meta.reserve(intent([3], tier=RAM, size=1001), 7)


# -- demotion -----------------------------------------------------------------------------


def test_quota_eviction_demotes_ram_to_ram_file_to_disk_then_deletes() -> None:
    meta, store = hierarchy(ram=1000, ram_file=1000, disk=1000)
    keys = [auto([i]).key for i in range(4)]
    for i in range(4):
        assert save(meta, store, auto([i])) is RAM
        land_all(meta, store)
    # Row 3 in ram, 2 demoted to ram_file, 1 on to disk, 0 off the end.
    assert [tiers_of(meta, k) for k in keys] == [set(), {DISK}, {RAM_FILE}, {RAM}]
    c = meta.counters
    assert c.get("demotions") == 2 + 2 + 1  # type: ignore[attr-defined]
    assert c.get("evictions") == 1  # type: ignore[attr-defined]
    # Each demoted copy's source file went once its destination landed.
    assert (RAM, f"/ram/{keys[0].hex()}.kvc") not in store.files
    assert meta.longest_prefix(NS.header(), le([0])).row is None


def test_a_demoted_copy_is_served_until_its_destination_lands() -> None:
    meta, store = hierarchy(ram=1000)
    a = auto([1])
    save(meta, store, a)
    save(meta, store, auto([2]))  # a's ram copy leaves
    ledger = meta.ledgers[RAM]
    assert (ledger.used, ledger.leaving) == (1000, 1000)
    found = meta.lookup_exact(a.key, owner=5)
    assert found is not None and found.tier is RAM
    [job] = meta.take_moves()
    land(meta, store, job)
    # Pinned when it was replaced: its file stays until the last checkin.
    assert (RAM, f"/ram/{a.key.hex()}.kvc") in store.files
    again = meta.lookup_exact(a.key, owner=5)
    assert again is not None and again.tier is RAM_FILE
    assert found.pin is not None and meta.checkin(found.pin)
    assert (RAM, f"/ram/{a.key.hex()}.kvc") not in store.files
    assert ledger.leaving == 0 and meta.ledgers[RAM_FILE].used == 1000


def test_evicting_a_copy_whose_row_has_one_below_just_drops_it() -> None:
    meta, store = hierarchy(ram=1000, ram_file=None, write_behind=True)
    a = auto([1])
    save(meta, store, a)
    [job] = land_all(meta, store)
    assert job.kind is MoveKind.WRITE_BEHIND and tiers_of(meta, a.key) == {RAM, DISK}
    save(meta, store, auto([2]))  # evicts a's ram copy: its disk copy serves on
    assert not [j for j in meta.take_moves() if j.kind is MoveKind.DEMOTE]
    assert tiers_of(meta, a.key) == {DISK}
    assert meta.counters.get("evictions") == 1  # type: ignore[attr-defined]
    found = meta.lookup_exact(a.key)
    assert found is not None and found.tier is DISK


def test_a_last_copy_evicted_while_its_disk_copy_is_written_waits_for_it() -> None:
    # Memory pressure (evict_bytes) takes a ram row whose write-behind is in
    # flight: ram gets its room at once, and the row is never without a file.
    meta, store = hierarchy(write_behind=True)
    a = auto([1])
    save(meta, store, a)
    [behind] = meta.take_moves()
    assert meta.evict_bytes(1, [RAM]) == (1, 1000)
    assert meta.ledgers[RAM].used == 0 and meta.ledgers[RAM].leaving == 1000
    served = meta.lookup_exact(a.key)
    assert served is not None and served.tier is RAM
    land(meta, store, behind)
    assert tiers_of(meta, a.key) == {DISK}
    assert (RAM, f"/ram/{a.key.hex()}.kvc") not in store.files
    assert meta.ledgers[RAM].leaving == 0


def test_a_demotion_that_failed_drops_the_copy_it_was_for() -> None:
    meta, store = hierarchy(ram=1000)
    a = auto([1])
    save(meta, store, a)
    save(meta, store, auto([2]))
    [job] = meta.take_moves()
    meta.move_done(MoveResult(job.id, None, error="ENOSPC"))
    assert a.key not in meta.rows
    assert (RAM, f"/ram/{a.key.hex()}.kvc") not in store.files
    assert meta.ledgers[RAM_FILE].reserved == 0 and meta.ledgers[RAM].leaving == 0
    c = meta.counters
    assert (c.get("moves_failed"), c.get("evictions")) == (1, 1)  # type: ignore[attr-defined]


def test_a_move_whose_row_went_meanwhile_deletes_its_file() -> None:
    meta, store = hierarchy(ram=1000)
    a = auto([1])
    save(meta, store, a)
    save(meta, store, auto([2]))
    [job] = meta.take_moves()
    assert meta.forget(a.key)  # a loader found it damaged meanwhile
    land(meta, store, job)
    assert a.key not in meta.rows
    assert (RAM_FILE, f"/ram_file/{a.key.hex()}.kvc") not in store.files


def test_a_key_with_a_move_in_flight_is_not_reserved_again() -> None:
    meta, store = hierarchy(ram=1000)
    a = auto([1])
    save(meta, store, a)
    save(meta, store, auto([2]))
    [job] = meta.take_moves()
    meta.forget(a.key)
    # The mover's file and a new save would race for ram_file's final path.
    with pytest.raises(SaveInFlight):
        meta.reserve(intent([1], tier=RAM_FILE), 7)
    land(meta, store, job)
    assert meta.reserve(intent([1], tier=RAM_FILE), 7).tier is RAM_FILE


def test_forget_names_the_copy_and_keeps_the_others() -> None:
    meta, store = hierarchy(write_behind=True)
    a = auto([1])
    save(meta, store, a)
    land_all(meta, store)
    assert tiers_of(meta, a.key) == {RAM, DISK}
    # A reader lost a race to a deleted ram copy: only that copy goes.
    assert meta.forget(a.key, RAM)
    assert tiers_of(meta, a.key) == {DISK}
    assert not meta.forget(a.key, RAM)
    found = meta.longest_prefix(NS.header(), le([1]), owner=5)
    assert found.row is not None and found.row.tier is DISK


def test_gc_drops_a_vanished_copy_and_keeps_the_row() -> None:
    meta, store = hierarchy(write_behind=True)
    a = auto([1])
    save(meta, store, a)
    land_all(meta, store)
    del store.files[(RAM, f"/ram/{a.key.hex()}.kvc")]
    assert meta.gc().missing == 1
    assert tiers_of(meta, a.key) == {DISK}


# -- write-behind -------------------------------------------------------------------------


def test_write_behind_gives_ram_rows_a_disk_copy_one_at_a_time() -> None:
    meta, store = hierarchy(ram=5000, write_behind=True)
    its = [auto([i]) for i in range(3)]
    for it in its:
        save(meta, store, it)
    [first] = meta.take_moves()
    assert (first.kind, first.key, first.dst_tier) == (MoveKind.WRITE_BEHIND, its[0].key, DISK)
    assert meta.ledgers[DISK].reserved == 1000
    land(meta, store, first)
    [second] = meta.take_moves()
    assert second.key == its[1].key
    land(meta, store, second)
    land_all(meta, store)
    assert all(tiers_of(meta, it.key) == {RAM, DISK} for it in its)
    assert meta.counters.get("write_behind_copies") == 3  # type: ignore[attr-defined]
    # Served from the fastest copy; both copies count in their tiers.
    assert meta.lookup_exact(its[0].key).tier is RAM  # type: ignore[union-attr]
    assert meta.ledgers[RAM].used == meta.ledgers[DISK].used == 3000


def test_a_write_behind_whose_source_went_is_retried_from_another_copy() -> None:
    meta, store = hierarchy(ram=1000, ram_file=5000, write_behind=True)
    a = auto([1])
    save(meta, store, a)
    [behind] = meta.take_moves()
    save(meta, store, auto([2]))  # a's ram copy demotes to ram_file
    demote = next(j for j in meta.take_moves() if j.kind is MoveKind.DEMOTE)
    land(meta, store, demote)
    meta.move_done(MoveResult(behind.id, None, error="gone", source_missing=True))
    retry = next(j for j in land_all(meta, store) if j.key == a.key)
    assert (retry.kind, retry.src_tier, retry.dst_tier) == (MoveKind.WRITE_BEHIND, RAM_FILE, DISK)
    assert tiers_of(meta, a.key) == {RAM_FILE, DISK}


def test_no_write_behind_without_a_disk_tier_or_when_off() -> None:
    meta, store = hierarchy(disk=None, write_behind=True)
    save(meta, store, auto([1]))
    assert meta.take_moves() == []
    meta, store = hierarchy(write_behind=False)
    save(meta, store, auto([1]))
    assert meta.take_moves() == []


def test_a_rebuild_asks_for_the_disk_copies_rows_lack() -> None:
    meta, _ = hierarchy(write_behind=True)
    it = intent([1], tier=RAM_FILE)
    meta.adopt_file(kvc_meta(it), RAM_FILE, "/ram_file/a")
    meta.finish_rebuild()
    [job] = meta.take_moves()
    assert (job.kind, job.src_tier, job.dst_tier) == (MoveKind.WRITE_BEHIND, RAM_FILE, DISK)


# -- lookups by the caller's tiers, and promotion ----------------------------------------------


def test_a_lookup_answers_the_fastest_copy_among_the_callers_tiers() -> None:
    meta, store = hierarchy(write_behind=True)
    a = auto(range(10))
    save(meta, store, a)
    land_all(meta, store)
    prompt = le(range(10))
    assert meta.longest_prefix(NS.header(), prompt).row.tier is RAM  # type: ignore[union-attr]
    disk = meta.longest_prefix(NS.header(), prompt, tiers={DISK, RAM_FILE})
    assert disk.row is not None and disk.row.tier is DISK
    assert disk.row.location == f"/disk/{a.key.hex()}.kvc"
    # A row with no copy the caller may read is a miss, counted as one.
    before = meta.counters.get("misses")  # type: ignore[attr-defined]
    assert meta.longest_prefix(NS.header(), prompt, tiers={RAM_FILE}).row is None
    assert meta.lookup_exact(a.key, tiers={RAM_FILE}) is None
    assert meta.counters.get("misses") == before + 2  # type: ignore[attr-defined]


def test_a_hot_row_read_from_a_slower_tier_is_promoted_into_a_tier_the_reader_reads() -> None:
    meta, store = hierarchy(promote_hits=2)
    it = intent(range(10), tier=DISK)
    meta.adopt_file(kvc_meta(it), DISK, f"/disk/{it.key.hex()}.kvc")
    meta.finish_rebuild()
    prompt = le(range(10))
    readers = {RAM_FILE, DISK}  # this reader does not restore from ram
    meta.longest_prefix(NS.header(), prompt, tiers=readers)
    assert meta.take_moves() == []  # one hit is not hot
    meta.longest_prefix(NS.header(), prompt, tiers=readers)
    [job] = meta.take_moves()
    assert (job.kind, job.src_tier, job.dst_tier) == (MoveKind.PROMOTE, DISK, RAM_FILE)
    land(meta, store, job, linked=False)
    assert tiers_of(meta, it.key) == {RAM_FILE, DISK}  # a promotion keeps the slower copy
    found = meta.longest_prefix(NS.header(), prompt, tiers=readers)
    assert found.row is not None and found.row.tier is RAM_FILE
    # A reader of every tier promotes on into ram.
    meta.longest_prefix(NS.header(), prompt)
    [up] = meta.take_moves()
    assert (up.src_tier, up.dst_tier) == (RAM_FILE, RAM)
    assert meta.counters.get("promotions") == 1  # type: ignore[attr-defined]


def test_promotion_is_off_at_zero_and_after_a_stop_began() -> None:
    meta, _ = hierarchy(promote_hits=0)
    it = intent([1], tier=DISK)
    meta.adopt_file(kvc_meta(it, hits=50), DISK, "/disk/a")
    meta.lookup_exact(it.key)
    assert meta.take_moves() == []
    meta, _ = hierarchy(promote_hits=1)
    meta.adopt_file(kvc_meta(it, hits=50), DISK, "/disk/a")
    meta.begin_stop()
    meta.lookup_exact(it.key)
    assert meta.take_moves() == []


# -- a clean stop -------------------------------------------------------------------------------


def test_a_clean_stop_demotes_ram_rows_most_recent_first() -> None:
    meta, store = hierarchy(ram=3000, ram_file=2000)
    its = [auto([i]) for i in range(3)]
    for it in its:
        save(meta, store, it)
    pinned = auto([9])
    assert meta.begin_stop() == 3
    jobs = {job.key: job for job in meta.take_moves()}
    # The two most recent fit ram_file; the oldest goes on to disk.
    assert jobs[its[2].key].dst_tier is RAM_FILE and jobs[its[1].key].dst_tier is RAM_FILE
    assert jobs[its[0].key].dst_tier is DISK
    for job in jobs.values():
        land(meta, store, job)
    assert meta.ledgers[RAM].used == 0 and len(meta.ledgers[RAM]) == 0
    assert not any(t is RAM for t, _ in store.files)
    assert pinned.key not in meta.rows


def test_a_start_links_the_newest_ram_file_rows_back_into_ram_while_it_has_room() -> None:
    meta, store = hierarchy(ram=2000, ram_file=4000)
    its = [intent([i], tier=RAM_FILE) for i in range(3)]
    for age, it in enumerate(its):
        meta.adopt_file(kvc_meta(it, last_used_ns=1_000 + age), RAM_FILE, f"/ram_file/{age}")
    on_disk = intent([7], tier=DISK)
    meta.adopt_file(kvc_meta(on_disk, last_used_ns=9_000), DISK, "/disk/7")
    meta.finish_rebuild()
    assert meta.promote_newest(RAM_FILE, RAM) == 2
    jobs = meta.take_moves()
    # The two most recently used fit ram; the oldest stays below, and a row
    # with no ram_file copy is not the caller's to move.
    assert {j.key for j in jobs} == {its[2].key, its[1].key}
    assert all((j.kind, j.src_tier, j.dst_tier) == (MoveKind.PROMOTE, RAM_FILE, RAM) for j in jobs)
    for job in jobs:
        land(meta, store, job, linked=True)
    assert tiers_of(meta, its[2].key) == {RAM, RAM_FILE}
    assert tiers_of(meta, its[0].key) == {RAM_FILE}
    found = meta.lookup_exact(its[2].key)
    assert found is not None and found.tier is RAM
    assert meta.ledgers[RAM].used == 2000
    # Nothing is moved twice, and nothing once a stop began.
    assert meta.promote_newest(RAM_FILE, RAM) == 0
    meta.begin_stop()
    assert meta.promote_newest(RAM_FILE, RAM) == 0


# -- exact hits from rows that run past the prompt -----------------------------------------------


def test_a_prompt_repeated_inside_its_longer_row_is_an_exact_hit_below_common_min_tokens() -> None:
    # The finish save of a 196-token prompt holds prompt + reply; repeating the
    # prompt restores that row truncated to 196 tokens, and nothing is prefilled.
    meta, store, _, counters = make_meta()
    prompt = list(range(196))
    key = publish(meta, store, intent([*prompt, *range(1000, 1100)]))
    found = meta.longest_prefix(NS.header(), le(prompt), owner=5)
    assert found.row is not None and found.row.key == key
    assert (found.kind, found.use_tokens) == (HitKind.COMMON, 196)
    assert counters.get("hits_exact") == 1 and counters.get("hits_longest_prefix") == 0
    # A prompt that diverges inside the row still needs common_min_tokens.
    assert meta.longest_prefix(NS.header(), le([*prompt[:100], 7])).row is None


# -- the quota under any mix of saves and moves ------------------------------------------------


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["save", "land", "fail", "hit", "pin", "unpin"]), st.integers(0, 40)
        ),
        min_size=1,
        max_size=80,
    ),
    write_behind=st.booleans(),
)
@settings(max_examples=150, deadline=None)
def test_quotas_hold_and_no_row_is_lost_but_by_eviction(
    ops: list[tuple[str, int]], write_behind: bool
) -> None:
    meta, store = hierarchy(ram=3000, ram_file=3000, disk=6000, write_behind=write_behind)
    pending = []
    pins: list[int] = []
    for op, n in ops:
        if op == "save":
            # A full cache, or a key already there or being copied, is no save.
            with contextlib.suppress(CacheFull, AlreadyCached, SaveInFlight):
                save(meta, store, auto([n], size=500 + 97 * (n % 11)))
        elif op in ("land", "fail"):
            pending.extend(meta.take_moves())
            if pending:
                job = pending.pop(n % len(pending))
                if op == "land":
                    land(meta, store, job)
                else:
                    meta.move_done(MoveResult(job.id, None, error="EIO"))
        elif op == "hit":
            ref = meta.lookup_exact(auto([n]).key, owner=3)
            if ref is not None and ref.pin is not None:
                pins.append(ref.pin)
        elif op == "unpin" and pins:
            meta.checkin(pins.pop(n % len(pins)))
        for tier, ledger in meta.ledgers.items():
            live = list(ledger.rows())
            assert ledger.used + ledger.reserved <= ledger.quota
            assert ledger.used == sum(c.size for c in live)
            assert all(c.row.copies.get(tier) is c and not c.leaving for c in live)
            leaving = [
                c
                for row in meta.rows.values()
                for c in row.copies.values()
                if c.tier is tier and c.leaving
            ]
            assert ledger.leaving == sum(c.size for c in leaving)
            # The tier's files: its live copies, leaving copies (the documented
            # overshoot, until their move lands) and pinned copies already replaced.
            on_disk = sum(1 for t, _ in store.files if t == tier)
            assert on_disk <= len(live) + len(leaving) + len(pins)
        for row in meta.rows.values():
            assert row.copies, "an indexed row always has a copy"
