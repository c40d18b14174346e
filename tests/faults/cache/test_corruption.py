"""Published rows damaged on disk are never restored (SPEC C2, C3).

Rows go through the real publish protocol into each tier; then bytes are
flipped or cut off underneath cache-meta. A load must report a miss, count
``corrupt_files``, hand out none of the row's bytes, and the row must be gone
for the next lookup.

The caller's buffer starts out holding a sentinel pattern (never zeros, so
"untouched" and "zeroed" differ). Damage found before the payload leaves it
exactly as it was; a payload checksum mismatch is only known once the
payload has been copied (one pass over the bytes), and then exactly the
copied span is zeroed and the rest is still the sentinel.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from llamad.cache.client import CacheClient
from llamad.cache.counters import Counters
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import HEADER_LEN, KvcSpec, SaveReason
from llamad.cache.meta import CacheMeta, MetaConfig
from llamad.cache.publish import LocalMeta, PublishOutcome, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier, TierConfig, TierStore, build_tiers, load
from llamad.testing import MetaProcess
from llamad.tiers import LOCAL_TIERS
from meta_fixtures import cache_settings_fixture  # noqa: F401  (the cache_settings fixture)

pytestmark = pytest.mark.timeout(120)

NS = Namespace(fingerprint=b"\xa1" * 32, quant=3, ctx_hash=b"\xb1" * 32)
PAYLOAD = random.Random(7).randbytes(64 * 1024)


def sentinel(n: int) -> bytearray:
    """``n`` bytes of a position-dependent pattern with no zero byte."""
    return bytearray((i * 7 + 0xA5) % 255 + 1 for i in range(n))


def after_rejection(before: bytes, payload_damaged: bool, payload_len: int) -> bytes:
    """What a rejected load must leave in a buffer that held ``before``."""
    if not payload_damaged:
        return before
    return bytes(payload_len) + before[payload_len:]


class Cache:
    def __init__(self, tmp_path: Path) -> None:
        self.counters = Counters.create(tmp_path / "counters")
        self.tiers = build_tiers(
            [
                TierConfig(TierKind.RAM, Path("/dev/shm"), 1 << 30, f"c{uuid.uuid4().hex[:12]}"),
                TierConfig(TierKind.RAM_FILE, tmp_path / "ram_file", 1 << 30),
                TierConfig(TierKind.DISK, tmp_path / "disk", 1 << 30),
            ]
        )
        for tier in self.tiers.values():
            tier.prepare()
        self.meta = CacheMeta(
            MetaConfig(quotas={name: 1 << 30 for name in self.tiers}),
            TierStore(self.tiers, self.counters),
            counters=self.counters,
        )
        self.writer = LocalMeta(self.meta, owner=11)
        self._n = 0

    def save(self, tier: TierKind) -> KvcSpec:
        self._n += 1
        spec = KvcSpec(
            NS, tokens_to_bytes([self._n, *range(300)]), FingerprintMode.SAFE, SaveReason.COLD
        )
        result = publish(self.writer, self.tiers[tier], spec, PAYLOAD)
        assert result.outcome is PublishOutcome.PUBLISHED
        return spec

    def restore(self, key: bytes, *, payload_damaged: bool = False) -> bytes | None:
        """What a model worker does: pinned lookup, load, forget on a miss, checkin."""
        ref = self.meta.lookup_exact(key, owner=22)
        if ref is None:
            return None
        assert ref.pin is not None
        buf = sentinel(ref.file_size)
        before = bytes(buf)
        try:
            n = load(self.tiers[ref.tier], ref.location, buf, self.counters)
            if n is None:
                self.meta.forget(key)
                expected = after_rejection(before, payload_damaged, len(PAYLOAD))
                assert buf == expected, "a rejected load left row bytes or wrote outside its span"
                return None
            return bytes(buf[:n])
        finally:
            self.meta.checkin(ref.pin)

    def close(self) -> None:
        for tier in self.tiers.values():
            if tier.kind is TierKind.RAM:
                tier.purge()
        self.counters.close()


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Cache]:
    c = Cache(tmp_path)
    yield c
    c.close()


def damage_points(file_size: int, payload_offset: int) -> list[tuple[str, int]]:
    rnd = random.Random(file_size)
    flips = [
        0,
        9,
        HEADER_LEN - 1,
        HEADER_LEN + 3,
        payload_offset - 1,
        payload_offset,
        file_size - 1,
    ]
    flips += [rnd.randrange(file_size) for _ in range(8)]
    cuts = [0, HEADER_LEN - 1, HEADER_LEN + 10, payload_offset, file_size - 1]
    return [("flip", i) for i in flips] + [("cut", n) for n in cuts]


@pytest.mark.parametrize("loaded_before", [False, True], ids=["fresh", "loaded_before"])
@pytest.mark.parametrize("tier", LOCAL_TIERS)
def test_damaged_rows_load_as_misses_and_are_counted(
    cache: Cache, tier: TierKind, loaded_before: bool
) -> None:
    # loaded_before: the row was restored once before the damage, so this
    # process keeps a ram row mapped and its next load goes through that
    # mapping (it once served damage there as a hit).
    probe = cache.save(tier)
    meta = cache.tiers[tier].read_meta(probe.key)
    assert cache.restore(probe.key) == PAYLOAD

    points = damage_points(meta.file_size, meta.payload_offset)
    for n, (how, where) in enumerate(points, start=1):
        spec = cache.save(tier)
        path = cache.tiers[tier].path_for(spec.key)
        if loaded_before:
            assert cache.restore(spec.key) == PAYLOAD
        if how == "flip":
            with open(path, "r+b") as f:
                f.seek(where)
                byte = f.read(1)[0]
                f.seek(where)
                f.write(bytes([byte ^ (1 << (where % 8))]))
        else:
            os.truncate(path, where)
        payload_damaged = how == "flip" and where >= meta.payload_offset
        restored = cache.restore(spec.key, payload_damaged=payload_damaged)
        assert restored is None, f"{how} at {where} was restored"
        assert cache.counters.get("corrupt_files") == n
        assert not path.exists()
        assert cache.meta.lookup_exact(spec.key) is None

    # Undamaged neighbours are unaffected.
    assert cache.restore(probe.key) == PAYLOAD


def test_a_damaged_row_is_a_miss_through_the_real_cache_meta(cache_settings: CacheSettings) -> None:
    # What a model worker sees: resolve (pinned), load_into -> None, and the
    # copy is forgotten by cache-meta, so no later lookup offers it again.
    # Each row here has its one copy: no write-behind copy to disk (a row
    # with another copy keeps it, test_forget_names_the_copy_and_keeps_the_others).
    cache_settings = msgspec.structs.replace(cache_settings, write_behind=False)
    with MetaProcess(cache_settings):
        counters = Counters.attach(cache_settings.counters_path)
        cache = CacheClient.from_settings(cache_settings, counters=counters)
        try:
            for n, name in enumerate(LOCAL_TIERS, start=1):
                cfg = cache_settings.tier(name)
                assert cfg is not None
                tier = Tier(cfg)
                tokens = [n, *range(400)]
                spec = KvcSpec(NS, tokens_to_bytes(tokens), FingerprintMode.SAFE, SaveReason.COLD)
                assert publish(cache, tier, spec, PAYLOAD).outcome is PublishOutcome.PUBLISHED
                meta = tier.read_meta(spec.key)
                with open(tier.path_for(spec.key), "r+b") as f:
                    f.seek(meta.payload_offset + 1000)
                    f.write(b"\xff")
                found = cache.resolve(NS, tokens)
                assert found.row is not None and found.row.key == spec.key
                buf = sentinel(found.row.file_size)
                before = bytes(buf)
                with cache.pinned(found.row):
                    assert cache.load_into(found.row, buf) is None
                # Damage in the payload: exactly the copied span is zeroed.
                assert buf == after_rejection(before, True, len(PAYLOAD))
                assert cache.counters()["corrupt_files"] == n
                assert cache.lookup_exact(spec.key, pin=False) is None
                assert not tier.path_for(spec.key).exists()
            assert cache.status()["pins"] == 0
        finally:
            cache.close()
            counters.close()
