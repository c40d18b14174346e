"""The startup prefetch of disk rows: what it plans, and its setting.

Reading real files into the page cache: tests/integration/cache/test_prefetch_proc.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.prefetch import DEFAULT_PREFETCH_BYTES, Prefetcher, PrefetchItem, plan
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.config.schema import DiskTier
from llamad.testing import scratch_settings

pytestmark = pytest.mark.timeout(60)


@dataclass
class FakeRow:
    tier: TierKind
    size: int
    location: str
    last_used_ns: int


def test_plan_takes_the_newest_disk_rows_that_fit_the_budget() -> None:
    rows = [
        FakeRow(TierKind.DISK, 40, "/d/old", 1),
        FakeRow(TierKind.DISK, 50, "/d/newest", 9),
        FakeRow(TierKind.RAM_FILE, 10, "/f/newer", 10),  # tmpfs: resident anyway
        FakeRow(TierKind.DISK, 60, "/d/too-big-now", 8),
        FakeRow(TierKind.DISK, 30, "/d/newer", 7),
    ]
    got = plan(rows, 100)
    # 50 + 30 fit; 60 would overflow and is skipped, and so would 40.
    assert got == [PrefetchItem("/d/newest", 50), PrefetchItem("/d/newer", 30)]


def test_a_budget_of_zero_plans_nothing_and_is_off() -> None:
    items = plan([FakeRow(TierKind.DISK, 1, "/d/row", 1)], 0)
    assert items == []
    pf = Prefetcher(items, budget=0)
    pf.start()
    assert pf.wait(5)
    assert pf.status()["state"] == "off"


@pytest.mark.parametrize("bad", [-1, True, 1.5, "1GiB", None])
def test_a_prefetch_budget_that_is_not_a_byte_count_is_refused(bad: object) -> None:
    with pytest.raises(InvalidCacheValue) as info:
        scratch_settings(prefetch_bytes=bad)
    assert info.value.details["field"] == "prefetch_bytes"


def test_the_prefetch_budget_travels_to_cache_meta() -> None:
    settings = scratch_settings(prefetch_bytes=12345)
    assert CacheSettings.from_wire(settings.to_wire()).prefetch_bytes == 12345
    assert scratch_settings().prefetch_bytes == DEFAULT_PREFETCH_BYTES


def test_the_config_default_is_the_cache_default() -> None:
    assert DiskTier().prefetch == DEFAULT_PREFETCH_BYTES
