"""Shared cache counters (SPEC C10): cheap bumps, snapshots from any process, reset."""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import signal
import threading
from pathlib import Path

import pytest

from llamad.cache import counters as counters_module
from llamad.cache.counters import (
    COUNTERS,
    GAUGES,
    Counters,
    CountersFull,
    CountersUnavailable,
    snapshot_of,
)
from llamad.cache.errors import InvalidCacheValue

pytestmark = pytest.mark.timeout(60)


def _bump_then_wait(path: str, n: int, ready: mp.synchronize.Event) -> None:
    c = Counters.attach(path)
    for _ in range(n):
        c.add("hits_exact")
    c.add("load_total_ns", 1000)
    ready.set()
    signal.pause()


def test_every_spec_counter_exists_and_starts_at_zero(tmp_path: Path) -> None:
    c = Counters.create(tmp_path / "counters")
    snap = c.snapshot()
    expected = {
        "hits_exact", "hits_resume", "hits_longest_prefix", "misses",
        "saves_cold", "saves_continued", "saves_finish", "saves_evict", "saves_shutdown",
        "saves_dropped", "evictions", "corrupt_files", "duplicate_dropped",
        "demotions", "promotions", "write_behind_copies", "moves_linked", "moves_failed",
        "bytes_ram", "bytes_ram_file", "bytes_disk",
        "pack_total_ns", "load_total_ns", "longest_prefix_ns", "longest_prefix_probes",
        "hits_live", "prompt_tokens_live", "prompt_tokens_ram", "prompt_tokens_ram_file",
        "prompt_tokens_disk", "prompt_tokens_remote", "prompt_tokens_computed",
        "remote_hits", "remote_misses", "remote_skipped", "remote_evicted", "remote_damaged",
        "remote_errors", "remote_timeouts", "remote_reconnects", "remote_saves",
        "remote_bytes_written", "remote_saves_dropped", "remote_saves_duplicate",
        "remote_saves_failed", "remote_evictions",
    }  # fmt: skip
    assert set(snap) == expected == set(COUNTERS) | set(GAUGES)
    assert all(v == 0 for v in snap.values())
    c.close()


def test_counts_from_other_processes_are_summed_and_survive_their_death(tmp_path: Path) -> None:
    path = tmp_path / "counters"
    mine = Counters.create(path)
    mine.add("hits_exact", 5)
    ctx = mp.get_context("spawn")
    ready = [ctx.Event() for _ in range(2)]
    procs = [ctx.Process(target=_bump_then_wait, args=(str(path), 100, ev)) for ev in ready]
    for p in procs:
        p.start()
    try:
        for ev in ready:
            assert ev.wait(30)
        assert mine.snapshot()["hits_exact"] == 205
        assert mine.snapshot()["load_total_ns"] == 2000
        for p in procs:
            os.kill(p.pid, signal.SIGKILL)
            p.join(30)
        # The dead processes' rows keep their values; a newcomer may adopt one.
        newcomer = Counters.attach(path)
        newcomer.add("hits_exact")
        assert snapshot_of(path)["hits_exact"] == 206
        newcomer.close()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(30)
    mine.close()


def test_concurrent_threads_lose_no_bumps(tmp_path: Path) -> None:
    c = Counters.create(tmp_path / "counters")

    def bump() -> None:
        for _ in range(20_000):
            c.add("misses")

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert c.get("misses") == 80_000
    c.close()


def test_reset_zeroes_counters_but_keeps_gauges(tmp_path: Path) -> None:
    path = tmp_path / "counters"
    a = Counters.create(path)
    b = Counters.attach(path)
    a.add("saves_cold", 3)
    b.add("saves_cold", 4)
    b.set("bytes_disk", 12345)
    b.reset()
    assert a.get("saves_cold") == 0
    assert a.get("bytes_disk") == 12345
    a.add("saves_cold")
    assert b.get("saves_cold") == 1
    a.close()
    b.close()


