"""The newest disk rows are in the page cache after cache-meta starts, within the budget."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason, encode_kvc
from llamad.cache.prefetch import Prefetcher, PrefetchItem
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.testing import MetaProcess, discard_scratch, scratch_settings
from pagecache_probe import resident_pages, write_dropped

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\x5a" * 32, quant=3, ctx_hash=b"\x6b" * 32)
PAYLOAD = 2 << 20
TAIL = 512 * 1024  # past anything the startup scan's header reads bring in


def _rows(settings: CacheSettings, n: int) -> list[Path]:
    """``n`` disk rows, newest first (last used a second apart), out of the page cache."""
    cfg = settings.tier(TierKind.DISK)
    assert cfg is not None
    tier = Tier(cfg)
    tier.prepare()
    now = time.time_ns()
    paths = []
    for i in range(n):
        spec = KvcSpec(
            NS,
            tokens_to_bytes([i + 1] * 600),
            FingerprintMode.SAFE,
            SaveReason.FINISH,
            last_used_ns=now - i * 1_000_000_000,
        )
        paths.append(write_dropped(tier.path_for(spec.key), encode_kvc(spec, os.urandom(PAYLOAD))))
    return paths


def _prefetch_status(settings: CacheSettings) -> dict[str, Any]:
    """cache-meta's prefetch status once it has finished."""
    with CacheClient.from_settings(settings) as cache:
        deadline = time.monotonic() + 60
        while True:
            status: dict[str, Any] = cache.status()["prefetch"]
            if status["state"] in ("done", "off"):
                return status
            assert time.monotonic() < deadline, status
            time.sleep(0.02)


@pytest.fixture
def settings_for() -> Iterator[Callable[[int], CacheSettings]]:
    made: list[CacheSettings] = []

    def make(budget: int) -> CacheSettings:
        made.append(scratch_settings(prefix="pf", prefetch_bytes=budget))
        return made[-1]

    yield make
    for s in made:
        discard_scratch(s)


def test_the_newest_disk_rows_are_resident_after_start_within_the_budget(
    settings_for: Callable[[int], CacheSettings],
) -> None:
    size = _rows(settings_for(0), 1)[0].stat().st_size
    settings = settings_for(2 * size + size // 2)  # room for two whole rows, not three
    paths = _rows(settings, 4)
    with MetaProcess(settings):
        status = _prefetch_status(settings)
    assert (status["state"], status["rows_read"], status["bytes_read"]) == ("done", 2, 2 * size)
    for path in paths[:2]:
        resident, total = resident_pages(path)
        assert resident == total, f"a newest row: {resident} of {total} pages resident"
    for path in paths[2:]:
        resident, total = resident_pages(path, path.stat().st_size - TAIL)
        assert resident == 0, f"a row past the budget: {resident} of {total} tail pages resident"


def test_a_prefetch_budget_of_zero_reads_no_row(
    settings_for: Callable[[int], CacheSettings],
) -> None:
    settings = settings_for(0)
    paths = _rows(settings, 2)
    with MetaProcess(settings):
        status = _prefetch_status(settings)
    assert (status["state"], status["rows"], status["bytes_read"]) == ("off", 0, 0)
    for path in paths:
        assert resident_pages(path, path.stat().st_size - TAIL)[0] == 0


def test_a_row_gone_since_the_plan_is_skipped(tmp_path: Path) -> None:
    here = write_dropped(tmp_path / "here.kvc", os.urandom(8192))
    pf = Prefetcher(
        [PrefetchItem(str(tmp_path / "gone.kvc"), 4096), PrefetchItem(str(here), 8192)],
        budget=1 << 20,
    )
    pf.run()
    status = pf.status()
    assert (status["state"], status["rows_read"], status["bytes_read"]) == ("done", 1, 8192)
    assert resident_pages(here) == (2, 2)


def test_a_stopped_prefetch_reads_no_further(tmp_path: Path) -> None:
    path = write_dropped(tmp_path / "row.kvc", os.urandom(1 << 20))
    pf = Prefetcher([PrefetchItem(str(path), 1 << 20)], budget=1 << 20)
    pf.stop()
    pf.run()
    status = pf.status()
    assert (status["state"], status["bytes_read"]) == ("stopped", 0)
    assert resident_pages(path)[0] == 0
