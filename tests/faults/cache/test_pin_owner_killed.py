"""A process that dies holding a pin loses it at once: the row becomes evictable (C4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.publish import PublishOutcome, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.testing import MetaProcess
from meta_fixtures import cache_settings_fixture  # noqa: F401  (the cache_settings fixture)

pytestmark = [pytest.mark.timeout(120)]

CHILD = Path(__file__).resolve().parents[2] / "support" / "meta_fault_child.py"
NS = Namespace(fingerprint=b"\x55" * 32, quant=3, ctx_hash=b"\x66" * 32)


def test_pin_of_a_killed_process_is_released_and_the_row_evictable(
    cache_settings: CacheSettings, tmp_path: Path
) -> None:
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps(cache_settings.to_wire()))
    disk = cache_settings.tier(TierKind.DISK)
    assert disk is not None
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        spec = KvcSpec(NS, tokens_to_bytes(range(700)), FingerprintMode.SAFE, SaveReason.COLD)
        done = publish(cache, Tier(disk), spec, b"\x07" * 50_000)
        assert done.outcome is PublishOutcome.PUBLISHED
        holder = subprocess.Popen(
            [sys.executable, os.fspath(CHILD), "pin", os.fspath(settings_file), done.key.hex()],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline().strip() == "PINNED"
            assert cache.status()["pins"] == 1
            # Pinned: not evictable.
            assert cache.evict_bytes(1 << 40) == (0, 0)
            holder.send_signal(signal.SIGKILL)
            holder.wait(30)
            deadline = time.monotonic() + 30
            while cache.status()["pins"] != 0:
                assert time.monotonic() < deadline, "the dead process's pin was never released"
                time.sleep(0.01)
            rows, freed = cache.evict_bytes(1 << 40)
            assert rows == 1 and freed == done.size
            assert not Tier(disk).path_for(done.key).exists()
        finally:
            if holder.poll() is None:
                holder.kill()
                holder.wait()
            if holder.stdout is not None:
                holder.stdout.close()