def test_gauges_are_shared_not_summed(tmp_path: Path) -> None:
    path = tmp_path / "counters"
    a = Counters.create(path)
    b = Counters.attach(path)
    a.set("bytes_ram", 100)
    b.set("bytes_ram", 40)
    assert a.get("bytes_ram") == 40
    a.close()
    b.close()


def test_unknown_names_and_misuse_are_rejected(tmp_path: Path) -> None:
    c = Counters.create(tmp_path / "counters")
    with pytest.raises(InvalidCacheValue):
        c.add("hitz")
    with pytest.raises(InvalidCacheValue):
        c.add("bytes_ram")
    with pytest.raises(InvalidCacheValue):
        c.set("misses", 1)
    with pytest.raises(InvalidCacheValue):
        c.set("bytes_ram", -1)
    with pytest.raises(InvalidCacheValue):
        c.get("nope")
    c.close()


def test_attach_refuses_a_missing_or_foreign_file(tmp_path: Path) -> None:
    with pytest.raises(CountersUnavailable):
        Counters.attach(tmp_path / "absent")
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00" * 4096)
    with pytest.raises(CountersUnavailable):
        Counters.attach(junk)


def test_all_rows_held_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "counters"
    a = Counters.create(path, rows=2)
    b = Counters.attach(path)
    with pytest.raises(CountersFull):
        Counters.attach(path)
    b.close()
    c = Counters.attach(path)  # b's row is free again
    c.close()
    a.close()


def test_open_or_create_never_replaces_a_file_whose_rows_are_all_held(tmp_path: Path) -> None:
    path = tmp_path / "counters"
    holder = Counters.create(path, rows=1)
    holder.add("misses", 3)
    inode = path.stat().st_ino
    with pytest.raises(CountersFull):
        Counters.open_or_create(path)
    assert path.stat().st_ino == inode
    assert holder.snapshot()["misses"] == 3  # the holder still counts into the same file
    holder.close()


def test_open_or_create_creates_a_missing_or_foreign_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    c = Counters.open_or_create(missing)
    c.add("misses")
    assert c.snapshot()["misses"] == 1
    c.close()
    foreign = tmp_path / "junk"
    foreign.write_bytes(b"\x00" * 4096)
    d = Counters.open_or_create(foreign)
    assert d.snapshot()["misses"] == 0
    d.close()


def test_add_many_adds_each_counter_and_refuses_unknown_names_before_adding(
    tmp_path: Path,
) -> None:
    c = Counters.create(tmp_path / "counters")
    c.add_many(("misses", 1), ("longest_prefix_probes", 17), ("longest_prefix_ns", 900))
    c.add_many(("misses", 2))
    with pytest.raises(InvalidCacheValue):
        c.add_many(("misses", 5), ("bytes_ram", 1))  # a gauge is not a counter
    snap = c.snapshot()
    assert (snap["misses"], snap["longest_prefix_probes"], snap["longest_prefix_ns"]) == (
        3,
        17,
        900,
    )
    c.close()


def test_a_counters_file_of_an_older_layout_is_replaced_at_start_and_workers_attach_to_the_new(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The runtime directory outlives the daemon: after an upgrade that added
    # counters (the tier moves, say), the next cache-meta finds the previous
    # version's file. It must replace it (counts start again) rather than
    # refuse to start, and the model workers, which attach after it, count.
    path = tmp_path / "cache-counters"
    old_names = tuple(n for n in counters_module.NAMES if n not in {"demotions", "promotions"})
    with monkeypatch.context() as old:
        old.setattr(counters_module, "NAMES", old_names)
        old.setattr(
            counters_module,
            "_names_digest",
            lambda: hashlib.sha256("\n".join(old_names).encode()).digest()[:8],
        )
        stale = Counters.create(path)
        stale.add("misses", 5)
        stale.close()
    with pytest.raises(CountersUnavailable):
        Counters.attach(path)  # a worker of this version cannot use it...
    meta = Counters.open_or_create(path)  # ...so cache-meta, which starts first, replaces it
    worker = Counters.attach(path)
    worker.add("demotions", 2)
    assert meta.snapshot()["demotions"] == 2 and meta.snapshot()["misses"] == 0
    worker.close()
    meta.close()
