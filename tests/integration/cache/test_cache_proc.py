"""cache-meta as a real process: publish, look up, load, wait, evict, over ZeroMQ."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from llamad.cache.client import CacheClient
from llamad.cache.errors import PublishAbandoned
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason, write_kvc
from llamad.cache.lookup import HitKind
from llamad.cache.publish import PublishOutcome, publish
from llamad.cache.reservation import SaveIntent
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.errors import BadRequest
from llamad.testing import MetaProcess, discard_scratch, scratch_settings, wait_until
from wakeups import voluntary_switches

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\x11" * 32, quant=3, ctx_hash=b"\x22" * 32)
BASE = [(i * 7919) % 49_152 for i in range(4000)]


def spec(tokens: list[int], reason: SaveReason = SaveReason.COLD) -> KvcSpec:
    return KvcSpec(NS, tokens_to_bytes(tokens), FingerprintMode.SAFE, reason)


def payload(n: int, seed: int = 0) -> bytes:
    return bytes((i * 31 + seed) % 251 for i in range(n))


def tier(settings: CacheSettings, name: str) -> Tier:
    cfg = settings.tier(name)
    assert cfg is not None
    return Tier(cfg)


def test_cache_proc_publishes_and_serves_rows_from_every_tier(
    cache_settings: CacheSettings,
) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        rows = {}
        for n, tname in ((300, "ram"), (1000, "ram_file"), (2500, "disk")):
            data = payload(20_000, seed=n)
            done = publish(cache, tier(cache_settings, tname), spec(BASE[:n]), data)
            assert done.outcome is PublishOutcome.PUBLISHED
            rows[n] = (done.key, data, tname)

        found = cache.resolve(NS, BASE[:3000])
        assert found.kind is HitKind.PREFIX and found.use_tokens == 2500
        assert (
            found.row is not None and found.row.tier is TierKind.DISK and found.row.pin is not None
        )
        buf = bytearray(found.row.file_size)
        with cache.pinned(found.row):
            n = cache.load_into(found.row, buf)
        assert n == len(rows[2500][1]) and bytes(buf[:n]) == rows[2500][1]

        exact = cache.lookup_exact(rows[300][0])
        assert exact is not None and exact.tier is TierKind.RAM
        with cache.pinned(exact):
            n = cache.load_into(exact, buf)
        assert n is not None and bytes(buf[:n]) == rows[300][1]

        # The ram and ram_file rows get disk copies behind (write_behind):
        # the byte gauges stand still once those have landed.
        def settled() -> dict[str, Any] | None:
            status = cache.status()
            moves = status["moves"]
            return status if moves["in_flight"] == moves["write_behind_waiting"] == 0 else None

        status = wait_until(settled, "the write-behind copies")
        assert status["rows"] == 3 and status["pins"] == 0
        counters = cache.counters()
        assert counters["saves_cold"] == 3
        assert counters["hits_longest_prefix"] == 1 and counters["hits_exact"] == 1
        assert counters["bytes_disk"] > 0
        cache.reset_counters()
        after = cache.counters()
        assert after["saves_cold"] == after["hits_exact"] == 0
        assert after["bytes_disk"] == counters["bytes_disk"]  # gauges describe state


def test_waiter_over_the_wire_is_released_when_the_save_publishes(
    cache_settings: CacheSettings,
) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as writer:
        s = spec(BASE[:700], SaveReason.FINISH)
        data = payload(10_000)
        disk = tier(cache_settings, TierKind.DISK)
        size = s.file_size(len(data))
        intent = SaveIntent(s.key, NS.header(), s.tokens, TierKind.DISK, size, SaveReason.FINISH)
        token = writer.reserve_save(intent)
        answers: list[object] = []

        def wait() -> None:
            with CacheClient.from_settings(cache_settings) as reader:
                answers.append(reader.lookup_exact_or_wait(s.key, wait_s=30))

        t = threading.Thread(target=wait)
        t.start()
        deadline = time.monotonic() + 30
        while writer.status()["waiters"] == 0:
            assert time.monotonic() < deadline, "the waiter never parked"
            time.sleep(0.01)
        writer.cancel_reservation(s.key, token)
        t.join(30)
        assert answers == [None]  # cancelled save: a miss, at once

        token = writer.reserve_save(intent)
        t = threading.Thread(target=wait)
        t.start()
        while writer.status()["waiters"] == 0:
            assert time.monotonic() < deadline, "the waiter never parked"
            time.sleep(0.01)
        path, fd = disk.create_tmp(s.key, "w1", size)
        write_kvc(fd, s, data)
        os.close(fd)
        writer.check_reservation(s.key, token)
        os.link(path, disk.path_for(s.key))
        os.unlink(path)
        writer.mark_published(s.key, token, disk.location_for(s.key))
        writer.announce_saved(s.key, token)
        t.join(30)
        [ref] = answers[1:]
        assert ref is not None and ref.key == s.key and ref.pin is not None  # type: ignore[attr-defined]
        assert writer.counters()["hits_resume"] == 1


def test_waiter_over_the_wire_times_out_with_a_miss(cache_settings: CacheSettings) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        s = spec(BASE[:700])
        intent = SaveIntent(s.key, NS.header(), s.tokens, TierKind.DISK, 5000, SaveReason.COLD)
        cache.reserve_save(intent)
        started = time.monotonic()
        assert cache.lookup_exact_or_wait(s.key, wait_s=0.3) is None
        assert time.monotonic() - started >= 0.3
        assert cache.status()["waiters"] == 0


def test_stale_token_over_the_wire_raises_publish_abandoned(cache_settings: CacheSettings) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        s = spec(BASE[:10])
        intent = SaveIntent(s.key, NS.header(), s.tokens, TierKind.DISK, 5000, SaveReason.COLD)
        token = cache.reserve_save(intent)
        with pytest.raises(PublishAbandoned):
            cache.check_reservation(s.key, token + 1)


def test_a_location_outside_the_tiers_is_refused(cache_settings: CacheSettings) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        s = spec(BASE[:10])
        intent = SaveIntent(s.key, NS.header(), s.tokens, TierKind.DISK, 5000, SaveReason.COLD)
        token = cache.reserve_save(intent)
        cache.check_reservation(s.key, token)
        with pytest.raises(BadRequest):
            cache.mark_published(s.key, token, "/etc/passwd")


def test_an_idle_cache_meta_sleeps_until_something_is_due() -> None:
    """With nothing due (hit counts written back every 10 s, the default; no
    reservation, waiter or pressure check), an idle cache-meta's threads
    wake a few times in 2 s (voluntary context switches), not 20 times a
    second (a floor on its housekeeping woke it so, each time a core taken
    from a decode beside it). A request still gets its housekeeping at once
    (the other tests here)."""
    settings = scratch_settings(prefix="lci")
    try:
        with MetaProcess(settings) as meta, CacheClient.from_settings(settings) as cache:
            key = publish(cache, tier(settings, "ram"), spec(BASE[:64]), payload(4096)).key
            assert cache.lookup_exact(key) is not None
            time.sleep(0.5)  # the publish's and the lookup's housekeeping
            before = voluntary_switches(meta.pid)
            time.sleep(2.0)
            woken = voluntary_switches(meta.pid) - before
    finally:
        discard_scratch(settings)
    assert woken <= 8, f"cache-meta's threads woke {woken} times in 2 s idle"
