"""cache-meta killed in the middle of a move between tiers (SPEC C5, C12).

A real cache-meta process (``meta_fault_child.py meta``) SIGKILLs itself
right after its mover's first demotion or write-behind copy reaches a chosen
stage: source validated, tmp file written and fdatasync'ed, final name
linked, directory synced. Then a fresh cache-meta starts on the same tiers,
as its supervisor would: every row announced before the kill is served and
loads byte-exact, and no ``*.tmp`` file survives its scan. A second test
holds the mover at each stage instead of killing it and looks at the index
meanwhile: a copy is never indexed before it is complete, linked and synced.
"""

from __future__ import annotations

import dataclasses
import json
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import msgspec
import pytest

from llamad.cache.client import CacheClient
from llamad.cache.meta_proc import MetaServer
from llamad.cache.mover import MoveStage
from llamad.cache.moves import MoveJob, MoveKind
from llamad.cache.publish import PublishOutcome, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.errors import LlamadError
from llamad.testing import MetaProcess
from meta_fault_child import row_payload, row_spec
from meta_fixtures import cache_settings_fixture  # noqa: F401  (the cache_settings fixture)

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

CHILD = Path(__file__).resolve().parents[2] / "support" / "meta_fault_child.py"
RAM, RAM_FILE, DISK = TierKind.RAM, TierKind.RAM_FILE, TierKind.DISK
LINK_STAGES = (MoveStage.VALIDATED, MoveStage.LINKED, MoveStage.SYNCED)
COPY_STAGES = (MoveStage.VALIDATED, MoveStage.WRITTEN, MoveStage.LINKED, MoveStage.SYNCED)


def tiers_of(settings: CacheSettings) -> dict[TierKind, Tier]:
    return {cfg.kind: Tier(cfg) for cfg in settings.tiers}


def row_file_size(settings: CacheSettings) -> int:
    return row_spec(0).file_size(len(row_payload(0)))


def tmp_files(settings: CacheSettings, *, besides_pid: int | None = None) -> list[str]:
    """The tiers' tmp files, less those a live cache-meta ``besides_pid`` is writing now.

    A restarted cache-meta starts its own moves at once (write-behind of the
    rows it found), and their tmp files are work in progress, not leftovers.
    """
    mine = f".mv-{besides_pid}-" if besides_pid is not None else None
    found = []
    for tier in tiers_of(settings).values():
        if tier.root.exists():
            found += [
                p.name
                for p in tier.root.iterdir()
                if p.name.startswith(tier.prefix)
                and p.name.endswith(".tmp")
                and (mine is None or mine not in p.name)
            ]
    return found


def scenario(settings: CacheSettings, case: str) -> CacheSettings:
    """Quotas and switches that make the first two saves ask for the move ``case`` names."""
    one_row = row_file_size(settings) * 3 // 2  # room for one row, not two
    quotas = {
        # ram → ram_file: one filesystem, a link.
        "demote_link": {RAM: one_row},
        # ram → disk (no ram_file): a copy.
        "demote_copy": {RAM: one_row, RAM_FILE: 0},
        # ram → disk behind the save: a copy.
        "write_behind": {},
    }[case]
    tiers = tuple(dataclasses.replace(t, quota=quotas.get(t.kind, t.quota)) for t in settings.tiers)
    return msgspec.structs.replace(settings, tiers=tiers, write_behind=case == "write_behind")


class KillingMeta:
    """The child cache-meta that dies at a move's stage."""

    def __init__(self, settings: CacheSettings, kind: MoveKind, stage: MoveStage) -> None:
        self.file = Path(str(settings.counters_path) + ".settings.json")
        self.file.write_text(json.dumps(settings.to_wire()))
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), "meta", str(self.file), kind.value, str(int(stage))],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        line = ""
        while not line.startswith("READY"):
            ready, _, _ = select.select([self.proc.stdout], [], [], 60)
            assert ready, "the child cache-meta never served"
            line = self.proc.stdout.readline()
            assert line, "the child cache-meta exited before serving"

    def wait_killed(self) -> str:
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        assert self.proc.wait(60) == -9, out
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.file.unlink(missing_ok=True)


CASES = [
    *(("demote_link", MoveKind.DEMOTE, s) for s in LINK_STAGES),
    *(("demote_copy", MoveKind.DEMOTE, s) for s in COPY_STAGES),
    *(("write_behind", MoveKind.WRITE_BEHIND, s) for s in COPY_STAGES),
]


