"""Pins: a checked-out row is never evicted; a dead owner's pins are released."""

from __future__ import annotations

import pytest

from llamad.cache.errors import CacheFull
from llamad.cache.tier_kind import TierKind
from meta_fakes import intent, make_meta, publish

pytestmark = pytest.mark.timeout(30)


def test_pinned_row_is_never_evicted_by_evict_bytes() -> None:
    meta, store, _, _ = make_meta()
    old = publish(meta, store, intent(range(10)))
    new = publish(meta, store, intent(range(11)))
    ref = meta.checkout(old, owner=5)
    assert ref is not None and ref.pin is not None
    rows, freed = meta.evict_bytes(10**9)
    assert (rows, freed) == (1, 1000)
    assert old in meta.rows and new not in meta.rows
    assert store.deleted == [new]


def test_pinned_rows_are_never_evicted_to_make_room_for_a_save() -> None:
    meta, store, _, counters = make_meta({TierKind.DISK: 2000})
    a = publish(meta, store, intent(range(10)))
    b = publish(meta, store, intent(range(11)))
    meta.checkout(a, owner=5)
    meta.checkout(b, owner=6)
    with pytest.raises(CacheFull):
        meta.reserve_save(intent(range(12)), owner=7)
    assert counters.get("saves_dropped") == 1
    assert a in meta.rows and b in meta.rows and store.deleted == []


def test_dead_owner_releases_its_pins_and_the_row_becomes_evictable() -> None:
    meta, store, _, _ = make_meta()
    key = publish(meta, store, intent(range(10)))
    meta.checkout(key, owner=5)
    meta.checkout(key, owner=5)
    meta.checkout(key, owner=6)
    assert meta.rows[key].pins == 3
    assert meta.evict_bytes(1) == (0, 0)
    meta.owner_down(5)
    assert meta.rows[key].pins == 1 and meta.pins_of(5) == 0
    meta.owner_down(6)
    assert meta.rows[key].pins == 0
    assert meta.evict_bytes(1) == (1, 1000)


def test_checkin_is_idempotent_and_only_releases_its_own_pin() -> None:
    meta, store, _, _ = make_meta()
    key = publish(meta, store, intent(range(10)))
    first = meta.checkout(key, owner=5)
    second = meta.checkout(key, owner=5)
    assert first is not None and second is not None and first.pin != second.pin
    assert first.pin is not None and meta.checkin(first.pin)
    assert not meta.checkin(first.pin)
    assert meta.rows[key].pins == 1


def test_checkout_of_an_unknown_key_is_none() -> None:
    meta, _, _, _ = make_meta()
    assert meta.checkout(intent(range(3)).key, owner=5) is None


def test_hit_counts_of_pinned_rows_are_persisted_only_after_checkin() -> None:
    meta, store, _, _ = make_meta()
    key = publish(meta, store, intent(range(10)))
    ref = meta.lookup_exact(key, owner=5)
    assert ref is not None and ref.pin is not None
    assert meta.flush_stats() == 0
    meta.checkin(ref.pin)
    assert meta.flush_stats() == 1
    assert store.stats[ref.location][0] == 1
    assert meta.flush_stats() == 0


def test_a_pin_on_a_forgotten_row_never_touches_the_row_saved_again_under_its_key() -> None:
    meta, store, _, _ = make_meta()
    it = intent(range(10))
    publish(meta, store, it)
    stale = meta.checkout(it.key, owner=5)
    assert stale is not None and stale.pin is not None
    meta.forget(it.key)  # the loader found the file corrupt
    publish(meta, store, it)  # ...and the prefix is saved again before it checks in
    fresh = meta.checkout(it.key, owner=6)
    assert fresh is not None and fresh.pin is not None
    assert meta.checkin(stale.pin)
    assert meta.rows[it.key].pins == 1  # still pinned by owner 6
    assert meta.evict_bytes(10**9) == (0, 0)
    assert meta.checkin(fresh.pin)
    assert meta.rows[it.key].pins == 0
    assert meta.evict_bytes(10**9) == (1, 1000)
