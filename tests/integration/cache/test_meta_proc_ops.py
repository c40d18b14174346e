"""cache-meta's process behaviours: bad input, hit counts across restarts, admin ops."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from llamad.actors.client import Client
from llamad.actors.registry import Registry
from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.meta_wire import GcResult
from llamad.cache.pressure import PressureConfig
from llamad.cache.publish import PublishOutcome, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.errors import BadRequest, LlamadError
from llamad.testing import MetaProcess

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\x77" * 32, quant=3, ctx_hash=b"\x88" * 32)


def put(
    cache: CacheClient, settings: CacheSettings, seed: int, tier: TierKind = TierKind.DISK
) -> bytes:
    cfg = settings.tier(tier)
    assert cfg is not None
    spec = KvcSpec(NS, tokens_to_bytes([seed] * 600), FingerprintMode.SAFE, SaveReason.COLD)
    done = publish(cache, Tier(cfg), spec, bytes([seed % 256]) * 10_000)
    assert done.outcome is PublishOutcome.PUBLISHED
    return done.key


MALFORMED: list[tuple[str, dict[str, object], tuple[bytes, ...]]] = [
    ("lookup_exact", {"key": b"short"}, ()),
    ("lookup_exact", {"key": b"k" * 32, "surprise": 1}, ()),
    ("checkin", {"pin": -1}, ()),
    ("longest_prefix", {"namespace": b"n" * 65}, ()),  # the tokens frame is missing
    ("longest_prefix", {"namespace": b"n" * 65}, (b"\x01\x02\x03",)),  # ragged tokens
    (
        "reserve_save",
        {"key": b"k" * 32, "namespace": b"n" * 65, "tier": "tape", "size": 1, "reason": 1},
        (b"\0" * 4,),
    ),
    (  # the key is not sha256(namespace || tokens)
        "reserve_save",
        {"key": b"k" * 32, "namespace": b"n" * 65, "tier": "disk", "size": 1, "reason": 1},
        (b"\0" * 4,),
    ),
    ("evict_bytes", {"n": -5}, ()),
    ("mark_published", {"key": b"k" * 32, "token": 1, "location": "/etc/passwd"}, ()),
]


def test_malformed_requests_get_bad_request_and_cache_meta_keeps_serving(
    cache_settings: CacheSettings,
) -> None:
    assert cache_settings.registry_root is not None
    with MetaProcess(cache_settings) as proc:
        client = Client(name="cache-meta", registry=Registry(cache_settings.registry_root))
        try:
            for op, body, blobs in MALFORMED:
                with pytest.raises(BadRequest):
                    client.call(op, body, blobs=blobs)
                assert client.call("status", {})["rows"] == 0
        finally:
            client.close()
        assert proc.proc is not None and proc.proc.poll() is None


def test_unknown_op_is_refused_with_its_code(cache_settings: CacheSettings) -> None:
    assert cache_settings.registry_root is not None
    with MetaProcess(cache_settings):
        client = Client(name="cache-meta", registry=Registry(cache_settings.registry_root))
        try:
            with pytest.raises(LlamadError) as err:
                client.call("drop_everything", {})
            assert err.value.code == "unknown_op"
        finally:
            client.close()


def test_a_release_cast_frees_its_pin_and_a_malformed_one_is_dropped(
    cache_settings: CacheSettings,
) -> None:
    with MetaProcess(cache_settings) as proc, CacheClient.from_settings(cache_settings) as cache:
        key = put(cache, cache_settings, 7)
        ref = cache.lookup_exact(key)
        assert ref is not None and ref.pin is not None
        assert cache.status()["pins"] == 1
        # A cast has no answer to refuse with: a malformed one is dropped, and
        # cache-meta reads the next message as ever.
        cache._client.cast("release", {"pin": -1})
        cache.release(ref.pin)
        # Casts and calls on one connection arrive in the order sent.
        assert cache.status()["pins"] == 0
        cache.release(ref.pin)  # a pin released twice: nothing to free
        assert cache.status()["pins"] == 0
        assert proc.proc is not None and proc.proc.poll() is None


def test_meta_hit_counts_persist_across_a_restart_and_keep_popular_rows(
    cache_settings: CacheSettings,
) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        popular = put(cache, cache_settings, 1)
        others = [put(cache, cache_settings, seed) for seed in (2, 3, 4)]
        for _ in range(5):
            ref = cache.lookup_exact(popular)
            assert ref is not None
            cache.checkin(ref.pin)
        # The others are used once each, after it: by recency alone the
        # popular row would be the first to go.
        for key in others:
            assert cache.lookup_exact(key, pin=False) is not None
    # SIGTERM wrote the hit counts back into the file headers.
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        hits = {bytes.fromhex(r["key"]): r["hits"] for r in cache.dump()}
        assert hits[popular] == 5
        # The popular row is the least recently used, yet it survives an
        # eviction walk that takes three rows.
        rows, _ = cache.evict_bytes(1, [TierKind.DISK])
        rows2, _ = cache.evict_bytes(1, [TierKind.DISK])
        rows3, _ = cache.evict_bytes(1, [TierKind.DISK])
        assert rows == rows2 == rows3 == 1
        left = {bytes.fromhex(r["key"]) for r in cache.dump()}
        assert left == {popular}
        assert not set(others) & left


def test_gc_drops_rows_whose_files_were_deleted_underneath(cache_settings: CacheSettings) -> None:
    # No disk copies written behind: one that landed before the unlink would
    # rightly keep its row (its other copy), and whether it did is a race.
    cache_settings = msgspec.structs.replace(cache_settings, write_behind=False)
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        gone = put(cache, cache_settings, 9, tier=TierKind.RAM_FILE)
        kept = put(cache, cache_settings, 10, tier=TierKind.RAM_FILE)
        cfg = cache_settings.tier(TierKind.RAM_FILE)
        assert cfg is not None
        os.unlink(Tier(cfg).path_for(gone))
        report = cache.gc()
        assert report == GcResult(evicted=0, bytes_freed=0, missing=1, reaped=0)
        assert {bytes.fromhex(r["key"]) for r in cache.dump()} == {kept}


def test_pressure_check_over_the_wire_reports_and_respects_disabled(
    cache_settings: CacheSettings,
) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        report = cache.pressure_check()
        assert report["action"] == "disabled" and 0 < report["ratio"] <= 1
        assert cache.status()["pressure"]["enabled"] is False
    enabled = msgspec.structs.replace(
        cache_settings, pressure=PressureConfig(enabled=True, source="noop")
    )
    with MetaProcess(enabled), CacheClient.from_settings(enabled) as cache:
        assert cache.pressure_check()["action"] == "no_reading"


def test_rebuild_adopts_files_and_deletes_tmp_leftovers(cache_settings: CacheSettings) -> None:
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        key = put(cache, cache_settings, 11, tier=TierKind.RAM_FILE)
    cfg = cache_settings.tier(TierKind.RAM_FILE)
    assert cfg is not None
    tier = Tier(cfg)
    leftover = Path(tier.tmp_path_for(key, "deadwriter"))
    leftover.write_bytes(b"half a save")
    with MetaProcess(cache_settings), CacheClient.from_settings(cache_settings) as cache:
        assert cache.lookup_exact(key, pin=False) is not None
        assert not leftover.exists()


def test_sigterm_right_after_ready_stops_cache_meta_cleanly(cache_settings: CacheSettings) -> None:
    # READY is announced only once SIGTERM is wired to a clean stop, so a stop
    # sent at once exits 0 (hit counts flushed) instead of dying by the signal.
    for _ in range(3):
        assert MetaProcess(cache_settings).start().stop() == 0
