"""Lookups through cache-meta: exact, exact-or-wait, longest prefix, resolve."""

from __future__ import annotations

import pytest

from llamad.cache.lookup import HitKind, LookupPolicy, RowRef
from llamad.cache.meta import CacheMeta
from llamad.cache.waiters import WAIT
from meta_fakes import NS, OTHER_NS, intent, le, make_meta, publish

pytestmark = pytest.mark.timeout(30)

# A long shared vocabulary walk: row tokens are prefixes of one sequence.
BASE = [(i * 7919) % 50_000 for i in range(6000)]


def three_rows(policy: LookupPolicy) -> tuple[CacheMeta, dict[int, bytes]]:
    meta, store, _, _ = make_meta(lookup=policy)
    keys = {n: publish(meta, store, intent(BASE[:n])) for n in (300, 1000, 2500)}
    return meta, keys


@pytest.mark.parametrize(
    ("prompt_len", "row_len", "kind"),
    [
        (299, None, None),
        (300, 300, HitKind.EXACT),
        (1999, 1000, HitKind.PREFIX),
        (5000, 2500, HitKind.PREFIX),
    ],
)
def test_longest_prefix_hits_the_right_row(
    prompt_len: int, row_len: int | None, kind: HitKind | None
) -> None:
    meta, keys = three_rows(LookupPolicy(allow_common=False))
    found = meta.longest_prefix(NS.header(), le(BASE[:prompt_len]), owner=5)
    assert found.kind is kind
    if row_len is None:
        assert found.row is None
    else:
        assert found.row is not None
        assert found.row.key == keys[row_len]
        assert found.use_tokens == row_len
        assert found.row.pin is not None
    # The common-prefix report does not depend on the policy.
    assert found.common_tokens == min(prompt_len, 2500)


@pytest.mark.parametrize(
    ("prompt_len", "row_len", "use", "kind"),
    [
        (299, 300, 299, HitKind.COMMON),
        (300, 300, 300, HitKind.EXACT),
        (1999, 2500, 1999, HitKind.COMMON),
        (5000, 2500, 2500, HitKind.PREFIX),
    ],
)
def test_prompt_inside_a_longer_row_restores_it_truncated(
    prompt_len: int, row_len: int, use: int, kind: HitKind
) -> None:
    meta, keys = three_rows(LookupPolicy())
    found = meta.longest_prefix(NS.header(), le(BASE[:prompt_len]), owner=5)
    assert (found.kind, found.use_tokens) == (kind, use)
    assert found.row is not None and found.row.key == keys[row_len]


def test_common_prefix_is_reported_for_a_prompt_that_diverges_inside_a_row() -> None:
    meta, store, _, counters = make_meta(
        lookup=LookupPolicy(common_min_tokens=64, restore_cost=0.05)
    )
    publish(meta, store, intent(BASE[:300]))
    long_key = publish(meta, store, intent(BASE[:2500]))
    prompt = [*BASE[:1700], 49999, 49998, *BASE[1702:2000]]
    found = meta.longest_prefix(NS.header(), le(prompt), owner=5)
    assert found.common_tokens == 1700
    assert found.common_key == long_key
    # 1700 shared tokens beat the 300-token prefix even after paying for 2500 restored.
    assert found.kind is HitKind.COMMON
    assert found.row is not None and found.row.key == long_key
    assert found.use_tokens == 1700
    assert counters.get("hits_longest_prefix") == 1


def test_common_row_is_not_chosen_when_the_prefix_row_is_nearly_as_good() -> None:
    meta, store, _, _ = make_meta(lookup=LookupPolicy(common_min_tokens=64, restore_cost=0.05))
    short_key = publish(meta, store, intent(BASE[:1000]))
    long_key = publish(meta, store, intent(BASE[:6000]))
    prompt = [*BASE[:1010], 49999]
    found = meta.longest_prefix(NS.header(), le(prompt), owner=5)
    assert found.common_key == long_key and found.common_tokens == 1010
    assert found.kind is HitKind.PREFIX
    assert found.row is not None and found.row.key == short_key


def test_common_restores_can_be_disabled() -> None:
    meta, store, _, _ = make_meta(lookup=LookupPolicy(allow_common=False))
    publish(meta, store, intent(BASE[:2500]))
    found = meta.longest_prefix(NS.header(), le([*BASE[:2000], 49999]), owner=5)
    assert found.row is None and found.common_tokens == 2000


def test_longest_prefix_stays_in_its_namespace() -> None:
    meta, store, _, counters = make_meta()
    publish(meta, store, intent(BASE[:300], ns=OTHER_NS))
    found = meta.longest_prefix(NS.header(), le(BASE[:400]), owner=5)
    assert found.row is None and found.common_tokens == 0
    assert counters.get("misses") == 1


def test_longest_prefix_counts_probes_and_time() -> None:
    meta, store, _, counters = make_meta()
    publish(meta, store, intent(BASE[:300]))
    meta.longest_prefix(NS.header(), le(BASE[:400]))
    assert counters.get("longest_prefix_probes") > 0
    assert counters.get("longest_prefix_ns") > 0


def test_lookup_pins_the_row_and_bumps_its_hit_count() -> None:
    meta, store, _, _ = make_meta()
    key = publish(meta, store, intent(BASE[:300]))
    found = meta.longest_prefix(NS.header(), le(BASE[:400]), owner=5)
    assert found.row is not None and found.row.pin is not None
    assert meta.rows[key].pins == 1 and meta.rows[key].hits == 1
    assert meta.checkin(found.row.pin)
    assert meta.rows[key].pins == 0


