"""Saves in flight are visible to lookups (SPEC M18): a row still being written
that would serve a prompt better than every published row is reported with
the lookup's answer, and ``resolve`` may wait for it instead of answering
the worse row (or a miss) at once."""

from __future__ import annotations

import pytest

from llamad.cache.lookup import HitKind
from llamad.cache.waiters import WAIT
from meta_fakes import NS, OTHER_NS, intent, le, make_meta, publish

pytestmark = pytest.mark.timeout(30)

BASE = [(i * 7919) % 50_000 for i in range(3000)]


def test_a_lookup_reports_a_longer_row_still_being_written() -> None:
    meta, store, _, _ = make_meta()
    short = publish(meta, store, intent(BASE[:300]))
    longer = intent(BASE[:1200])
    token = meta.reserve_save(longer, owner=1)
    found = meta.longest_prefix(NS.header(), le(BASE[:1500]), owner=9)
    assert found.row is not None and found.row.key == short
    assert (found.inflight_key, found.inflight_tokens) == (longer.key, 1200)
    # A miss reports it as well, and so does a prompt inside the row in flight.
    assert meta.longest_prefix(NS.header(), le(BASE[:1000])).inflight_tokens == 1000
    # Published: it is the answer, and nothing is in flight any more.
    meta.check_reservation(longer.key, token)
    meta.announce_saved(longer.key, token, location="/disk/l.kvc")
    found = meta.longest_prefix(NS.header(), le(BASE[:1500]))
    assert found.row is not None and found.row.key == longer.key
    assert (found.inflight_key, found.inflight_tokens) == (None, 0)


def test_no_report_when_the_save_in_flight_serves_no_better() -> None:
    meta, store, _, _ = make_meta()
    publish(meta, store, intent(BASE[:1200]))
    meta.reserve_save(intent(BASE[:900]), owner=1)
    meta.reserve_save(intent(BASE[:1200], ns=OTHER_NS), owner=1)
    found = meta.longest_prefix(NS.header(), le(BASE[:1500]))
    assert found.use_tokens == 1200 and found.inflight_key is None


def test_a_cancelled_or_reaped_save_is_no_longer_reported() -> None:
    meta, _, clock, _ = make_meta(ttl=5.0)
    cancelled = intent(BASE[:1000])
    meta.cancel_reservation(cancelled.key, meta.reserve_save(cancelled, owner=1))
    assert meta.longest_prefix(NS.header(), le(BASE[:1500])).inflight_key is None
    meta.reserve_save(intent(BASE[:800]), owner=1)
    clock.advance(10)
    meta.tick()
    assert meta.longest_prefix(NS.header(), le(BASE[:1500])).inflight_key is None


def test_resolve_waits_for_a_better_row_in_flight_and_says_so() -> None:
    meta, store, _, counters = make_meta()
    publish(meta, store, intent(BASE[:300]))
    longer = intent(BASE[:1200])
    token = meta.reserve_save(longer, owner=1)
    got = meta.resolve(NS.header(), le(BASE[:1500]), owner=9, wait_s=0.5, handle="r")
    assert got is WAIT
    meta.check_reservation(longer.key, token)
    meta.announce_saved(longer.key, token, location="/disk/l.kvc")
    [(handle, answer)] = meta.take_ready()
    assert handle == "r" and answer.resumed and answer.kind is HitKind.PREFIX
    assert answer.row.key == longer.key and answer.use_tokens == 1200
    assert counters.get("hits_resume") == 1


def test_resolve_gives_the_published_row_when_the_wait_ends_first() -> None:
    meta, store, clock, _ = make_meta()
    short = publish(meta, store, intent(BASE[:300]))
    longer = intent(BASE[:1200])
    meta.reserve_save(longer, owner=1)
    assert meta.resolve(NS.header(), le(BASE[:1500]), owner=9, wait_s=0.5, handle="r") is WAIT
    clock.advance(1)
    meta.tick()
    [(_, answer)] = meta.take_ready()
    assert not answer.resumed and answer.row.key == short
    assert answer.inflight_key == longer.key


def test_resolve_does_not_wait_without_leave_or_for_nothing_better() -> None:
    meta, store, _, _ = make_meta()
    publish(meta, store, intent(BASE[:1200]))
    meta.reserve_save(intent(BASE[:2000]), owner=1)
    # No wait allowed: the answer comes at once and names the row in flight.
    now = meta.resolve(NS.header(), le(BASE[:2500]), owner=9, wait_s=0.0)
    assert now is not WAIT and now.use_tokens == 1200 and now.inflight_tokens == 2000
    # Nothing better in flight for this prompt: no wait either.
    assert meta.resolve(NS.header(), le(BASE[:1100]), owner=9, wait_s=0.5) is not WAIT
