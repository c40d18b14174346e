"""The mover's file work (SPEC C12): a link on one filesystem, a crash-safe copy across.

Real tier files: ``ram`` segments and a ``ram_file`` directory in ``/dev/shm``
(one tmpfs), ``disk`` under the test's tmp directory (another filesystem).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache.activity import CopyActivity
from llamad.cache.counters import DictCounters
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import HEADER_LEN, KvcSpec, SaveReason, encode_kvc
from llamad.cache.mover import Mover, MoveStage, move_file
from llamad.cache.moves import MoveJob, MoveKind, MoveResult
from llamad.cache.ram_purge import purge_ram
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import SHM_ROOT, Tier, TierConfig
from llamad.testing import discard_scratch, scratch_settings

pytestmark = pytest.mark.timeout(60)

NS = Namespace(fingerprint=b"\x52" * 32, quant=3, ctx_hash=b"\x53" * 32)
PAYLOAD = bytes(range(256)) * 4000  # ~1 MB: several sendfile calls are not needed, one is


@pytest.fixture
def tiers(tmp_path: Path) -> Iterator[dict[TierKind, Tier]]:
    instance = f"mv{uuid.uuid4().hex[:12]}"
    made = {
        TierKind.RAM: Tier(TierConfig(TierKind.RAM, SHM_ROOT, 1 << 30, instance)),
        TierKind.RAM_FILE: Tier(TierConfig(TierKind.RAM_FILE, SHM_ROOT / instance, 1 << 30)),
        TierKind.DISK: Tier(TierConfig(TierKind.DISK, tmp_path / "disk", 1 << 30)),
    }
    for tier in made.values():
        tier.prepare()
    yield made
    made[TierKind.RAM].purge()
    made[TierKind.RAM_FILE].purge()
    (SHM_ROOT / instance).rmdir()


def put(tier: Tier, seed: int) -> KvcSpec:
    spec = KvcSpec(NS, tokens_to_bytes([seed, 1, 2, 3]), FingerprintMode.SAFE, SaveReason.FINISH)
    tier.path_for(spec.key).write_bytes(encode_kvc(spec, PAYLOAD))
    return spec


def job(src: Tier, dst: Tier, spec: KvcSpec, n: int = 1) -> MoveJob:
    return MoveJob(n, MoveKind.DEMOTE, spec.key, src.name, src.location_for(spec.key), dst.name, 0)


def tmp_files(tier: Tier) -> list[str]:
    return [p.name for p in tier.root.iterdir() if p.name.endswith(".tmp")]


def test_a_move_on_one_filesystem_is_a_link(tiers: dict[TierKind, Tier]) -> None:
    ram, ram_file = tiers[TierKind.RAM], tiers[TierKind.RAM_FILE]
    spec = put(ram, 1)
    result = move_file(ram, ram_file, job(ram, ram_file, spec))
    assert result.ok and result.linked
    assert result.location == ram_file.location_for(spec.key)
    assert os.stat(result.location).st_ino == os.stat(ram.path_for(spec.key)).st_ino
    assert result.size == ram.path_for(spec.key).stat().st_size
    assert ram_file.read_meta(spec.key).key == spec.key


def test_a_move_across_filesystems_is_a_complete_copy_and_leaves_no_tmp(
    tiers: dict[TierKind, Tier],
) -> None:
    ram, disk = tiers[TierKind.RAM], tiers[TierKind.DISK]
    spec = put(ram, 2)
    stages: list[MoveStage] = []
    result = move_file(ram, disk, job(ram, disk, spec), hook=lambda s, j: stages.append(s))
    assert result.ok and not result.linked
    assert stages == [MoveStage.VALIDATED, MoveStage.WRITTEN, MoveStage.LINKED, MoveStage.SYNCED]
    assert disk.path_for(spec.key).read_bytes() == ram.path_for(spec.key).read_bytes()
    assert os.stat(result.location).st_ino != os.stat(ram.path_for(spec.key)).st_ino  # type: ignore[arg-type]
    assert tmp_files(disk) == []


def test_a_copy_is_not_under_its_final_name_before_it_is_complete(
    tiers: dict[TierKind, Tier],
) -> None:
    ram, disk = tiers[TierKind.RAM], tiers[TierKind.DISK]
    spec = put(ram, 3)
    seen: dict[MoveStage, tuple[bool, list[str]]] = {}

    def look(stage: MoveStage, j: MoveJob) -> None:
        seen[stage] = (disk.path_for(spec.key).exists(), tmp_files(disk))

    assert move_file(ram, disk, job(ram, disk, spec), hook=look).ok
    assert seen[MoveStage.VALIDATED] == (False, [])
    written_final, written_tmp = seen[MoveStage.WRITTEN]
    assert not written_final and len(written_tmp) == 1  # whole and fdatasync'ed, not yet linked
    assert seen[MoveStage.LINKED] == (True, [])


def test_a_damaged_source_is_deleted_counted_once_and_never_spread(
    tiers: dict[TierKind, Tier],
) -> None:
    ram, disk = tiers[TierKind.RAM], tiers[TierKind.DISK]
    spec = put(ram, 4)
    path = ram.path_for(spec.key)
    data = bytearray(path.read_bytes())
    data[HEADER_LEN + 3] ^= 0xFF  # inside the TLV
    path.write_bytes(bytes(data))
    counters = DictCounters()
    result = move_file(ram, disk, job(ram, disk, spec), counters=counters)
    assert not result.ok and result.source_damaged
    assert not path.exists() and not disk.path_for(spec.key).exists()
    assert counters.get("corrupt_files") == 1


def test_a_payload_damaged_after_it_was_written_is_found_by_a_copy_and_never_spread(
    tiers: dict[TierKind, Tier],
) -> None:
    # Header and TLV intact: only the copy's pass over the payload can tell.
    ram, disk = tiers[TierKind.RAM], tiers[TierKind.DISK]
    spec = put(ram, 8)
    path = ram.path_for(spec.key)
    with open(path, "r+b") as f:
        f.seek(-10, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-10, os.SEEK_END)
        f.write(bytes((byte ^ 0x40,)))
    counters = DictCounters()
    result = move_file(ram, disk, job(ram, disk, spec), counters=counters)
    assert not result.ok and result.source_damaged
    assert not path.exists() and not disk.path_for(spec.key).exists()
    assert tmp_files(disk) == [] and counters.get("corrupt_files") == 1


def test_a_missing_source_is_a_failed_move(tiers: dict[TierKind, Tier]) -> None:
    ram, disk = tiers[TierKind.RAM], tiers[TierKind.DISK]
    spec = put(ram, 5)
    ram.delete(spec.key)
    result = move_file(ram, disk, job(ram, disk, spec))
    assert not result.ok and result.source_missing


@pytest.mark.parametrize("kind", [TierKind.RAM_FILE, TierKind.DISK])
def test_a_final_file_left_by_a_crash_is_adopted_when_valid_and_replaced_when_not(
    tiers: dict[TierKind, Tier], kind: TierKind
) -> None:
    ram, dst = tiers[TierKind.RAM], tiers[kind]
    spec = put(ram, 6)
    put(dst, 6)  # a copy made before a crash, never indexed
    assert move_file(ram, dst, job(ram, dst, spec)).ok
    dst.path_for(spec.key).write_bytes(b"junk")
    result = move_file(ram, dst, job(ram, dst, spec, 2))
    assert result.ok
    assert dst.path_for(spec.key).read_bytes() == ram.path_for(spec.key).read_bytes()
    assert tmp_files(dst) == []


def test_a_stop_ends_a_copy_and_removes_its_tmp(tiers: dict[TierKind, Tier]) -> None:
    ram, disk = tiers[TierKind.RAM], tiers[TierKind.DISK]
    spec = put(ram, 7)
    result = move_file(ram, disk, job(ram, disk, spec), stopping=lambda: True)
    assert not result.ok and result.error == "stopped"
    assert tmp_files(disk) == [] and not disk.path_for(spec.key).exists()


def test_the_mover_runs_jobs_on_its_threads_and_reports_through_its_fd(
    tiers: dict[TierKind, Tier],
) -> None:
    ram = tiers[TierKind.RAM]
    mover = Mover(tiers)
    try:
        specs = [put(ram, 10 + i) for i in range(4)]
        jobs = [
            job(ram, tiers[TierKind.RAM_FILE if i % 2 else TierKind.DISK], spec, n=i + 1)
            for i, spec in enumerate(specs)
        ]
        for j in jobs:
            mover.submit(j)
        done: list[MoveResult] = []
        while len(done) < len(jobs):
            assert mover.wait(30), "the mover never reported"
            done.extend(mover.drain())
        by_id = {r.job_id: r for r in done}
        assert all(r.ok for r in done)
        assert [by_id[j.id].linked for j in jobs] == [False, True, False, True]
        # After a stop, a submitted job fails at once instead of waiting forever.
        mover.stop()
        mover.submit(jobs[0])
        [late] = mover.drain()
        assert late.error == "stopped"
    finally:
        mover.close()


def test_a_copy_is_marked_on_the_activity_board_and_a_link_is_not(
    tiers: dict[TierKind, Tier], tmp_path: Path
) -> None:
    """What a model worker's governor reads: a copy takes a core for tens of
    ms (its short steps take half the threads meanwhile); a link is instant."""
    ram = tiers[TierKind.RAM]
    board = CopyActivity.create(tmp_path / "copies")
    reader = CopyActivity.attach(tmp_path / "copies")
    assert reader is not None
    seen: dict[TierKind, int | None] = {}

    def hook(stage: MoveStage, j: MoveJob) -> None:
        if stage is MoveStage.VALIDATED:
            seen[j.dst_tier] = reader.quiet_epoch()

    mover = Mover(tiers, hook=hook, activity=board)
    try:
        before = reader.quiet_epoch()
        for i, dst in enumerate((TierKind.RAM_FILE, TierKind.DISK)):
            mover.submit(job(ram, tiers[dst], put(ram, 40 + i), n=i + 1))
            assert mover.wait(30), "the mover never reported"
            assert all(r.ok for r in mover.drain())
        assert seen[TierKind.RAM_FILE] == before  # the link lane marks nothing
        assert seen[TierKind.DISK] is None  # during the copy
        assert reader.quiet_epoch() == (before or 0) + 2  # begun and ended
    finally:
        mover.close()
        reader.close()
        board.close()


def test_purge_ram_links_leftover_segments_into_ram_file_first() -> None:
    settings = scratch_settings(prefix="lpr")
    try:
        tiers = {cfg.kind: Tier(cfg) for cfg in settings.tiers}
        for tier in tiers.values():
            tier.prepare()
        ram, ram_file, disk = tiers[TierKind.RAM], tiers[TierKind.RAM_FILE], tiers[TierKind.DISK]
        left = put(ram, 20)  # a crashed run's row
        below = put(ram, 21)
        put(disk, 21)  # already has a slower copy: nothing to do
        inode = ram.path_for(left.key).stat().st_ino
        (ram.root / (ram.prefix + left.key.hex() + ".kvc.w1.tmp")).write_bytes(b"x")
        assert purge_ram(settings) == 3
        assert ram.row_keys() == [] and tmp_files(ram) == []
        assert ram_file.path_for(left.key).stat().st_ino == inode  # a link, no copy
        assert not ram_file.path_for(below.key).exists()
        assert disk.path_for(below.key).exists()
    finally:
        discard_scratch(settings)
