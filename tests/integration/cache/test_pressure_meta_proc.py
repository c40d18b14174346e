"""The pressure scheduler inside cache-meta's loop evicts RAM tiers on its own schedule."""

from __future__ import annotations

import threading
import time

import msgspec
import pytest

from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.meta_proc import MetaServer
from llamad.cache.pressure import CallablePressure, PressureConfig
from llamad.cache.publish import LocalMeta, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\x99" * 32, quant=3, ctx_hash=b"\xaa" * 32)
GIB = 1 << 30


def test_pressure_in_the_meta_loop_evicts_ram_rows_down_to_the_low_watermark(
    cache_settings: CacheSettings,
) -> None:
    settings = msgspec.structs.replace(
        cache_settings,
        pressure=PressureConfig(
            enabled=True, source="callable", interval_s=0.05, min_evict_bytes=1
        ),
        # The disk tier's bytes must stay put while pressure evicts ram rows;
        # a write-behind copy landing meanwhile would add to them.
        write_behind=False,
    )
    # Host memory, scaled to the cache's size once the rows exist.
    host = {"other": 0, "total": 10 * GIB}
    server: list[MetaServer] = []

    def used_memory() -> tuple[int, int]:
        cache_bytes = server[0].meta.used_bytes([TierKind.RAM, TierKind.RAM_FILE])
        return (host["other"] + cache_bytes, host["total"])

    server.append(MetaServer(settings, pressure_source=CallablePressure(used_memory)))
    ready = threading.Event()

    def loop() -> None:
        # The actor belongs to the thread that starts it.
        server[0].start()
        ready.set()
        while not server[0].actor.stop_requested:
            server[0].step(0.02)
        server[0].close()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        assert ready.wait(30)
        with CacheClient.from_settings(settings) as cache:
            cfg = settings.tier(TierKind.RAM)
            disk_cfg = settings.tier(TierKind.DISK)
            assert cfg is not None and disk_cfg is not None
            for i in range(12):
                tier = Tier(cfg if i % 3 else disk_cfg)
                spec = KvcSpec(
                    NS, tokens_to_bytes([i] * 600), FingerprintMode.SAFE, SaveReason.COLD
                )
                assert publish(cache, tier, spec, b"\x01" * 2_000_000).stored
            ram_before = cache.status()["tiers"]["ram"]["used"]
            disk_before = cache.status()["tiers"]["disk"]["used"]
            assert ram_before > 0
            # Everything else takes 0.6 of memory and the cache 0.3: 0.9 >= 0.85.
            host["total"] = int(ram_before / 0.3)
            host["other"] = int(0.6 * host["total"])
            deadline = time.monotonic() + 30
            while cache.status()["pressure"]["evictions_triggered"] == 0:
                assert time.monotonic() < deadline, "the scheduler never evicted"
                time.sleep(0.02)
            used, total = used_memory()
            assert used / total <= 0.75
            # ...and not far below: at most one row's worth under the target.
            assert used / total > 0.75 - 2_100_000 / total
            status = cache.status()
            assert status["tiers"]["ram"]["rows"] > 0
            # Disk rows free no memory and are left alone.
            assert status["tiers"]["disk"]["used"] == disk_before
    finally:
        if server:
            server[0].actor.request_stop()
        thread.join(30)


def test_pressure_disabled_in_the_meta_loop_never_samples_or_evicts(
    cache_settings: CacheSettings,
) -> None:
    # Disabled is the default; the source reads 99% for as long as the loop runs.
    samples: list[float] = []

    def full() -> tuple[int, int]:
        samples.append(time.monotonic())
        return (99, 100)

    settings = msgspec.structs.replace(
        cache_settings,
        pressure=PressureConfig(enabled=False, source="callable", interval_s=0.02),
    )
    server = MetaServer(settings, pressure_source=CallablePressure(full))
    server.start()
    try:
        cfg = settings.tier(TierKind.RAM)
        assert cfg is not None
        writer = LocalMeta(server.meta)
        for i in range(4):
            spec = KvcSpec(NS, tokens_to_bytes([i] * 600), FingerprintMode.SAFE, SaveReason.COLD)
            assert publish(writer, Tier(cfg), spec, b"\x01" * 100_000).stored
        # Step the loop through a dozen of the scheduler's intervals.
        until = time.monotonic() + 0.3
        while time.monotonic() < until:
            server.step(0.01)
        assert samples == []
        assert server.pressure.status()["checks"] == 0
        assert len(server.meta.rows) == 4
        # A forced check reads the source but still evicts nothing.
        assert server.pressure.force_check().action == "disabled"
        assert len(samples) == 1 and len(server.meta.rows) == 4
    finally:
        server.close()
