"""ClientCacheView against a real cache-meta process and real tier files (SPEC M3, M5, M17).

The worker core runs on the stub backend (its packed states are small byte
strings), so these need no model: what is real is everything on the cache's
side of the door: cache-meta, the pins, the ``ram`` segments and ``disk``
files, the writer pool's threads and the daemon-wide permits.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

from cache_view_support import (
    DIGEST,
    FakeAdapter,
    FakeContext,
    Meta,
    make_driver,
    prompt,
    settle_saves,
    stub_config,
)
from llamad.cache.activity import CopyActivity
from llamad.cache.client import CacheClient
from llamad.cache.kvc import SaveReason
from llamad.cache.lookup import LookupPolicy
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.writer import Permit
from llamad.errors import ConfigError
from llamad.llama_ffi.errors import Closed
from llamad.model import identity
from llamad.model.client_cache_view import ClientCacheView
from llamad.model.results import CacheHitKind
from llamad.model.save_completions import Completed
from llamad.model.savepoints import SaveJob
from llamad.model.stub import StubPacked
from llamad.testing import discard_scratch, scratch_settings, wait_until

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def settings() -> Iterator[CacheSettings]:
    # Restore-and-truncate from 8 common tokens on, so short stub prompts hit
    # the longer finish rows (prompt + reply) the way long real prompts do.
    s = scratch_settings(
        prefix="lcv", stats_flush_s=0.5, save_permits=8, lookup=LookupPolicy(common_min_tokens=8)
    )
    try:
        yield s
    finally:
        discard_scratch(s)


@pytest.fixture(scope="module")
def meta(settings: CacheSettings) -> Iterator[Meta]:
    m = Meta(settings)
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture
def admin(settings: CacheSettings, meta: Meta) -> Iterator[CacheClient]:
    with CacheClient.from_settings(settings, client_name="test-admin") as client:
        yield client


def new_view(
    settings: CacheSettings, ctx: FakeContext | None = None, **config: object
) -> ClientCacheView:
    return ClientCacheView.from_settings(
        settings, ctx or FakeContext(), config=stub_config(**config)
    )


@pytest.fixture
def view(settings: CacheSettings, meta: Meta) -> Iterator[ClientCacheView]:
    v = new_view(settings)
    try:
        yield v
    finally:
        v.close()


def held_permits(settings: CacheSettings) -> list[Permit]:
    permits = settings.attach_permits()
    held = []
    while (p := permits.try_acquire()) is not None:
        held.append(p)
    return held


def job(view: ClientCacheView, tokens: list[int], reason: SaveReason, **kw: object) -> SaveJob:
    ns = view.namespace(None)
    return SaveJob(reason, ns.key(tokens), ns, tuple(tokens), seq=0, **kw)  # type: ignore[arg-type]


def packed(tokens: list[int]) -> StubPacked:
    return StubPacked(b"STUBKV1\x00" + b"".join(t.to_bytes(4, "little") for t in tokens))


# -- through the core -------------------------------------------------------------------


def test_cold_then_exact_hit_through_the_real_cache_reads_ram_in_place(
    view: ClientCacheView, admin: CacheClient
) -> None:
    drv = make_driver(view)
    tokens = prompt(40, start=3)
    cold = drv.complete("cold", tokens, max_tokens=6)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert cold.finish_key is not None
    assert (cold.finish_key, True) in drv.saved  # the finish save, reported back
    row = admin.lookup_exact(cold.finish_key, pin=False)
    assert row is not None and row.tier is TierKind.RAM

    unpacks = drv.backend.unpacks
    warm = drv.complete("warm", tokens, max_tokens=6)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.reply == cold.reply and warm.generated == cold.generated
    assert drv.backend.unpacks == unpacks + 1
    assert view.stats.reads_mapped == 1 and view.stats.reads_copied == 0
    # The restore's pin was checked in (a cast: it lands a moment later).
    wait_until(lambda: admin.status()["pins"] == 0, "the restore's checkin", 10)


def test_a_parent_key_turn_restores_the_previous_turns_finish_row(view: ClientCacheView) -> None:
    drv = make_driver(view)
    first = drv.complete("t1", prompt(24, start=5), max_tokens=4)
    assert first.finish_key is not None
    turn2 = list(first.context_tokens[: first.committed_tokens]) + prompt(12, start=9)
    second = drv.complete("t2", turn2, max_tokens=4, parent_key=first.finish_key)
    assert second.cache_hit_kind is CacheHitKind.PARTIAL
    assert second.cache_delta.read == first.committed_tokens


# -- saves ------------------------------------------------------------------------------


def test_async_save_completions_wake_the_fd_and_each_key_drains_once(
    view: ClientCacheView, admin: CacheClient
) -> None:
    jobs = [job(view, prompt(16, start=30 + i), SaveReason.FINISH) for i in range(6)]
    states = [packed(list(j.tokens)) for j in jobs]
    for j, s in zip(jobs, states, strict=True):
        assert view.save(j, s) is True
    fd = view.completions.fileno()
    assert select.select([fd], [], [], 20)[0] == [fd]
    drained = settle_saves(view)
    assert sorted(drained) == sorted((j.key, True) for j in jobs)
    assert all(s.released for s in states)
    for j in jobs:
        assert admin.lookup_exact(j.key, pin=False) is not None
    assert not select.select([fd], [], [], 0)[0]


def test_a_state_is_released_only_once_its_completion_is_drained(view: ClientCacheView) -> None:
    j = job(view, prompt(16, start=70), SaveReason.COLD)
    state = packed(list(j.tokens))
    assert view.save(j, state)
    wait_until(
        lambda: view.in_flight() == 0 and view.completions.pending() == 1,
        "the save posted, not drained",
        20,
    )
    assert not state.released  # the writer thread never releases: the loop does
    assert view.completions.drain() == [(j.key, True)]
    assert state.released


def test_a_save_stays_in_flight_until_its_completion_is_posted(
    view: ClientCacheView, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The writer's thread is done with a save before its done callback posts
    # the completion; in between, "none in flight, none pending" would read as
    # "all drained" and lose that save's completion (seen in a full CI run).
    gate = threading.Event()
    real_post = view.completions.post

    def slow_post(done: Completed) -> None:
        assert gate.wait(30)
        real_post(done)

    monkeypatch.setattr(view.completions, "post", slow_post)
    j = job(view, prompt(16, start=75), SaveReason.FINISH)
    assert view.save(j, packed(list(j.tokens)))
    wait_until(lambda: view._writer.in_flight() == 0, "the write", 20)  # not yet posted
    assert view.in_flight() == 1 and view.completions.pending() == 0
    gate.set()
    wait_until(lambda: view.in_flight() == 0, "the save posted", 20)
    assert view.completions.pending() == 1
    assert view.completions.drain() == [(j.key, True)]


def test_quiet_epoch_sees_this_workers_saves_and_cache_metas_copies(
    settings: CacheSettings, view: ClientCacheView
) -> None:
    """The thread governor's own_work: None while the writer pool saves or
    while cache-meta (which created the board the view attached) copies a row."""
    before = view.quiet_epoch()
    assert before is not None and view.quiet_epoch() == before
    # cache-meta's copy lane, as a second handle on the board it made.
    lane = CopyActivity.create(settings.copies_file())
    try:
        lane.begin()
        assert view.quiet_epoch() is None
        lane.end()
        after_copy = view.quiet_epoch()
        assert after_copy is not None and after_copy != before
    finally:
        lane.close()
    # The save held in its last part (mapping the row it wrote), whichever
    # tier cache-meta chose.
    gate, held = threading.Event(), threading.Event()
    for tier in view._writer.tiers.values():

        def held_warm(location: object, real: Any = tier.warm) -> bool:
            held.set()
            assert gate.wait(20)
            return bool(real(location))

        tier.warm = held_warm  # type: ignore[method-assign,assignment]
    try:
        tokens = prompt(40, start=9100)
        assert view.save(job(view, tokens, SaveReason.COLD), packed(tokens))
        assert held.wait(20), "the save never reached its mapping"
        assert view.quiet_epoch() is None
    finally:
        gate.set()
    wait_until(lambda: view.quiet_epoch() is not None, "the save ended", 20)
    assert view.quiet_epoch() != after_copy


def test_an_already_cached_row_counts_as_written(view: ClientCacheView) -> None:
    j = job(view, prompt(16, start=80), SaveReason.FINISH)
    assert view.save(j, packed(list(j.tokens)))
    assert settle_saves(view) == [(j.key, True)]
    again = packed(list(j.tokens))
    assert view.save(j, again)
    assert settle_saves(view) == [(j.key, True)]
    assert again.released
    assert view.save(
        job(view, list(j.tokens), SaveReason.EVICT, deadline=time.monotonic() + 5),
        packed(list(j.tokens)),
    )


def test_a_refused_async_save_releases_its_state_at_once(
    view: ClientCacheView, settings: CacheSettings, admin: CacheClient
) -> None:
    held = held_permits(settings)
    try:
        dropped = admin.counters()["saves_dropped"]
        j = job(view, prompt(16, start=90), SaveReason.CONTINUED)
        state = packed(list(j.tokens))
        assert view.save(j, state) is False
        assert state.released
        assert view.completions.pending() == 0 and view.in_flight() == 0
        assert view.stats.saves_refused == 1
        assert admin.counters()["saves_dropped"] == dropped + 1
    finally:
        for p in held:
            p.release()


def test_a_sync_evict_save_writes_before_it_returns(
    view: ClientCacheView, admin: CacheClient
) -> None:
    j = job(view, prompt(16, start=100), SaveReason.EVICT, deadline=time.monotonic() + 10)
    state = packed(list(j.tokens))
    assert view.save(j, state) is True
    assert state.released
    assert admin.lookup_exact(j.key, pin=False) is not None
    assert view.completions.pending() == 0  # the core hears nothing more of it


def test_a_sync_evict_save_gives_up_at_its_deadline_and_releases_its_state(
    view: ClientCacheView, settings: CacheSettings, admin: CacheClient
) -> None:
    held = held_permits(settings)
    try:
        j = job(view, prompt(16, start=110), SaveReason.EVICT, deadline=time.monotonic() + 0.4)
        state = packed(list(j.tokens))
        started = time.monotonic()
        assert view.save(j, state) is False
        took = time.monotonic() - started
        assert 0.3 <= took < 2.0, took
        wait_until(lambda: view.completions.drain() == [] and state.released, "release", 10)
        assert view.completions.pending() == 0
        past = job(view, prompt(16, start=111), SaveReason.SHUTDOWN, deadline=time.monotonic())
        late = packed(list(past.tokens))
        assert view.save(past, late) is False and late.released
    finally:
        for p in held:
            p.release()
    assert admin.lookup_exact(j.key, pin=False) is None


# -- namespaces, salts, tiers -------------------------------------------------------------


@pytest.mark.parametrize("tier", [TierKind.RAM, TierKind.DISK])
def test_cache_salts_and_no_salt_never_share_rows_on_any_tier(
    settings: CacheSettings, meta: Meta, admin: CacheClient, tier: TierKind
) -> None:
    view = new_view(settings, save_tier=tier)
    try:
        drv = make_driver(view)
        tokens = prompt(32, start=120 + len(tier.value))
        a = drv.complete("a1", tokens, max_tokens=4, cache_salt="tenant-a")
        assert a.cache_hit_kind is CacheHitKind.COLD
        b = drv.complete("b1", tokens, max_tokens=4, cache_salt="tenant-b")
        shared = drv.complete("n1", tokens, max_tokens=4)
        assert b.cache_hit_kind is shared.cache_hit_kind is CacheHitKind.COLD
        # Not even a common prefix is visible across tenants.
        assert b.cache_miss is not None and b.cache_miss.nearest_key is None
        again = drv.complete("a2", tokens, max_tokens=4, cache_salt="tenant-a")
        assert again.cache_hit_kind is CacheHitKind.EXACT
        keys = {a.finish_key, b.finish_key, shared.finish_key}
        assert len(keys) == 3
        rows = {r["key"]: r for r in admin.dump() if r.get("key") in {k.hex() for k in keys}}
        assert {r["tier"] for r in rows.values()} == {tier.value}
        assert len(rows) == 3
        salted = view.namespace(b"tenant-a")
        assert salted == identity.salted(view.namespace(None), b"tenant-a")
    finally:
        view.close()


def test_the_namespace_is_computed_once_per_adapter_set(
    settings: CacheSettings, meta: Meta, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    real = identity.namespace

    def counting(*args: object, **kw: object):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(identity, "namespace", counting)
    ctx = FakeContext()
    view = new_view(settings, ctx)
    try:
        plain = {view.namespace(None) for _ in range(50)}
        assert len(plain) == 1 and len(calls) == 1
        ctx.adapters = ((FakeAdapter(b"\x01" * 32), 1.0),)
        with_lora = view.namespace(None)
        assert with_lora != plain.pop() and len(calls) == 2
        assert view.namespace(b"s").fingerprint != with_lora.fingerprint
        assert len(calls) == 2
        ctx.adapters = ((FakeAdapter(b"\x01" * 32), 0.5),)
        assert view.namespace(None) != with_lora and len(calls) == 3
        assert view.namespace(None).quant == 3
        assert real(ctx, "fast_unsafe", supplied=DIGEST) == view.namespace(None)
    finally:
        view.close()


def test_a_row_in_a_tier_this_model_does_not_restore_from_is_a_miss_and_unpinned(
    settings: CacheSettings, meta: Meta, admin: CacheClient
) -> None:
    writer = new_view(settings, save_tier=TierKind.DISK)
    reader = new_view(settings, restore_tiers=[TierKind.RAM])
    try:
        tokens = prompt(20, start=140)
        j = job(writer, tokens, SaveReason.FINISH)
        assert writer.save(j, packed(tokens))
        assert settle_saves(writer) == [(j.key, True)]
        found = reader.resolve(reader.namespace(None), tokens, parent_key=None, wait_s=0)
        assert found.row is None and found.use_tokens == 0
        assert found.common_tokens == len(tokens)  # the miss explanation still sees it
        assert admin.status()["pins"] == 0
        hit = writer.resolve(writer.namespace(None), tokens, parent_key=None, wait_s=0)
        assert hit.row is not None and hit.row.tier is TierKind.DISK
        with writer.read(hit.row) as got:
            assert got is not None and bytes(got.payload) == bytes(packed(tokens).data)
            assert got.logits is None  # this save kept none
        writer.checkin(hit.row.pin)
        assert writer.stats.reads_copied == 1
        wait_until(lambda: admin.status()["pins"] == 0, "the checkin", 10)
    finally:
        writer.close()
        reader.close()


def test_a_view_refuses_a_save_tier_the_cache_lacks(settings: CacheSettings, meta: Meta) -> None:
    ram_only = msgspec.structs.replace(
        settings, tiers=tuple(t for t in settings.tiers if t.kind is TierKind.RAM)
    )
    with pytest.raises(ConfigError) as err:
        new_view(ram_only, save_tier=TierKind.DISK)
    assert err.value.details["field"] == "save_tier"


def test_a_view_whose_context_has_no_namespace_refuses_to_start_and_leaks_nothing(
    settings: CacheSettings, meta: Meta
) -> None:
    ctx = FakeContext()
    ctx.closed = True
    new_view(settings).close()  # warm up: imports, the fingerprint cache
    fds = set(os.listdir("/proc/self/fd"))
    threads = threading.active_count()
    with pytest.raises(Closed):
        new_view(settings, ctx)
    assert set(os.listdir("/proc/self/fd")) <= fds  # no eventfd, socket or counters fd left
    assert threading.active_count() == threads


def test_a_new_view_is_connected_and_can_map_rows_before_its_first_request(
    settings: CacheSettings, meta: Meta, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first repeat after a restart paid the handshake with cache-meta in
    # its lookup (~1.5 ms) and cffi's madvise handle at its first mapping
    # (~11 ms): a starting view pays both (issue 21, SPEC P2).
    import llamad.model.client_cache_view as ccv  # noqa: PLC0415

    prepared: list[bool] = []
    monkeypatch.setattr(ccv, "prepare_populate", lambda: prepared.append(True) or True)
    v = new_view(settings)
    try:
        assert TierKind.RAM in v.restore_tiers
        assert prepared == [True]
        assert v._client._client.connected  # no lookup made yet
    finally:
        v.close()
    # A model that restores from no ram tier maps nothing: no handle built.
    prepared.clear()
    v = new_view(settings, restore_tiers=frozenset({TierKind.DISK}))
    try:
        assert prepared == []
    finally:
        v.close()
