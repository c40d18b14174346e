"""The publish protocol, writer side (SPEC C5), against an in-process CacheMeta."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from llamad.cache.counters import DictCounters
from llamad.cache.errors import TierFull
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcLogits, KvcSpec, SaveReason, encode_kvc, parse
from llamad.cache.meta import CacheMeta, MetaConfig
from llamad.cache.publish import (
    LocalMeta,
    PublishOutcome,
    PublishStage,
    new_writer_id,
    publish,
)
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier, TierConfig, TierStore, build_tiers

pytestmark = pytest.mark.timeout(60)

NS = Namespace(fingerprint=b"\x41" * 32, quant=3, ctx_hash=b"\x51" * 32)
PAYLOAD = bytes(range(256)) * 40


def spec_for(tokens: list[int], detail: str = "") -> KvcSpec:
    return KvcSpec(
        NS, tokens_to_bytes(tokens), FingerprintMode.SAFE, SaveReason.FINISH, reason_detail=detail
    )


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class World:
    """A disk tier, a real CacheMeta over it, and a writer's view of that meta."""

    def __init__(self, root: Path, quota: int = 1 << 30) -> None:
        self.tier = Tier(TierConfig(TierKind.DISK, root, quota))
        self.tier.prepare()
        self.counters = DictCounters()
        self.clock = Clock()
        self.meta = CacheMeta(
            MetaConfig(quotas={TierKind.DISK: quota}, reservation_ttl_s=30.0),
            TierStore(build_tiers([self.tier.config])),
            counters=self.counters,
            clock=self.clock,
        )
        self.writer = LocalMeta(self.meta, owner=101)

    def files(self) -> list[str]:
        return sorted(p.name for p in self.tier.root.iterdir())

    def assert_row_is(self, spec: KvcSpec, payload: bytes) -> None:
        ref = self.meta.lookup_exact(spec.key)
        assert ref is not None
        assert ref.location == self.tier.location_for(spec.key)
        meta, body = parse(Path(ref.location).read_bytes(), expected_key=spec.key)
        assert bytes(body) == payload
        assert ref.file_size == meta.file_size


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    yield World(tmp_path / "disk")


def test_publish_makes_a_row_that_lookups_find(world: World) -> None:
    spec = spec_for([1, 2, 3])
    result = publish(world.writer, world.tier, spec, PAYLOAD)
    assert result.outcome is PublishOutcome.PUBLISHED
    assert result.stored
    world.assert_row_is(spec, PAYLOAD)
    assert world.files() == [f"{spec.key.hex()}.kvc"]
    assert world.meta.reservations == {}
    assert world.counters.get("saves_finish") == 1


def test_stage_hooks_run_in_protocol_order(world: World) -> None:
    seen: list[PublishStage] = []
    publish(world.writer, world.tier, spec_for([1]), PAYLOAD, on_stage=lambda s, k: seen.append(s))
    assert seen == list(PublishStage)


def test_eexist_adopts_matching_file(world: World) -> None:
    spec = spec_for([1, 2, 3])
    orphan = bytes(reversed(PAYLOAD))  # same key and size, written by a writer that died
    world.tier.path_for(spec.key).write_bytes(encode_kvc(spec, orphan))
    result = publish(world.writer, world.tier, spec, PAYLOAD)
    assert result.outcome is PublishOutcome.ADOPTED
    world.assert_row_is(spec, orphan)
    assert world.files() == [f"{spec.key.hex()}.kvc"]


@pytest.mark.parametrize("occupant", ["junk", "other_key", "other_size"])
def test_eexist_replaces_junk_or_another_keys_file(world: World, occupant: str) -> None:
    spec = spec_for([1, 2, 3])
    final = world.tier.path_for(spec.key)
    if occupant == "junk":
        final.write_bytes(b"\x00" * 5000)
    elif occupant == "other_key":
        final.write_bytes(encode_kvc(spec_for([9, 9]), PAYLOAD))
    else:
        final.write_bytes(encode_kvc(spec, PAYLOAD + b"x"))  # same key, another size
    result = publish(world.writer, world.tier, spec, PAYLOAD)
    assert result.outcome is PublishOutcome.PUBLISHED
    world.assert_row_is(spec, PAYLOAD)
    assert world.files() == [final.name]


def test_second_save_of_a_cached_key_writes_nothing(world: World) -> None:
    spec = spec_for([1, 2, 3])
    publish(world.writer, world.tier, spec, PAYLOAD)
    seen: list[PublishStage] = []
    result = publish(world.writer, world.tier, spec, PAYLOAD, on_stage=lambda s, k: seen.append(s))
    assert result.outcome is PublishOutcome.DUPLICATE
    assert seen == []
    assert world.counters.get("duplicate_dropped") == 1


