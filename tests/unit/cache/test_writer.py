"""The writer pool (SPEC C6): async saves, the global cap, leak-proof permits."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache.counters import DictCounters
from llamad.cache.errors import InvalidCacheValue, SaveRefused, TierFull
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.meta import CacheMeta, MetaConfig
from llamad.cache.publish import LocalMeta, PublishOutcome, PublishStage
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import SEGMENTS, Tier, TierConfig, TierStore, build_tiers
from llamad.cache.writer import PermitSet, WriterPool
from llamad.testing import wait_until

pytestmark = pytest.mark.timeout(60)

NS = Namespace(fingerprint=b"\x61" * 32, quant=3, ctx_hash=b"\x71" * 32)
PAYLOAD = os.urandom(200_000)


def spec_for(tokens: list[int]) -> KvcSpec:
    return KvcSpec(NS, tokens_to_bytes(tokens), FingerprintMode.SAFE, SaveReason.CONTINUED)


def _hold_permits(path: str, n: int, ready: mp.synchronize.Event) -> None:
    permits = PermitSet.attach(path)
    held = [permits.try_acquire() for _ in range(n)]
    assert all(p is not None for p in held)
    ready.set()
    signal.pause()


class Rig:
    def __init__(self, root: Path, permits: int = 2, **pool_kwargs: object) -> None:
        self.tier = Tier(TierConfig(TierKind.DISK, root / "disk", 1 << 30))
        self.tier.prepare()
        self.counters = DictCounters()
        self.meta = CacheMeta(
            MetaConfig(quotas={TierKind.DISK: 1 << 30}),
            TierStore(build_tiers([self.tier.config])),
            counters=self.counters,
        )
        self.permits = PermitSet.create(root / "permits", permits)
        writer = LocalMeta(self.meta)
        self.pool = WriterPool(
            lambda: writer,
            {TierKind.DISK: self.tier},
            self.permits,
            counters=self.counters,
            **pool_kwargs,  # type: ignore[arg-type]
        )


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    yield r
    r.pool.close()


def test_async_save_returns_before_the_write_and_publishes(tmp_path: Path) -> None:
    gate = threading.Event()

    def hold_after_write(stage: PublishStage, key: bytes) -> None:
        if stage is PublishStage.WRITTEN:
            assert gate.wait(20)

    rig = Rig(tmp_path, on_stage=hold_after_write)
    spec = spec_for([1, 2, 3])
    future = rig.pool.save_async(spec, TierKind.DISK, PAYLOAD)
    assert future is not None
    assert not future.done()  # the caller's loop is free while the writer works
    assert rig.pool.in_flight() == 1
    gate.set()
    assert future.result(20).outcome is PublishOutcome.PUBLISHED
    assert rig.meta.lookup_exact(spec.key) is not None
    wait_until(lambda: rig.pool.in_flight() == 0, "the pool idle", 20)
    assert rig.permits.held() == 0
    rig.pool.close()


def test_quiet_epoch_is_none_while_a_save_runs_and_moves_past_it(tmp_path: Path) -> None:
    """What the thread governor reads around a decode step: equal readings
    only when no save ran in between, the mapping after the publish included."""
    gate = threading.Event()
    warmed = threading.Event()

    def hold_after_write(stage: PublishStage, key: bytes) -> None:
        if stage is PublishStage.WRITTEN:
            assert gate.wait(20)

    rig = Rig(tmp_path, on_stage=hold_after_write)
    try:
        before = rig.pool.quiet_epoch()
        assert before is not None
        assert rig.pool.quiet_epoch() == before  # nothing ran: equal
        real_warm = rig.tier.warm

        def slow_warm(location: object) -> bool:
            assert rig.pool.quiet_epoch() is None  # still the save's work
            warmed.set()
            return real_warm(location)  # type: ignore[arg-type]

        rig.tier.warm = slow_warm  # type: ignore[method-assign]
        future = rig.pool.save_async(spec_for([7, 8]), TierKind.DISK, PAYLOAD)
        assert future is not None
        wait_until(lambda: rig.pool.quiet_epoch() is None, "the save running", 20)
        gate.set()
        future.result(20)
        assert warmed.is_set()
        wait_until(lambda: rig.pool.quiet_epoch() is not None, "the save ended", 20)
        after = rig.pool.quiet_epoch()
        assert after is not None and after != before
    finally:
        rig.pool.close()


def test_save_without_a_free_permit_is_dropped_and_counted(rig: Rig) -> None:
    held = [rig.permits.try_acquire(), rig.permits.try_acquire()]
    assert rig.permits.try_acquire() is None
    spec = spec_for([1])
    assert rig.pool.save_async(spec, TierKind.DISK, PAYLOAD) is None
    assert rig.counters.get("saves_dropped") == 1
    assert rig.meta.reservations == {}
    assert list(rig.tier.root.iterdir()) == []
    for p in held:
        assert p is not None
        p.release()
    future = rig.pool.save_async(spec, TierKind.DISK, PAYLOAD)
    assert future is not None
    assert future.result(20).stored


def test_permits_held_by_a_killed_process_are_returned(tmp_path: Path) -> None:
    permits = PermitSet.create(tmp_path / "permits", 3)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    child = ctx.Process(target=_hold_permits, args=(str(permits.path), 3, ready))
    child.start()
    try:
        assert ready.wait(30)
        assert permits.held() == 3
        assert permits.try_acquire() is None
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(30)
        wait_until(lambda: permits.held() == 0, "every permit back", 20)
        permit = permits.try_acquire()
        assert permit is not None
        permit.release()
    finally:
        if child.is_alive():
            child.kill()
            child.join(30)


def test_creating_the_permits_again_keeps_the_held_ones(tmp_path: Path) -> None:
    permits = PermitSet.create(tmp_path / "permits", 2)
    held = permits.try_acquire()
    assert held is not None
    # What a restarted cache-meta does while a writer holds a permit.
    again = PermitSet.create(tmp_path / "permits", 2)
    assert again.held() == 1
    other = again.try_acquire()
    assert other is not None and other.slot != held.slot
    assert again.try_acquire() is None
    held.release()
    other.release()
    assert PermitSet.attach(tmp_path / "permits").held() == 0


def test_global_cap_holds_across_pools(rig: Rig) -> None:
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def park(stage: PublishStage, key: bytes) -> None:
        if stage is PublishStage.RESERVED:
            entered.release()
            assert gate.wait(20)

    other_meta = LocalMeta(rig.meta, owner=4242)
    other = WriterPool(
        lambda: other_meta,
        {TierKind.DISK: rig.tier},
        PermitSet.attach(rig.permits.path),
        counters=rig.counters,
        threads=4,
        on_stage=park,
    )
    futures = [other.save_async(spec_for([i]), TierKind.DISK, PAYLOAD) for i in range(4)]
    assert [f is not None for f in futures] == [True, True, False, False]
    assert entered.acquire(timeout=20) and entered.acquire(timeout=20)
    assert rig.pool.save_async(spec_for([99]), TierKind.DISK, PAYLOAD) is None
    assert rig.counters.get("saves_dropped") == 3
    gate.set()
    for f in futures:
        if f is not None:
            assert f.result(20).stored
    other.close()


def test_sync_save_waits_for_a_permit_then_publishes(rig: Rig) -> None:
    held = [rig.permits.try_acquire(), rig.permits.try_acquire()]
    releasing = threading.Event()

    def release_later() -> None:
        time.sleep(0.2)
        releasing.set()
        for p in held:
            assert p is not None
            p.release()

    t = threading.Thread(target=release_later)
    t.start()
    result = rig.pool.save_sync(spec_for([7]), TierKind.DISK, PAYLOAD, timeout_s=20)
    # It can only have published once a permit was given back.
    assert releasing.is_set()
    t.join(20)
    assert result.outcome is PublishOutcome.PUBLISHED


def test_sync_save_times_out_as_refused(rig: Rig) -> None:
    held = [rig.permits.try_acquire(), rig.permits.try_acquire()]
    with pytest.raises(SaveRefused):
        rig.pool.save_sync(spec_for([7]), TierKind.DISK, PAYLOAD, timeout_s=0.05)
    assert rig.counters.get("saves_dropped") == 1
    for p in held:
        assert p is not None
        p.release()


def test_a_failing_save_returns_its_permit_and_reservation(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    future = rig.pool.save_async(spec_for([1]), TierKind.DISK, PAYLOAD)
    assert future is not None
    with pytest.raises(TierFull):
        future.result(20)
    wait_until(lambda: rig.pool.in_flight() == 0, "the pool idle", 20)
    assert rig.permits.held() == 0
    assert rig.meta.reservations == {}
    assert rig.counters.get("saves_dropped") == 1


def test_close_without_waiting_returns_queued_permits(tmp_path: Path) -> None:
    gate = threading.Event()

    def park(stage: PublishStage, key: bytes) -> None:
        if stage is PublishStage.RESERVED:
            assert gate.wait(20)

    rig = Rig(tmp_path, permits=4, threads=1, on_stage=park)
    futures = [rig.pool.save_async(spec_for([i]), TierKind.DISK, PAYLOAD) for i in range(3)]
    assert all(f is not None for f in futures)
    rig.pool.close(wait=False)
    gate.set()
    for f in futures:
        assert f is not None
        wait_until(f.done, "the save done", 20)
    wait_until(lambda: rig.permits.held() == 0, "every permit back", 20)
    assert rig.pool.in_flight() == 0
    assert rig.pool.save_async(spec_for([9]), TierKind.DISK, PAYLOAD) is None


def test_each_writer_thread_gets_its_own_connection_closed_with_the_pool(
    tmp_path: Path,
) -> None:
    class Conn(LocalMeta):
        closed = False

        def close(self) -> None:
            self.closed = True

    rig = Rig(tmp_path, permits=4)
    made: list[Conn] = []
    lock = threading.Lock()

    def connect() -> Conn:
        conn = Conn(rig.meta)
        with lock:
            made.append(conn)
        return conn

    both = threading.Barrier(2)

    def park(stage: PublishStage, key: bytes) -> None:
        if stage is PublishStage.RESERVED:
            both.wait(20)  # two saves in two threads at once

    pool = WriterPool(connect, {TierKind.DISK: rig.tier}, rig.permits, threads=2, on_stage=park)
    futures = [pool.save_async(spec_for([i]), TierKind.DISK, PAYLOAD) for i in range(2)]
    for f in futures:
        assert f is not None
        assert f.result(20).stored
    assert len(made) == 2
    assert not any(c.closed for c in made)
    pool.close()
    assert all(c.closed for c in made)
    rig.pool.close()


def test_bad_arguments_are_typed_errors_that_hold_nothing(rig: Rig, tmp_path: Path) -> None:
    with pytest.raises(InvalidCacheValue):
        rig.pool.save_async(spec_for([1]), "tape", PAYLOAD)
    with pytest.raises(InvalidCacheValue):
        rig.pool.save_sync(spec_for([1]), "tape", PAYLOAD, timeout_s=1)
    assert rig.permits.held() == 0
    assert rig.pool.in_flight() == 0
    with pytest.raises(InvalidCacheValue):
        PermitSet.create(tmp_path / "p2", 0)
    with pytest.raises(InvalidCacheValue):
        PermitSet.attach(tmp_path / "absent")
    with pytest.raises(InvalidCacheValue):
        WriterPool(lambda: LocalMeta(rig.meta), {}, rig.permits, threads=0)


def test_a_ram_save_is_mapped_for_the_next_restore(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    ram = Tier(TierConfig(TierKind.RAM, Path("/dev/shm"), 1 << 30, f"w{uuid.uuid4().hex[:12]}"))
    pool = WriterPool(
        lambda: LocalMeta(
            CacheMeta(
                MetaConfig(quotas={TierKind.RAM: 1 << 30}), TierStore(build_tiers([ram.config]))
            )
        ),
        {TierKind.RAM: ram},
        rig.permits,
    )
    try:
        spec = spec_for([4, 2])
        future = pool.save_async(spec, TierKind.RAM, PAYLOAD)
        assert future is not None and future.result(20).stored
        assert ram.path_for(spec.key) in SEGMENTS
    finally:
        pool.close()
        rig.pool.close()
        ram.purge()
