"""The writer permits come with the cache: cache-meta creates them, pools attach (SPEC C6)."""

from __future__ import annotations

import pytest

from llamad.cache.client import CacheClient
from llamad.cache.counters import Counters
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.publish import PublishOutcome
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.writer import WriterPool
from llamad.testing import MetaProcess

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\xe1" * 32, quant=3, ctx_hash=b"\xf1" * 32)


def test_cache_meta_creates_the_permits_and_a_pool_from_settings_saves_under_them(
    cache_settings: CacheSettings,
) -> None:
    assert cache_settings.permits_path is not None
    assert not cache_settings.permits_path.exists()
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        permits = cache_settings.attach_permits()
        assert permits.n == cache_settings.save_permits
        counters = Counters.attach(cache_settings.counters_path)
        pool = WriterPool.from_settings(cache_settings, counters=counters)
        try:
            # Every permit taken elsewhere: the pool's save is dropped, not queued.
            held = [permits.try_acquire() for _ in range(permits.n)]
            spec = KvcSpec(NS, tokens_to_bytes(range(600)), FingerprintMode.SAFE, SaveReason.COLD)
            assert pool.save_async(spec, TierKind.DISK, b"\x05" * 50_000) is None
            assert cache.counters()["saves_dropped"] == 1
            for p in held:
                assert p is not None
                p.release()
            future = pool.save_async(spec, TierKind.DISK, b"\x05" * 50_000)
            assert future is not None
            assert future.result(60).outcome is PublishOutcome.PUBLISHED
            assert cache.lookup_exact(spec.key, pin=False) is not None
            assert permits.held() == 0
        finally:
            pool.close()
            counters.close()


def test_a_restarted_cache_meta_keeps_the_permits_writers_hold(
    cache_settings: CacheSettings,
) -> None:
    with MetaProcess(cache_settings):
        held = cache_settings.attach_permits().try_acquire()
        assert held is not None
    try:
        with MetaProcess(cache_settings):
            permits = cache_settings.attach_permits()
            assert permits.held() == 1
        assert permits.held() == 1
    finally:
        held.release()
    assert cache_settings.attach_permits().held() == 0
