"""cache-meta's side of the publish protocol: reserve, check, link, announce, reap."""

from __future__ import annotations

import pytest

from llamad.cache.errors import (
    AlreadyCached,
    CacheFull,
    InvalidCacheValue,
    PublishAbandoned,
    SaveInFlight,
)
from llamad.cache.kvc import SaveReason
from llamad.cache.reservation import SaveIntent, Stage
from llamad.cache.tier_kind import TierKind
from meta_fakes import NS, intent, kvc_meta, le, make_meta, publish

pytestmark = pytest.mark.timeout(30)


def test_announced_row_is_found_by_exact_lookup() -> None:
    meta, store, _, counters = make_meta()
    it = intent(range(600), reason=SaveReason.FINISH)
    publish(meta, store, it)
    ref = meta.lookup_exact(it.key)
    assert ref is not None
    assert (ref.key, ref.tier, ref.file_size, ref.n_tokens) == (it.key, "disk", 1000, 600)
    assert counters.get("saves_finish") == 1
    assert counters.get("hits_exact") == 1
    assert counters.get("bytes_disk") == 1000
    assert meta.ledgers[TierKind.DISK].reserved == 0


def test_reserve_of_published_key_is_refused_as_already_cached() -> None:
    meta, store, _, counters = make_meta()
    it = intent(range(10))
    publish(meta, store, it)
    with pytest.raises(AlreadyCached):
        meta.reserve_save(it, owner=8)
    assert counters.get("duplicate_dropped") == 1


def test_second_writer_of_one_key_is_refused_while_first_is_live() -> None:
    meta, _, _, counters = make_meta()
    it = intent(range(10))
    meta.reserve_save(it, owner=1)
    with pytest.raises(SaveInFlight):
        meta.reserve_save(it, owner=2)
    assert counters.get("duplicate_dropped") == 1


def test_expired_reservation_is_superseded_by_a_new_writer() -> None:
    meta, _, clock, _ = make_meta(ttl=5)
    it = intent(range(10))
    stale = meta.reserve_save(it, owner=1)
    clock.advance(6)
    fresh = meta.reserve_save(it, owner=2)
    assert fresh != stale
    with pytest.raises(PublishAbandoned):
        meta.check_reservation(it.key, stale)
    meta.check_reservation(it.key, fresh)


def test_check_with_a_wrong_token_abandons() -> None:
    meta, _, _, _ = make_meta()
    it = intent(range(10))
    token = meta.reserve_save(it, owner=1)
    with pytest.raises(PublishAbandoned):
        meta.check_reservation(it.key, token + 1)
    with pytest.raises(PublishAbandoned):
        meta.check_reservation(intent(range(11)).key, token)


def test_link_before_check_is_rejected() -> None:
    meta, _, _, _ = make_meta()
    it = intent(range(10))
    token = meta.reserve_save(it, owner=1)
    with pytest.raises(InvalidCacheValue):
        meta.mark_published(it.key, token, "/disk/x.kvc")
    with pytest.raises(InvalidCacheValue):
        meta.announce_saved(it.key, token, location="/disk/x.kvc")
    assert meta.reservations[it.key].stage is Stage.RESERVED


def test_announce_without_link_needs_a_location() -> None:
    meta, _, _, _ = make_meta()
    it = intent(range(10), tier=TierKind.RAM)
    token = meta.reserve_save(it, owner=1)
    meta.check_reservation(it.key, token)
    with pytest.raises(InvalidCacheValue):
        meta.announce_saved(it.key, token)
    ref = meta.announce_saved(it.key, token, location="llamad-shm-x")
    assert ref.location == "llamad-shm-x"


def test_cancel_returns_reserved_bytes() -> None:
    meta, _, _, _ = make_meta()
    it = intent(range(10), size=500)
    token = meta.reserve_save(it, owner=1)
    assert meta.ledgers[TierKind.DISK].reserved == 500
    assert meta.cancel_reservation(it.key, token)
    assert not meta.cancel_reservation(it.key, token)
    assert meta.ledgers[TierKind.DISK].reserved == 0
    assert it.key not in meta.reservations


def test_intent_with_a_key_that_is_not_its_tokens_is_rejected() -> None:
    data = le(range(10))
    with pytest.raises(InvalidCacheValue) as err:
        SaveIntent(
            key=NS.key(le(range(11))),
            namespace=NS.header(),
            tokens=data,
            tier=TierKind.DISK,
            size=10,
            reason=SaveReason.COLD,
        )
    assert err.value.field == "key"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tier", "tape"),
        ("size", 0),
        ("reason", 9),
        ("tokens", b"\x01\x02\x03"),
        ("tokens", b""),
        ("namespace", b"short"),
    ],
)
def test_malformed_intent_names_the_field(field: str, value: object) -> None:
    fields: dict[str, object] = {
        "key": NS.key(le(range(3))),
        "namespace": NS.header(),
        "tokens": le(range(3)),
        "tier": "disk",
        "size": 10,
        "reason": SaveReason.COLD,
    }
    fields[field] = value
    with pytest.raises(InvalidCacheValue) as err:
        SaveIntent(**fields)  # type: ignore[arg-type]
    assert err.value.field == field


