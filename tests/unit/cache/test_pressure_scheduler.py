"""The memory-pressure scheduler: watermarks, min_evict_bytes, sources, off by default."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import pytest

from llamad.cache.meta import CacheMeta
from llamad.cache.pressure import (
    CallablePressure,
    NvidiaSmiPressure,
    PressureConfig,
    PressureScheduler,
    SystemPressure,
    make_source,
    parse_nvidia_smi,
)
from llamad.cache.tier_kind import TierKind
from llamad.errors import ConfigError
from meta_fakes import FakeClock, intent, make_meta, publish

pytestmark = pytest.mark.timeout(30)

GIB = 1 << 30


def loaded_cache(rows: int = 40, size: int = 50 << 20) -> tuple[CacheMeta, FakeClock]:
    meta, store, clock, _ = make_meta(
        {TierKind.RAM: 100 * GIB, TierKind.RAM_FILE: 100 * GIB, TierKind.DISK: 100 * GIB}
    )
    for i in range(rows):
        publish(meta, store, intent([i], tier=TierKind.RAM if i % 2 else "ram_file", size=size))
    return meta, clock


def test_scheduler_evicts_down_to_the_low_watermark() -> None:
    meta, clock = loaded_cache()
    base = int(6.7 * GIB)
    total = 10 * GIB
    # In use: everything else (6.7 GiB) + the cache's RAM tiers (~1.95 GiB) of 10 GiB = 0.865.
    source = CallablePressure(
        lambda: (base + meta.used_bytes([TierKind.RAM, TierKind.RAM_FILE]), total)
    )
    sched = PressureScheduler(
        PressureConfig(enabled=True, interval_s=5), source, meta.evict_bytes, clock=clock
    )
    assert sched.poll() is None  # not due yet
    clock.advance(5)
    report = sched.poll()
    assert report is not None and report.action == "evicted"
    used_after, _ = source.sample()
    assert used_after / total <= 0.75
    # ...and not much further: at most one row's worth below the target.
    assert used_after / total > 0.75 - (50 << 20) / total
    assert sched.status()["evictions_triggered"] == 1


def test_scheduler_does_nothing_when_disabled() -> None:
    meta, clock = loaded_cache()
    before = meta.used_bytes()
    calls: list[int] = []

    def evict(n: int, tiers: Sequence[str]) -> tuple[int, int]:
        calls.append(n)
        return meta.evict_bytes(n, tiers)

    sched = PressureScheduler(
        PressureConfig(), CallablePressure(lambda: (99, 100)), evict, clock=clock
    )
    assert sched.next_due() is None
    clock.advance(3600)
    assert sched.poll() is None
    report = sched.force_check()
    assert report.action == "disabled" and report.ratio == pytest.approx(0.99)
    assert calls == [] and meta.used_bytes() == before


def test_scheduler_below_the_high_watermark_evicts_nothing() -> None:
    calls: list[int] = []
    sched = PressureScheduler(
        PressureConfig(enabled=True),
        CallablePressure(lambda: (84, 100)),
        lambda n, t: calls.append(n) or (0, 0),
    )
    assert sched.force_check().action == "none"
    assert calls == []


def test_scheduler_asks_for_at_least_min_evict_bytes_from_the_configured_tiers() -> None:
    asked: list[tuple[int, tuple[str, ...]]] = []
    sched = PressureScheduler(
        PressureConfig(enabled=True, min_evict_bytes=10 << 20, evict_tiers=(TierKind.RAM,)),
        CallablePressure(lambda: (860, 1000)),
        lambda n, t: asked.append((n, tuple(t))) or (0, 0),
    )
    sched.force_check()
    assert asked == [(10 << 20, ("ram",))]


def test_pinned_rows_survive_pressure_eviction() -> None:
    meta, clock = loaded_cache(rows=4)
    pinned = list(meta.rows)[:2]
    for key in pinned:
        meta.checkout(key, owner=5)
    sched = PressureScheduler(
        PressureConfig(enabled=True, min_evict_bytes=100 * GIB),
        CallablePressure(lambda: (99, 100)),
        meta.evict_bytes,
        clock=clock,
    )
    report = sched.force_check()
    assert report.evicted_rows == 2
    assert set(meta.rows) == set(pinned)


def test_a_failing_source_reports_an_error_and_evicts_nothing() -> None:
    def boom() -> tuple[int, int]:
        raise RuntimeError("sensor gone")

    sched = PressureScheduler(
        PressureConfig(enabled=True), CallablePressure(boom), lambda n, t: (1, 1)
    )
    report = sched.force_check()
    assert report.action == "error"
    assert sched.status()["last_error"] == "sensor gone"


def test_system_source_reads_host_memory() -> None:
    used, total = SystemPressure().sample()
    assert 0 < used <= total


def test_host_without_nvidia_smi_reads_as_no_pressure() -> None:
    source = NvidiaSmiPressure(binary="llamad-no-such-nvidia-smi")
    assert source.sample() == (0, 0)
    sched = PressureScheduler(PressureConfig(enabled=True), source, lambda n, t: (1, 1))
    assert sched.force_check().action == "no_reading"


def test_nvidia_smi_output_is_summed_over_gpus(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '1000, 4000'\necho '3000, 4000'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    used, total = NvidiaSmiPressure(binary=os.fspath(fake)).sample()
    assert (used, total) == (4000 << 20, 8000 << 20)


@pytest.mark.parametrize("text", ["", "garbage", "1, 2, 3", "5, 0", "x, 10"])
def test_malformed_nvidia_smi_output_is_no_reading(text: str) -> None:
    assert parse_nvidia_smi(text) is None


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("source", {"source": "sundial"}),
        ("interval_s", {"interval_s": 0}),
        ("high_watermark", {"high_watermark": 1.5}),
        ("low_watermark", {"low_watermark": 0.9}),
        ("min_evict_bytes", {"min_evict_bytes": -1}),
        ("evict_tiers", {"evict_tiers": ("tape",)}),
        ("enabled", {"enabled": "yes"}),
    ],
)
def test_invalid_pressure_config_names_the_field(field: str, kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError) as err:
        PressureConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.details["field"] == field


def test_defaults_match_the_spec() -> None:
    cfg = PressureConfig()
    assert (cfg.enabled, cfg.interval_s, cfg.high_watermark, cfg.low_watermark) == (
        False,
        5.0,
        0.85,
        0.75,
    )


def test_callable_source_needs_a_function() -> None:
    with pytest.raises(ConfigError):
        make_source(PressureConfig(source="callable"))
    assert make_source(PressureConfig(source="callable"), lambda: 0.5).sample() == (
        1 << 29,
        1 << 30,
    )