def test_concurrent_writers_of_one_key_exactly_one_publishes(world: World) -> None:
    spec = spec_for(list(range(100)))
    barrier = threading.Barrier(6)
    results = []
    lock = threading.Lock()

    def save(i: int) -> None:
        barrier.wait(10)
        payload = bytes([i]) * len(PAYLOAD)
        r = publish(LocalMeta(world.meta, owner=200 + i), world.tier, spec, payload)
        with lock:
            results.append((r, payload))

    threads = [threading.Thread(target=save, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    outcomes = sorted(r.outcome for r, _ in results)
    assert outcomes.count(PublishOutcome.PUBLISHED) == 1
    assert outcomes.count(PublishOutcome.DUPLICATE) == 5
    (winner,) = [p for r, p in results if r.outcome is PublishOutcome.PUBLISHED]
    world.assert_row_is(spec, winner)
    assert world.files() == [f"{spec.key.hex()}.kvc"]
    assert world.meta.reservations == {}


def test_superseded_writer_abandons_and_removes_its_tmp(world: World) -> None:
    spec = spec_for([5, 6])
    late = LocalMeta(world.meta, owner=300)
    results = []

    def on_stage(stage: PublishStage, key: bytes) -> None:
        if stage is PublishStage.WRITTEN:
            # The first writer stalls past its TTL; another writer takes over.
            world.clock.now += 31
            results.append(publish(late, world.tier, spec, PAYLOAD))

    first = publish(world.writer, world.tier, spec, bytes(len(PAYLOAD)), on_stage=on_stage)
    assert first.outcome is PublishOutcome.ABANDONED
    assert results[0].outcome is PublishOutcome.PUBLISHED
    world.assert_row_is(spec, PAYLOAD)
    assert world.files() == [f"{spec.key.hex()}.kvc"]
    assert world.meta.reservations == {}


def test_write_failure_cancels_the_reservation_and_leaves_no_tmp(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    spec = spec_for([1])
    with pytest.raises(TierFull):
        publish(world.writer, world.tier, spec, PAYLOAD)
    assert world.meta.reservations == {}
    assert world.files() == []
    monkeypatch.undo()
    assert publish(world.writer, world.tier, spec, PAYLOAD).outcome is PublishOutcome.PUBLISHED


def test_a_save_larger_than_the_quota_is_refused_before_writing(tmp_path: Path) -> None:
    world = World(tmp_path / "disk", quota=4096)
    result = publish(world.writer, world.tier, spec_for([1]), PAYLOAD)
    assert result.outcome is PublishOutcome.REFUSED
    assert world.files() == []
    assert world.counters.get("saves_dropped") == 1


def test_a_row_with_logits_asks_the_quota_for_its_whole_file(tmp_path: Path) -> None:
    # The logits a row keeps (a vocabulary's float32s) lie before the payload:
    # the reservation, the quota and the ledger count them like the rest.
    logits = KvcLogits(1, bytes(4 * 20_000))
    plain, kept = spec_for([1, 2]), replace(spec_for([1, 2]), logits=logits)
    plain_size, kept_size = plain.file_size(len(PAYLOAD)), kept.file_size(len(PAYLOAD))
    assert kept_size == kept.payload_offset() + len(PAYLOAD) > plain_size
    assert kept.payload_offset() > len(logits.values)
    tight = World(tmp_path / "tight", quota=kept_size - 1)
    assert publish(tight.writer, tight.tier, kept, PAYLOAD).outcome is PublishOutcome.REFUSED
    assert tight.files() == []
    assert publish(tight.writer, tight.tier, plain, PAYLOAD).outcome is PublishOutcome.PUBLISHED
    roomy = World(tmp_path / "roomy", quota=kept_size)
    result = publish(roomy.writer, roomy.tier, kept, PAYLOAD)
    assert result.outcome is PublishOutcome.PUBLISHED and result.size == kept_size
    roomy.assert_row_is(kept, PAYLOAD)
    assert roomy.tier.path_for(kept.key).stat().st_size == kept_size
    assert roomy.meta.status()["tiers"][TierKind.DISK]["used"] == kept_size
    assert roomy.tier.read_meta(kept.key).logits == logits


def test_writer_ids_are_unique_and_file_safe() -> None:
    ids = {new_writer_id() for _ in range(1000)}
    assert len(ids) == 1000
    Tier(TierConfig(TierKind.DISK, Path("/x"), 1)).tmp_path_for(b"\x00" * 32, ids.pop())
