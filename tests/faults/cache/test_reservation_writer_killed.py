"""A writer SIGKILLed after each publish stage, against the real cache-meta process.

cache-meta watches the writer's pid, so its reservation is dealt with the
moment it dies (no TTL wait): dropped before the link, adopted after it.
Afterwards no reservation leaks, the key is absent or present and valid, no
``*.tmp`` survives the next startup scan, and the key can be saved again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llamad.cache.client import CacheClient
from llamad.cache.kvc import parse
from llamad.cache.publish import PublishOutcome, PublishStage, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tiers import Tier
from llamad.testing import MetaProcess
from llamad.tiers import LOCAL_TIERS
from meta_fault_child import row_payload, row_spec
from meta_fixtures import cache_settings_fixture  # noqa: F401  (the cache_settings fixture)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

CHILD = Path(__file__).resolve().parents[2] / "support" / "meta_fault_child.py"
LINKED_OR_LATER = {PublishStage.LINKED, PublishStage.SYNCED, PublishStage.ANNOUNCED}


def run_writer(settings_file: Path, tier: str, stage: PublishStage, seed: int) -> str:
    done = subprocess.run(
        [
            sys.executable,
            os.fspath(CHILD),
            "write",
            os.fspath(settings_file),
            tier,
            str(int(stage)),
            str(seed),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == -9, done.stderr[-2000:]
    return done.stdout


def wait_no_reservations(cache: CacheClient) -> None:
    deadline = time.monotonic() + 30
    while cache.status()["reservations"]:
        assert time.monotonic() < deadline, "a dead writer's reservation leaked"
        time.sleep(0.01)


@pytest.mark.parametrize("tier", LOCAL_TIERS)
def test_writer_killed_at_each_stage_leaks_nothing_and_orphans_are_adopted(
    cache_settings: CacheSettings, tmp_path: Path, tier: str
) -> None:
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps(cache_settings.to_wire()))
    cfg = cache_settings.tier(tier)
    assert cfg is not None
    files = Tier(cfg)
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        for stage in PublishStage:
            if stage is PublishStage.ANNOUNCED:
                continue  # dying after the announce is an ordinary exit for the cache
            seed = int(stage)
            out = run_writer(settings_file, tier, stage, seed)
            assert f"DYING {stage.name}" in out
            wait_no_reservations(cache)
            key = row_spec(seed).key
            ref = cache.lookup_exact(key, pin=False)
            if stage in LINKED_OR_LATER:
                assert ref is not None, f"post-link orphan after {stage.name} was not adopted"
            if ref is not None:
                _meta, payload = parse(files.path_for(key).read_bytes(), expected_key=key)
                assert bytes(payload) == row_payload(seed)
            else:
                assert not files.path_for(key).exists()
            # The key can be saved (or is already there) once the writer is gone.
            again = publish(cache, files, row_spec(seed), row_payload(seed))
            assert again.outcome in (PublishOutcome.PUBLISHED, PublishOutcome.DUPLICATE)
            assert cache.lookup_exact(key, pin=False) is not None
    # A restarted cache-meta's scan removes every leftover tmp file and keeps every row.
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        assert not list(files.root.glob(f"{files.prefix}*.tmp"))
        assert cache.status()["rows"] == len(PublishStage) - 1
