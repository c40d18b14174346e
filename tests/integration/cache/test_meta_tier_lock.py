"""A second cache-meta over tiers a live one owns refuses to start, having touched nothing.

The first cache-meta is a real process serving real clients; the second is
started the way ``run_meta`` starts it (``MetaServer`` then ``start``), in
this process so that the typed refusal can be checked, and once as a real
process. "Touched nothing" is checked on the files themselves: every name,
size and modification time in every tier is what it was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import msgspec
import pytest

from llamad.cache.client import CacheClient
from llamad.cache.errors import TierLocked
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.meta_proc import MetaServer
from llamad.cache.publish import PublishOutcome, PublishStage, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.testing import MetaProcess
from llamad.tiers import LOCAL_TIERS

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\x5c" * 32, quant=3, ctx_hash=b"\x6d" * 32)
PAYLOAD = bytes(range(256)) * 40


@pytest.fixture(name="cache_settings")
def no_write_behind(cache_settings: CacheSettings) -> CacheSettings:
    """The first cache-meta's own moves would change the tier files the tests
    compare: no write-behind copies to disk here (a move is a write like a
    save, which the tests hold back themselves)."""
    return msgspec.structs.replace(cache_settings, write_behind=False)


def spec_for(seed: int) -> KvcSpec:
    return KvcSpec(NS, tokens_to_bytes([seed, *range(300)]), FingerprintMode.SAFE, SaveReason.COLD)


def tier_of(settings: CacheSettings, kind: TierKind) -> Tier:
    cfg = settings.tier(kind)
    assert cfg is not None
    return Tier(cfg)


def tier_files(settings: CacheSettings) -> dict[str, tuple[int, int]]:
    """Every file of every tier: path -> (size, mtime_ns)."""
    found: dict[str, tuple[int, int]] = {}
    for kind in LOCAL_TIERS:
        tier = tier_of(settings, kind)
        for entry in os.scandir(tier.root):
            if entry.name.startswith(tier.prefix):
                st = entry.stat()
                found[entry.path] = (st.st_size, st.st_mtime_ns)
    return found


def publish_one_row_per_tier(cache: CacheClient, settings: CacheSettings) -> list[bytes]:
    keys = []
    for n, kind in enumerate(LOCAL_TIERS):
        done = publish(cache, tier_of(settings, kind), spec_for(n), PAYLOAD)
        assert done.outcome is PublishOutcome.PUBLISHED
        keys.append(done.key)
    return keys


def refused_second_start(settings: CacheSettings) -> TierLocked:
    """Start a second cache-meta as run_meta would; it must refuse with TierLocked."""
    with pytest.raises(TierLocked) as refused:
        second = MetaServer(settings)
        try:
            second.start()
        finally:
            second.close()
    return refused.value


def assert_serves(cache: CacheClient, keys: list[bytes]) -> None:
    buf = bytearray(len(PAYLOAD))
    for key in keys:
        ref = cache.lookup_exact(key)
        assert ref is not None, "the live cache-meta lost a row"
        with cache.pinned(ref):
            assert cache.load_into(ref, buf) == len(PAYLOAD) and buf == PAYLOAD


def sharing_only(settings: CacheSettings, kind: TierKind, base: Path) -> CacheSettings:
    """A cache of its own (tiers, runtime files, registry) except for tier ``kind``."""
    instance = f"lco{uuid.uuid4().hex[:12]}"
    tiers = tuple(
        t
        if t.kind is kind
        else dataclasses.replace(t, instance=instance)
        if t.kind is TierKind.RAM
        else dataclasses.replace(t, root=base / t.kind.value)
        for t in settings.tiers
    )
    return msgspec.structs.replace(
        settings,
        tiers=tiers,
        counters_path=base / "counters",
        permits_path=base / "permits",
        registry_root=base / "reg",
    )


@pytest.mark.parametrize("kind", LOCAL_TIERS)
def test_second_meta_sharing_a_tier_leaves_its_inflight_save_alone(
    cache_settings: CacheSettings, kind: TierKind, tmp_path: Path
) -> None:
    tier = tier_of(cache_settings, kind)
    partner = sharing_only(cache_settings, kind, tmp_path)
    spec = spec_for(100)
    tmp = tier.tmp_path_for(spec.key, "w-inflight")
    seen: list[TierLocked] = []

    def second_start_mid_save(stage: PublishStage, key: bytes) -> None:
        if stage is PublishStage.WRITTEN:
            assert tmp.exists()
            before = tier_files(cache_settings)
            seen.append(refused_second_start(partner))
            assert tmp.exists(), "the refused start deleted an in-flight save's tmp file"
            assert tier_files(cache_settings) == before

    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        done = publish(
            cache, tier, spec, PAYLOAD, writer="w-inflight", on_stage=second_start_mid_save
        )
        assert len(seen) == 1
        assert seen[0].details["tier"] == kind.value
        assert done.outcome is PublishOutcome.PUBLISHED
        assert_serves(cache, [spec.key])
    # The partner's own tiers were given back when it refused.
    assert not any(tier_of(partner, k).lock_path.exists() for k in LOCAL_TIERS if k is not kind)


def test_second_meta_with_disk_quota_zero_deletes_nothing(cache_settings: CacheSettings) -> None:
    # Its own quotas would evict every row the live one indexes.
    starved = msgspec.structs.replace(
        cache_settings,
        tiers=tuple(dataclasses.replace(t, quota=0) for t in cache_settings.tiers),
    )
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        keys = publish_one_row_per_tier(cache, cache_settings)
        before = tier_files(cache_settings)
        refused_second_start(starved)
        assert tier_files(cache_settings) == before
        assert_serves(cache, keys)
        assert cache.counters()["evictions"] == 0


def test_second_meta_with_another_runtime_dir_but_the_same_tiers_refuses(
    cache_settings: CacheSettings, tmp_path: Path
) -> None:
    # Another registry, counters and permits: nothing tells the two apart
    # but the tiers they share. It used to start and serve beside the first.
    other_run = Path(tempfile.mkdtemp(prefix="lc-run-", dir="/tmp"))
    elsewhere = msgspec.structs.replace(
        cache_settings,
        counters_path=other_run / "counters",
        permits_path=other_run / "permits",
        registry_root=other_run / "reg",
    )
    try:
        with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
            keys = publish_one_row_per_tier(cache, cache_settings)
            before = tier_files(cache_settings)
            refused = refused_second_start(elsewhere)
            assert refused.details["holder_pid"] is not None
            # The real entry point: exits with the refusal, serves nothing.
            settings_file = tmp_path / "settings.json"
            settings_file.write_text(json.dumps(elsewhere.to_wire()))
            proc = subprocess.run(
                [sys.executable, "-m", "llamad.cache.meta_proc", str(settings_file)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert proc.returncode != 0
            assert "READY" not in proc.stdout
            assert "TierLocked" in proc.stderr
            assert tier_files(cache_settings) == before
            assert sorted(os.listdir(other_run)) == [], "it touched its own runtime dir"
            assert_serves(cache, keys)
    finally:
        for leftover in sorted(other_run.rglob("*"), reverse=True):
            leftover.unlink() if not leftover.is_dir() else leftover.rmdir()
        other_run.rmdir()


def test_meta_restarts_over_its_tiers_after_the_owner_was_sigkilled(
    cache_settings: CacheSettings,
) -> None:
    first = MetaProcess(cache_settings).start()
    try:
        with CacheClient.from_settings(cache_settings) as cache:
            keys = publish_one_row_per_tier(cache, cache_settings)
        assert first.proc is not None
        first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(10)
    finally:
        first.stop()
    # The dead owner's lock files are still there; its locks are not.
    assert all(tier_of(cache_settings, kind).lock_path.exists() for kind in LOCAL_TIERS)
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        assert_serves(cache, keys)
