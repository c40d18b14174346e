"""Writers in separate processes race to save one key through the real cache-meta."""

from __future__ import annotations

import multiprocessing as mp
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason, parse
from llamad.cache.publish import PublishOutcome, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.testing import MetaProcess

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

NS = Namespace(fingerprint=b"\xc1" * 32, quant=3, ctx_hash=b"\xd1" * 32)
TOKENS = list(range(5000, 5700))
N_WRITERS = 3


def make_spec() -> KvcSpec:
    return KvcSpec(NS, tokens_to_bytes(TOKENS), FingerprintMode.SAFE, SaveReason.FINISH)


def race(settings: dict[str, Any], tier: str, i: int, go: Any, results: Any) -> None:
    cfg = CacheSettings.from_wire(settings)
    tier_cfg = cfg.tier(tier)
    assert tier_cfg is not None
    payload = bytes([i]) * 300_000
    with CacheClient.from_settings(cfg) as cache:
        cache.status()  # connected before the start signal
        go.wait(60)
        result = publish(cache, Tier(tier_cfg), make_spec(), payload)
    results.put((i, result.outcome.value))


def collect(results: Any, procs: list[Any], timeout: float = 120.0) -> list[tuple[int, str]]:
    """Each writer's outcome; fails at once if a writer dies without reporting."""
    got: list[tuple[int, str]] = []
    deadline = time.monotonic() + timeout
    while len(got) < len(procs):
        assert time.monotonic() < deadline, "writers did not report in time"
        try:
            got.append(results.get(timeout=0.5))
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            assert not dead, f"a writer process failed: exit codes {dead}"
    return got


@pytest.mark.parametrize("tier", [TierKind.RAM, TierKind.DISK])
def test_concurrent_writer_processes_exactly_one_publishes(
    cache_settings: CacheSettings, tier: str
) -> None:
    ctx = mp.get_context("spawn")
    go = ctx.Event()
    results = ctx.Queue()
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        procs = [
            ctx.Process(target=race, args=(cache_settings.to_wire(), tier, i, go, results))
            for i in range(N_WRITERS)
        ]
        for p in procs:
            p.start()
        go.set()
        outcomes = dict(collect(results, procs))
        for p in procs:
            p.join(60)
            assert p.exitcode == 0

        assert sorted(outcomes.values()).count(PublishOutcome.PUBLISHED.value) == 1
        assert set(outcomes.values()) <= {
            PublishOutcome.PUBLISHED.value,
            PublishOutcome.DUPLICATE.value,
        }
        (winner,) = [i for i, o in outcomes.items() if o == PublishOutcome.PUBLISHED.value]

        row = cache.lookup_exact(make_spec().key)
        assert row is not None
        with cache.pinned(row):
            _, body = parse(Path(row.location).read_bytes(), expected_key=make_spec().key)
        assert bytes(body) == bytes([winner]) * 300_000
        cfg = cache_settings.tier(tier)
        assert cfg is not None
        # A ram tier's root is /dev/shm, shared with every other test running
        # beside this one: only this instance's names are this test's.
        prefix = Tier(cfg).prefix
        assert not [
            p for p in cfg.root.iterdir() if p.name.startswith(prefix) and p.name.endswith(".tmp")
        ]
        assert cache.status()["reservations"] == 0
        assert cache.counters()["duplicate_dropped"] == N_WRITERS - 1