def test_reserve_into_an_unconfigured_tier_is_rejected() -> None:
    meta, _, _, _ = make_meta({TierKind.DISK: 10_000})
    with pytest.raises(InvalidCacheValue):
        meta.reserve_save(intent(range(3), tier=TierKind.RAM), owner=1)


def test_row_larger_than_the_quota_is_refused_as_cache_full() -> None:
    meta, _, _, counters = make_meta({TierKind.DISK: 999})
    with pytest.raises(CacheFull):
        meta.reserve_save(intent(range(3), size=1000), owner=1)
    assert counters.get("saves_dropped") == 1


def test_reaper_drops_expired_pre_link_reservation() -> None:
    meta, store, clock, _ = make_meta(ttl=5)
    it = intent(range(10))
    meta.reserve_save(it, owner=1)
    clock.advance(5)
    assert meta.reap_expired() == 1
    assert it.key not in meta.reservations
    assert meta.ledgers[TierKind.DISK].reserved == 0
    # A pre-link reservation never had a final file: nothing is probed.
    assert store.unlinked_orphans == []


def test_reaper_adopts_post_link_orphan() -> None:
    meta, store, clock, counters = make_meta(ttl=5)
    it = intent(range(10), reason=SaveReason.CONTINUED)
    token = meta.reserve_save(it, owner=1)
    meta.check_reservation(it.key, token)
    meta.mark_published(it.key, token, "/disk/orphan.kvc")
    store.linked[it.key] = kvc_meta(it, hits=3)
    clock.advance(60)
    meta.tick()
    ref = meta.lookup_exact(it.key)
    assert ref is not None and ref.location == "/disk/orphan.kvc"
    assert meta.rows[it.key].hits == 4
    assert counters.get("saves_continued") == 1


def test_reaper_unlinks_post_link_file_that_does_not_validate() -> None:
    meta, store, clock, _ = make_meta(ttl=5)
    it = intent(range(10))
    token = meta.reserve_save(it, owner=1)
    meta.check_reservation(it.key, token)
    clock.advance(60)
    meta.tick()
    assert store.unlinked_orphans == [it.key]
    assert it.key not in meta.reservations and it.key not in meta.rows


def test_dead_writer_is_reaped_without_waiting_for_the_ttl() -> None:
    meta, store, _, _ = make_meta(ttl=3600)
    pre = intent(range(10))
    post = intent(range(11))
    meta.reserve_save(pre, owner=42)
    token = meta.reserve_save(post, owner=42)
    meta.check_reservation(post.key, token)
    meta.mark_published(post.key, token, "/disk/p.kvc")
    store.linked[post.key] = kvc_meta(post)
    other = meta.reserve_save(intent(range(12)), owner=43)
    meta.owner_down(42)
    assert pre.key not in meta.reservations
    assert post.key in meta.rows
    assert meta.reservations[intent(range(12)).key].token == other


def test_protocol_steps_renew_the_ttl() -> None:
    meta, _, clock, _ = make_meta(ttl=10)
    it = intent(range(10))
    token = meta.reserve_save(it, owner=1)
    clock.advance(8)
    meta.check_reservation(it.key, token)
    clock.advance(8)
    meta.tick()
    assert it.key in meta.reservations
    meta.mark_published(it.key, token, "/disk/a.kvc")
    meta.announce_saved(it.key, token)
    assert it.key in meta.rows


def test_announce_with_the_real_size_corrects_the_accounting() -> None:
    meta, _, _, counters = make_meta()
    it = intent(range(10), size=1000)
    token = meta.reserve_save(it, owner=1)
    meta.check_reservation(it.key, token)
    meta.announce_saved(it.key, token, location="/disk/a.kvc", size=1200)
    assert meta.ledgers[TierKind.DISK].used == 1200
    assert meta.ledgers[TierKind.DISK].reserved == 0
    assert counters.get("bytes_disk") == 1200


def test_reaper_survives_a_store_that_cannot_judge_the_file() -> None:
    meta, store, clock, _ = make_meta(ttl=5)
    it = intent(range(10))
    token = meta.reserve_save(it, owner=1)
    meta.check_reservation(it.key, token)

    def broken(tier: str, key: bytes, location: str | None) -> None:
        raise PermissionError("EACCES")

    store.adopt = broken  # type: ignore[method-assign]
    clock.advance(60)
    meta.tick()
    assert it.key not in meta.reservations and it.key not in meta.rows
    assert meta.ledgers[TierKind.DISK].reserved == 0


def test_reserve_with_a_bad_ttl_is_refused_before_anything_is_evicted() -> None:
    meta, store, _, _ = make_meta({TierKind.DISK: 1000})
    old = publish(meta, store, intent([1]))
    with pytest.raises(InvalidCacheValue) as err:
        meta.reserve_save(intent([2]), owner=1, ttl_s=0)
    assert err.value.field == "ttl_s"
    assert old in meta.rows and store.deleted == []
    assert meta.reservations == {}