@pytest.mark.parametrize(
    ("case", "kind", "stage"), CASES, ids=[f"{c}-{s.name.lower()}" for c, _, s in CASES]
)
def test_cache_meta_killed_during_a_move_loses_nothing_and_leaves_no_tmp(
    cache_settings: CacheSettings, case: str, kind: MoveKind, stage: MoveStage
) -> None:
    settings = scenario(cache_settings, case)
    tiers = tiers_of(settings)
    child = KillingMeta(settings, kind, stage)
    saved: dict[bytes, int] = {}
    try:
        with CacheClient.from_settings(settings, timeout=10.0) as cache:
            for seed in (1, 2):
                try:
                    done = publish(cache, tiers, row_spec(seed), row_payload(seed))
                except LlamadError:
                    # The kill came in the middle of this save: it was never
                    # announced, so nothing is owed of it.
                    break
                if done.outcome is PublishOutcome.PUBLISHED:
                    saved[done.key] = seed
        said = child.wait_killed()
    except Exception:
        child.close()
        raise
    child.close()
    assert f"DYING {kind} {stage.name}" in said
    # The row being moved was published before its move began (a move takes
    # an indexed row), so it is owed even when the kill came before its
    # publish's answer reached this client: a write-behind copy starts the
    # moment a row is published, and on a fast machine its first stage can
    # beat that answer out of the process.
    moving = bytes.fromhex(said.split(f"DYING {kind} {stage.name} ", 1)[1].split()[0])
    by_key = {row_spec(seed).key: seed for seed in (1, 2)}
    assert moving in by_key, "the killed move was of no row this test saved"
    saved.setdefault(moving, by_key[moving])
    if stage is MoveStage.WRITTEN:
        assert tmp_files(settings), "the kill came after the tmp file was written"
    # cache_sup restarts cache-meta on the same tiers.
    with MetaProcess(settings) as meta, CacheClient.from_settings(settings) as cache:
        assert tmp_files(settings, besides_pid=meta.pid) == []
        for key, seed in saved.items():
            ref = cache.lookup_exact(key)
            assert ref is not None, f"row {seed} was lost"
            buf = bytearray(ref.file_size)
            with cache.pinned(ref):
                n = cache.load_into(ref, buf)
            assert n is not None and bytes(buf[:n]) == row_payload(seed)
        # Whatever copies the rebuild found are real files of their rows. The
        # new cache-meta may be demoting an over-quota row meanwhile, so a
        # listed copy whose file is gone must leave the index shortly after.
        assert_indexed_copies_exist(cache)


def listed_copies_without_file(cache: CacheClient) -> set[tuple[str, str]]:
    return {
        (str(row.get("key")), c["location"])
        for row in cache.dump()
        for c in row.get("copies", [])
        if not Path(c["location"]).exists()
    }


def assert_indexed_copies_exist(cache: CacheClient, within: float = 30.0) -> None:
    """Every copy the index lists is a file, or stops being listed within ``within``."""
    missing = listed_copies_without_file(cache)
    deadline = time.monotonic() + within
    while missing:
        assert time.monotonic() < deadline, f"indexed copies without a file: {sorted(missing)}"
        time.sleep(0.05)
        missing &= listed_copies_without_file(cache)


def test_a_copy_is_indexed_only_once_it_is_complete_linked_and_synced(
    cache_settings: CacheSettings,
) -> None:
    settings = scenario(cache_settings, "write_behind")
    reached = {stage: threading.Event() for stage in MoveStage}
    go_on = {stage: threading.Event() for stage in MoveStage}

    def hold(stage: MoveStage, job: MoveJob) -> None:
        reached[stage].set()
        go_on[stage].wait(60)

    server = MetaServer(settings, mover_hook=hold)
    ready = threading.Event()

    def loop() -> None:
        # The actor belongs to the thread that starts it.
        server.start()
        ready.set()
        while not server.actor.stop_requested:
            server.step(0.02)
        server.close()

    thread = threading.Thread(target=loop)
    thread.start()
    try:
        assert ready.wait(30)
        disk = tiers_of(settings)[DISK]
        with CacheClient.from_settings(settings) as cache:
            done = publish(cache, tiers_of(settings), row_spec(3), row_payload(3))
            assert done.tier is RAM

            def indexed_in_disk() -> bool:
                rows = [r for r in cache.dump() if r.get("key") == done.key.hex()]
                return any(c["tier"] == "disk" for c in rows[0]["copies"])

            for stage in MoveStage:
                assert reached[stage].wait(30), f"the mover never reached {stage.name}"
                assert not indexed_in_disk(), f"indexed at {stage.name}"
                assert disk.path_for(done.key).exists() is (stage >= MoveStage.LINKED)
                go_on[stage].set()
            deadline = time.monotonic() + 30
            while not indexed_in_disk():
                assert time.monotonic() < deadline, "the landed copy was never indexed"
                time.sleep(0.01)
            ref = cache.lookup_exact(done.key, tiers={DISK})
            assert ref is not None and ref.tier is DISK
            cache.checkin(ref.pin)
    finally:
        for event in go_on.values():
            event.set()
        server.actor.request_stop()
        thread.join(30)
