"""Fixtures for cache-meta fault tests (import them into the test module)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache.sup import CacheSettings, purge_ram
from llamad.cache.tiers import TierConfig, TierKind

MIB = 1 << 20


@pytest.fixture(name="cache_settings")
def cache_settings_fixture() -> Iterator[CacheSettings]:
    """All three tiers in private places: ram segments under a unique instance,
    ram_file in /dev/shm, disk and the actor registry in a short /tmp dir
    (ipc paths must fit in 107 bytes)."""
    instance = f"t{uuid.uuid4().hex[:12]}"
    base = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))
    shm = Path("/dev/shm") / f"llamad-test-{instance}"
    settings = CacheSettings(
        tiers=(
            TierConfig(TierKind.RAM, Path("/dev/shm"), 64 * MIB, instance),
            TierConfig(TierKind.RAM_FILE, shm, 64 * MIB, instance),
            TierConfig(TierKind.DISK, base / "disk", 256 * MIB, instance),
        ),
        counters_path=shm.parent / f"llamad-test-{instance}.counters",
        registry_root=base / "reg",
        stats_flush_s=0.5,
    )
    try:
        yield settings
    finally:
        purge_ram(settings)
        shutil.rmtree(shm, ignore_errors=True)
        settings.counters_path.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