def test_waiter_is_released_when_the_save_publishes() -> None:
    meta, _store, _, counters = make_meta()
    it = intent(BASE[:600], reason=2)
    token = meta.reserve_save(it, owner=1)
    assert meta.lookup_exact_or_wait(it.key, owner=9, wait_s=0.5, handle="h1") is WAIT
    assert meta.take_ready() == []
    meta.check_reservation(it.key, token)
    meta.announce_saved(it.key, token, location="/disk/a.kvc")
    ready = meta.take_ready()
    assert len(ready) == 1
    handle, answer = ready[0]
    assert handle == "h1"
    assert isinstance(answer, RowRef) and answer.key == it.key and answer.pin is not None
    assert meta.rows[it.key].pins == 1
    assert counters.get("hits_resume") == 1


def test_waiter_times_out_when_the_save_does_not_publish() -> None:
    meta, _, clock, counters = make_meta()
    it = intent(BASE[:600])
    meta.reserve_save(it, owner=1)
    assert meta.lookup_exact_or_wait(it.key, owner=9, wait_s=0.5, handle="h1") is WAIT
    assert meta.next_deadline() == pytest.approx(clock.now + 0.5)
    clock.advance(0.4)
    meta.tick()
    assert meta.take_ready() == []
    clock.advance(0.2)
    meta.tick()
    assert meta.take_ready() == [("h1", None)]
    assert counters.get("misses") == 1
    assert meta.waiting() == 0


def test_waiter_gets_a_miss_when_the_save_is_cancelled() -> None:
    meta, _, _, _ = make_meta()
    it = intent(BASE[:600])
    token = meta.reserve_save(it, owner=1)
    assert meta.lookup_exact_or_wait(it.key, owner=9, wait_s=5, handle="h") is WAIT
    meta.cancel_reservation(it.key, token)
    assert meta.take_ready() == [("h", None)]


def test_exact_or_wait_without_an_in_flight_save_misses_at_once() -> None:
    meta, _, _, _ = make_meta()
    assert meta.lookup_exact_or_wait(intent(BASE[:5]).key, owner=9, wait_s=5, handle="h") is None


def test_waiter_of_a_dead_owner_is_dropped() -> None:
    meta, _, _, _ = make_meta()
    it = intent(BASE[:600])
    token = meta.reserve_save(it, owner=1)
    meta.lookup_exact_or_wait(it.key, owner=9, wait_s=5, handle="h")
    meta.owner_down(9)
    meta.check_reservation(it.key, token)
    meta.announce_saved(it.key, token, location="/disk/a.kvc")
    assert meta.take_ready() == []
    assert meta.rows[it.key].pins == 0


def test_resolve_waits_for_the_parent_save_then_walks_the_prompt() -> None:
    meta, store, _, counters = make_meta()
    publish(meta, store, intent(BASE[:300]))
    parent = intent(BASE[:1200], reason=3)
    token = meta.reserve_save(parent, owner=1)
    prompt = le(BASE[:1500])
    got = meta.resolve(NS.header(), prompt, owner=9, parent_key=parent.key, wait_s=0.5, handle="r")
    assert got is WAIT
    meta.check_reservation(parent.key, token)
    meta.announce_saved(parent.key, token, location="/disk/p.kvc")
    [(handle, answer)] = meta.take_ready()
    assert handle == "r"
    assert answer.resumed and answer.kind is HitKind.PREFIX
    assert answer.row.key == parent.key and answer.use_tokens == 1200
    assert counters.get("hits_resume") == 1


def test_resolve_falls_back_to_the_best_prefix_when_the_parent_never_lands() -> None:
    meta, store, clock, _ = make_meta()
    short = publish(meta, store, intent(BASE[:300]))
    parent = intent(BASE[:1200])
    meta.reserve_save(parent, owner=1)
    assert (
        meta.resolve(
            NS.header(), le(BASE[:1500]), owner=9, parent_key=parent.key, wait_s=0.5, handle="r"
        )
        is WAIT
    )
    clock.advance(1)
    meta.tick()
    [(_, answer)] = meta.take_ready()
    assert not answer.resumed and answer.row.key == short


def test_resolve_ignores_a_parent_key_that_is_not_a_prefix_of_the_prompt() -> None:
    meta, store, _, _ = make_meta()
    parent = publish(meta, store, intent([1, 2, 3] * 200))
    found = meta.resolve(NS.header(), le(BASE[:900]), owner=9, parent_key=parent)
    assert found.row is None


def test_resolve_with_a_published_parent_counts_an_exact_hit() -> None:
    meta, store, _, counters = make_meta()
    parent = publish(meta, store, intent(BASE[:1200]))
    found = meta.resolve(NS.header(), le(BASE[:1300]), owner=9, parent_key=parent, wait_s=0.5)
    assert found.row is not None and found.row.key == parent and not found.resumed
    assert counters.get("hits_exact") == 1


def test_exact_lookup_miss_is_counted() -> None:
    meta, _, _, counters = make_meta()
    assert meta.lookup_exact(intent(BASE[:5]).key) is None
    assert counters.get("misses") == 1


@pytest.mark.parametrize("policy", [LookupPolicy(allow_common=False), LookupPolicy()])
def test_an_index_entry_pointing_at_another_row_is_a_miss_not_that_row(
    policy: LookupPolicy,
) -> None:
    # Simulate an index fault: the 1000-token string is filed under the
    # 2500-token row's key. The chosen row's own tokens do not match the
    # prompt's covered span, so the lookup must not hand that row out.
    meta, keys = three_rows(policy)
    header = NS.header()
    meta.prefix._spaces[header].keys[le(BASE[:1000])] = keys[2500]
    found = meta.longest_prefix(header, le([*BASE[:1000], 1, 2, 3]), owner=5)
    assert found.row is None or found.row.key != keys[2500]
    assert found.row is None or found.use_tokens <= 300
    assert meta.pins_of(5) == (0 if found.row is None else 1)
