"""The tier hierarchy through a real cache-meta process (SPEC C12).

Rows are saved with no tier named (cache-meta chooses), demoted by quota,
written behind to disk, demoted at a clean stop, rescued by the daemon's
purge of ``ram``, linked back into ``ram`` at the next start, and promoted
when hot; the files are real: ``ram`` and ``ram_file`` share ``/dev/shm``
(demotions and promotions between them are links), ``disk`` is under
``/tmp``. The mover is asynchronous: a test waits
for the counter of the move it is about (polled with a deadline).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Iterator

import msgspec
import pytest

from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.lookup import RowRef
from llamad.cache.publish import PublishOutcome, publish
from llamad.cache.ram_purge import purge_ram
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.testing import MetaProcess, discard_scratch, scratch_settings

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\x3a" * 32, quant=3, ctx_hash=b"\x4b" * 32)
RAM, RAM_FILE, DISK = TierKind.RAM, TierKind.RAM_FILE, TierKind.DISK
ROW_BYTES = 40_000  # the payload; the file is a few KiB more


def payload(seed: int) -> bytes:
    return bytes((i * 7 + seed) % 251 for i in range(ROW_BYTES))


def spec(seed: int) -> KvcSpec:
    return KvcSpec(
        NS, tokens_to_bytes([seed, *range(200)]), FingerprintMode.SAFE, SaveReason.FINISH
    )


def tiers_of(settings: CacheSettings) -> dict[TierKind, Tier]:
    return {cfg.kind: Tier(cfg) for cfg in settings.tiers}


def save(cache: CacheClient, settings: CacheSettings, seed: int) -> tuple[bytes, TierKind]:
    """Save with no tier named; the key and the tier cache-meta chose."""
    done = publish(cache, tiers_of(settings), spec(seed), payload(seed))
    assert done.outcome is PublishOutcome.PUBLISHED and done.tier is not None
    return done.key, done.tier


def copies(cache: CacheClient, key: bytes) -> set[TierKind]:
    rows = [r for r in cache.dump() if r.get("key") == key.hex() and r["status"] == "available"]
    return {TierKind(c["tier"]) for c in rows[0]["copies"]} if rows else set()


def wait_for(what: str, check: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def loads(cache: CacheClient, ref: RowRef | None, seed: int) -> bool:
    assert ref is not None
    buf = bytearray(ref.file_size)
    with cache.pinned(ref):
        n = cache.load_into(ref, buf)
    return n is not None and bytes(buf[:n]) == payload(seed)


@pytest.fixture
def settings() -> Iterator[CacheSettings]:
    made = scratch_settings(prefix="lct", stats_flush_s=0.5)
    try:
        yield made
    finally:
        discard_scratch(made)


def sized(settings: CacheSettings, **quotas: int) -> CacheSettings:
    tiers = tuple(
        dataclasses.replace(t, quota=quotas.get(t.kind.value, t.quota)) for t in settings.tiers
    )
    return msgspec.structs.replace(settings, tiers=tiers)


def test_quota_eviction_demotes_ram_to_ram_file_by_a_link(settings: CacheSettings) -> None:
    settings = sized(msgspec.structs.replace(settings, write_behind=False), ram=60_000)
    with MetaProcess(settings), CacheClient.from_settings(settings) as cache:
        first, tier = save(cache, settings, 1)
        assert tier is RAM
        ram_inode = tiers_of(settings)[RAM].path_for(first).stat().st_ino
        second, tier = save(cache, settings, 2)
        assert tier is RAM  # ram made room: its older row went down a tier
        wait_for("the demotion", lambda: cache.counters()["demotions"] == 1)
        counters = cache.counters()
        assert counters["moves_linked"] == 1 and counters["evictions"] == 0
        assert copies(cache, first) == {RAM_FILE} and copies(cache, second) == {RAM}
        # A link: the ram_file file is the very inode the segment was, and the
        # segment's name is gone.
        assert tiers_of(settings)[RAM_FILE].path_for(first).stat().st_ino == ram_inode
        assert not tiers_of(settings)[RAM].path_for(first).exists()
        found = cache.lookup_exact(first)
        assert found is not None and found.tier is RAM_FILE and loads(cache, found, 1)
        status = cache.status()["tiers"]
        assert status["ram"]["used"] <= 60_000 and status["ram"]["leaving"] == 0


def test_rows_survive_a_clean_stop_the_ram_purge_and_the_loss_of_ram_file(
    settings: CacheSettings,
) -> None:
    with MetaProcess(settings) as proc, CacheClient.from_settings(settings) as cache:
        keys = [save(cache, settings, seed)[0] for seed in (1, 2, 3)]
        assert all(copies(cache, k) == {RAM} or copies(cache, k) == {RAM, DISK} for k in keys)
        assert proc.stop() == 0
    # The clean stop demoted every ram row to ram_file (links: the segments'
    # names went, their inodes live on) and finished the disk copies written
    # behind them.
    t = tiers_of(settings)
    for key in keys:
        assert t[RAM_FILE].path_for(key).exists() and not t[RAM].path_for(key).exists()
        assert t[DISK].path_for(key).exists()
    assert purge_ram(settings) == 0  # the daemon's stop: nothing left to purge
    with MetaProcess(settings), CacheClient.from_settings(settings) as cache:
        # The start links them back into ram (the mover is asynchronous).
        wait_for("the rows back in ram", lambda: cache.counters()["promotions"] == 3)
        for seed, key in zip((1, 2, 3), keys, strict=True):
            assert copies(cache, key) == {RAM, RAM_FILE, DISK}
            assert t[RAM].path_for(key).stat().st_ino == t[RAM_FILE].path_for(key).stat().st_ino
            found = cache.lookup_exact(key)
            assert found is not None and found.tier is RAM and loads(cache, found, seed)
            from_file = cache.lookup_exact(key, tiers={RAM_FILE})
            assert from_file is not None and loads(cache, from_file, seed)
    # A reboot: ram_file is gone with the tmpfs; disk serves.
    shutil.rmtree(t[RAM_FILE].root)
    with MetaProcess(settings), CacheClient.from_settings(settings) as cache:
        for seed, key in zip((1, 2, 3), keys, strict=True):
            found = cache.lookup_exact(key, pin=True, tiers={RAM_FILE, DISK})
            assert found is not None and found.tier is DISK and loads(cache, found, seed)


def test_the_ram_purge_after_a_crash_links_the_rows_into_ram_file(
    settings: CacheSettings,
) -> None:
    settings = msgspec.structs.replace(settings, write_behind=False)
    proc = MetaProcess(settings).start()
    try:
        with CacheClient.from_settings(settings) as cache:
            key, tier = save(cache, settings, 5)
            assert tier is RAM
        os.kill(proc.pid, 9)  # no clean stop: nothing was demoted
        assert proc.proc is not None and proc.proc.wait(30) == -9
    finally:
        proc.stop()
    t = tiers_of(settings)
    assert not t[RAM_FILE].path_for(key).exists()
    assert purge_ram(settings) == 1  # the next daemon's start
    assert t[RAM_FILE].path_for(key).exists() and not t[RAM].path_for(key).exists()
    with MetaProcess(settings), CacheClient.from_settings(settings) as cache:
        found = cache.lookup_exact(key, tiers={RAM_FILE})
        assert found is not None and found.tier is RAM_FILE and loads(cache, found, 5)
        wait_for("the row back in ram", lambda: copies(cache, key) == {RAM, RAM_FILE})
        found = cache.lookup_exact(key)
        assert found is not None and found.tier is RAM and loads(cache, found, 5)


def test_lookups_answer_the_callers_tiers_and_forget_drops_one_copy(
    settings: CacheSettings,
) -> None:
    with MetaProcess(settings), CacheClient.from_settings(settings) as cache:
        key, _ = save(cache, settings, 7)
        wait_for("the disk copy", lambda: copies(cache, key) == {RAM, DISK})
        assert cache.counters()["write_behind_copies"] == 1
        prompt = [7, *range(200)]
        assert cache.resolve(NS, prompt).row.tier is RAM  # type: ignore[union-attr]
        from_disk = cache.resolve(NS, prompt, tiers={DISK})
        assert from_disk.row is not None and from_disk.row.tier is DISK
        assert loads(cache, from_disk.row, 7)
        assert cache.resolve(NS, prompt, tiers={RAM_FILE}).row is None
        # A loader that found the ram copy gone drops that copy only.
        tiers_of(settings)[RAM].delete(key)
        ram = cache.lookup_exact(key)
        assert ram is not None and ram.tier is RAM
        assert cache.load_into(ram, bytearray(ram.file_size)) is None
        cache.checkin(ram.pin)
        assert copies(cache, key) == {DISK}
        found = cache.lookup_exact(key)
        assert found is not None and found.tier is DISK and loads(cache, found, 7)


def test_a_hot_row_in_ram_file_is_promoted_into_ram_by_a_link(settings: CacheSettings) -> None:
    settings = msgspec.structs.replace(settings, write_behind=False, promote_hits=2)
    t = tiers_of(settings)
    t[RAM_FILE].prepare()
    # A row a previous run left in ram_file.
    row = spec(9)
    with MetaProcess(settings), CacheClient.from_settings(settings) as cache:
        # Saved into ram_file while this cache-meta runs (a row found there at
        # its start would be linked back into ram at once).
        assert publish(cache, t[RAM_FILE], row, payload(9)).stored
        # A reader that may not restore from ram is never promoted into it.
        for _ in range(3):
            ref = cache.lookup_exact(row.key, pin=False, tiers={RAM_FILE, DISK})
            assert ref is not None and ref.tier is RAM_FILE
        assert cache.status()["moves"]["in_flight"] == 0
        assert cache.counters()["promotions"] == 0
        assert copies(cache, row.key) == {RAM_FILE}
        # Hot (promote_hits 2) and read by a reader of every tier: served from
        # ram_file, promoted behind.
        first = cache.lookup_exact(row.key, pin=False)
        assert first is not None and first.tier is RAM_FILE
        wait_for("the promotion", lambda: cache.counters()["promotions"] == 1)
        found = cache.lookup_exact(row.key)
        assert found is not None and found.tier is RAM and loads(cache, found, 9)
        assert t[RAM].path_for(row.key).stat().st_ino == t[RAM_FILE].path_for(row.key).stat().st_ino
        assert copies(cache, row.key) == {RAM, RAM_FILE}


def test_an_auto_save_goes_to_the_fastest_tier_that_can_take_it(settings: CacheSettings) -> None:
    settings = sized(msgspec.structs.replace(settings, write_behind=False), ram=10_000)
    with MetaProcess(settings), CacheClient.from_settings(settings) as cache:
        key, tier = save(cache, settings, 11)
        assert tier is RAM_FILE  # bigger than ram's whole quota
        assert copies(cache, key) == {RAM_FILE}
        only_disk = publish(cache, {DISK: tiers_of(settings)[DISK]}, spec(12), payload(12))
        assert only_disk.tier is DISK and only_disk.stored
