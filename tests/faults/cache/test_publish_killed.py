"""A writer process SIGKILLed after each publish stage leaves nothing broken (SPEC C5, C6).

The writer runs in its own process (spawned, with a WriterPool and the
daemon-wide permits) and kills itself with SIGKILL right after the chosen
stage. cache-meta's state machine runs in this process and hears the
writer's calls over a pipe; when the pipe breaks it does what the cache-meta
process does when a monitored owner dies: ``owner_down(pid)``. Afterwards the
key is either absent, or present and valid; no reservation or permit leaks;
no ``*.tmp`` survives the next scan; a post-link orphan is adopted; and a new
writer can save the key.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
from collections.abc import Collection
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from llamad.cache.counters import DictCounters
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason, parse
from llamad.cache.meta import CacheMeta, MetaConfig
from llamad.cache.publish import LocalMeta, PublishOutcome, PublishStage, publish
from llamad.cache.reservation import Grant, SaveIntent
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier, TierConfig, TierStore, build_tiers
from llamad.cache.writer import PermitSet, WriterPool
from llamad.errors import LlamadError, from_wire

pytestmark = [pytest.mark.timeout(120)]

NS = Namespace(fingerprint=b"\x81" * 32, quant=3, ctx_hash=b"\x91" * 32)
TOKENS = list(range(1000, 1600))
PAYLOAD = bytes(range(256)) * 2000


def make_spec() -> KvcSpec:
    return KvcSpec(NS, tokens_to_bytes(TOKENS), FingerprintMode.SAFE, SaveReason.FINISH)


class PipeMeta:
    """The writer's PublishMeta, forwarded over a pipe to the test's CacheMeta."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def _call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        self.conn.send((op, args, kwargs))
        ok, value = self.conn.recv()
        if not ok:
            raise from_wire(value)
        return value

    def reserve(self, intent: SaveIntent, *, tiers: Collection[TierKind] | None = None) -> Grant:
        token: int = self._call("reserve_save", intent)
        assert intent.tier is not None
        return Grant(token, intent.tier)

    def check_reservation(self, key: bytes, token: int) -> None:
        self._call("check_reservation", key, token)

    def mark_published(self, key: bytes, token: int, location: str) -> None:
        self._call("mark_published", key, token, location)

    def announce_saved(
        self, key: bytes, token: int, *, location: str | None = None, size: int | None = None
    ) -> object:
        return self._call("announce_saved", key, token, location=location, size=size)

    def cancel_reservation(self, key: bytes, token: int) -> bool:
        cancelled: bool = self._call("cancel_reservation", key, token)
        return cancelled


def writer_main(root: str, permits: str, kill_after: int, conn: Connection) -> None:
    tier = Tier(TierConfig(TierKind.DISK, Path(root), 1 << 30))

    def die(stage: PublishStage, key: bytes) -> None:
        if stage == kill_after:
            os.kill(os.getpid(), signal.SIGKILL)

    meta = PipeMeta(conn)
    pool = WriterPool(lambda: meta, {TierKind.DISK: tier}, PermitSet.attach(permits), on_stage=die)
    pool.save_sync(make_spec(), TierKind.DISK, PAYLOAD, timeout_s=30)
    os._exit(3)  # never reached when the stage kills us


def serve_until_writer_dies(meta: CacheMeta, conn: Connection, pid: int) -> None:
    while True:
        try:
            op, args, kwargs = conn.recv()
        except EOFError:
            break
        if op == "reserve_save":
            args = (*args, pid)
        try:
            conn.send((True, getattr(meta, op)(*args, **kwargs)))
        except LlamadError as exc:
            conn.send((False, exc.to_wire()))
    meta.owner_down(pid)  # what cache-meta does when its monitor fires


@pytest.mark.parametrize(
    "stage",
    [
        PublishStage.RESERVED,
        PublishStage.WRITTEN,
        PublishStage.CHECKED,
        PublishStage.LINKED,
        PublishStage.SYNCED,
    ],
    ids=lambda s: s.name.lower(),
)
def test_writer_killed_after_each_stage_leaves_a_consistent_cache(
    tmp_path: Path, stage: PublishStage
) -> None:
    tier = Tier(TierConfig(TierKind.DISK, tmp_path / "disk", 1 << 30))
    tier.prepare()
    meta = CacheMeta(
        MetaConfig(quotas={TierKind.DISK: 1 << 30}),
        TierStore(build_tiers([tier.config])),
        counters=DictCounters(),
    )
    permits = PermitSet.create(tmp_path / "permits", 2)
    spec = make_spec()

    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe()
    child = ctx.Process(target=writer_main, args=(str(tier.root), str(permits.path), stage, theirs))
    child.start()
    theirs.close()
    try:
        assert child.pid is not None
        serve_until_writer_dies(meta, ours, child.pid)
        child.join(60)
        assert child.exitcode == -signal.SIGKILL
    finally:
        if child.is_alive():
            child.kill()
            child.join(30)

    # No reservation and no permit outlive the writer.
    assert meta.reservations == {}
    assert permits.held() == 0

    # The key is present and valid exactly when the writer got past link(2).
    ref = meta.lookup_exact(spec.key)
    if stage >= PublishStage.LINKED:
        assert ref is not None, "a post-link orphan must be adopted"
        _, body = parse(Path(ref.location).read_bytes(), expected_key=spec.key)
        assert bytes(body) == PAYLOAD
    else:
        assert ref is None
        assert not tier.path_for(spec.key).exists()

    # The next scan leaves no tmp file and finds exactly the published row.
    scanned = [m.key for m in tier.scan()]
    assert not [p for p in tier.root.iterdir() if p.name.endswith(".tmp")]
    assert scanned == ([spec.key] if stage >= PublishStage.LINKED else [])

    # And a new writer can save the key (or finds it already there).
    again = publish(LocalMeta(meta, owner=7), tier, spec, PAYLOAD)
    expected = (
        PublishOutcome.DUPLICATE if stage >= PublishStage.LINKED else PublishOutcome.PUBLISHED
    )
    assert again.outcome is expected
