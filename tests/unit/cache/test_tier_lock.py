"""Tier ownership (SPEC C3/C4): one cache-meta per tier root, refused before anything is touched."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache.counters import Counters
from llamad.cache.errors import InvalidCacheValue, TierLocked
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason, encode_kvc
from llamad.cache.ram_purge import purge_ram
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.cache.tier_lock import TierLock, TierLocks
from llamad.cache.tiers import SHM_ROOT, Tier, TierConfig
from llamad.testing import discard_scratch, scratch_settings

pytestmark = pytest.mark.timeout(60)

NS = Namespace(fingerprint=b"\x41" * 32, quant=3, ctx_hash=b"\x42" * 32)


def put(tier: Tier, n: int) -> Path:
    spec = KvcSpec(NS, tokens_to_bytes([n, 1, 2]), FingerprintMode.SAFE, SaveReason.COLD)
    path = tier.path_for(spec.key)
    path.write_bytes(encode_kvc(spec, b"payload"))
    return path


@pytest.fixture
def ram() -> Iterator[Tier]:
    tier = Tier(TierConfig(TierKind.RAM, SHM_ROOT, 1 << 20, f"tl{uuid.uuid4().hex[:12]}"))
    yield tier
    tier.purge()
    tier.lock_path.unlink(missing_ok=True)


@pytest.fixture
def disk(tmp_path: Path) -> Tier:
    return Tier(TierConfig(TierKind.DISK, tmp_path / "disk", 1 << 20))


def test_a_second_owner_is_refused_naming_the_tier_and_the_holder(disk: Tier) -> None:
    with TierLocks.take([disk]), pytest.raises(TierLocked) as refused:
        TierLocks.take([disk])
    assert refused.value.code == "tier_locked"
    assert refused.value.details == {
        "tier": "disk",
        "lock": str(disk.lock_path),
        "holder_pid": os.getpid(),
    }
    assert "disk" in refused.value.message and str(os.getpid()) in refused.value.message


def test_a_refused_take_leaves_every_tier_it_had_taken(
    ram: Tier, disk: Tier, tmp_path: Path
) -> None:
    ram_file = Tier(TierConfig(TierKind.RAM_FILE, tmp_path / "ram_file", 1 << 20))
    with TierLocks.take([disk]), pytest.raises(TierLocked):
        TierLocks.take([ram, ram_file, disk])
    # ram and ram_file were taken before disk refused: they must be free again.
    with TierLocks.take([ram, ram_file]) as locks:
        assert all(lock.held for lock in locks.locks)


def test_the_lock_of_a_sigkilled_owner_is_free_at_once(disk: Tier) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from llamad.cache.tier_lock import TierLocks\n"
            "from llamad.cache.tier_kind import TierKind\n"
            "from llamad.cache.tiers import Tier, TierConfig\n"
            "from pathlib import Path\n"
            "lock = TierLocks.take([Tier(TierConfig(TierKind.DISK, Path(sys.argv[1]), 1))])\n"
            "print('HELD', flush=True)\n"
            "sys.stdin.read()\n",
            str(disk.root),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = "?"
        while line not in ("HELD\n", ""):  # past any log lines; "" is EOF
            line = holder.stdout.readline()
        assert line == "HELD\n"
        with pytest.raises(TierLocked) as refused:
            TierLocks.take([disk])
        assert refused.value.details["holder_pid"] == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        # Its lock file is still there (nobody released it) but not held.
        assert disk.lock_path.exists()
        with TierLocks.take([disk]) as locks:
            assert locks.locks[0].held
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_release_removes_the_lock_file_and_the_tier_can_be_taken_again(disk: Tier) -> None:
    lock = TierLock.take(disk)
    assert disk.lock_path.read_text() == f"{os.getpid()}\n"
    lock.release()
    lock.release()  # idempotent
    assert not disk.lock_path.exists()
    TierLock.take(disk).release()


def test_a_lock_file_replaced_after_opening_is_not_taken_as_ownership(
    disk: Tier, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race a release opens: a taker opens the old file, the owner unlinks
    # it and a third process creates and locks a new one. The taker then
    # locks the unlinked file; it must notice and start over, and so meet the
    # new owner's lock.
    owner = TierLock.take(disk)
    stale = os.open(disk.lock_path, os.O_RDWR)
    real_open = os.open
    calls = 0

    def open_the_stale_file_first(path: object, flags: int, mode: int = 0o777) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            owner.release()  # unlinks; `stale` now names a file nobody can open
            newcomer.append(TierLock.take(disk))
            return os.dup(stale)
        return real_open(path, flags, mode)  # type: ignore[arg-type]

    newcomer: list[TierLock] = []
    monkeypatch.setattr(os, "open", open_the_stale_file_first)
    try:
        with pytest.raises(TierLocked):
            TierLock.take(disk)
    finally:
        monkeypatch.undo()
        os.close(stale)
        for lock in newcomer:
            lock.release()
    # 1: the stale file; 2: the newcomer taking the new one; 3: the retry.
    assert calls == 3


def test_ram_locks_are_per_instance(ram: Tier) -> None:
    other = Tier(TierConfig(TierKind.RAM, SHM_ROOT, 1 << 20, f"tl{uuid.uuid4().hex[:12]}"))
    assert ram.lock_path.parent == SHM_ROOT
    assert ram.lock_path.name.startswith(ram.prefix)
    try:
        with TierLocks.take([ram]), TierLocks.take([other]), pytest.raises(TierLocked):
            TierLocks.take([Tier(ram.config)])
    finally:
        other.lock_path.unlink(missing_ok=True)


def test_the_lock_file_is_never_taken_for_a_row(ram: Tier, tmp_path: Path) -> None:
    counters = Counters.create(tmp_path / "counters")
    try:
        for tier in (ram, Tier(TierConfig(TierKind.DISK, tmp_path / "d", 1 << 20))):
            with TierLocks.take([tier]):
                row = put(tier, 1)
                assert [m.key.hex() for m in tier.scan(counters, adopt_ram=True)] == [
                    row.name.removeprefix(tier.prefix).removesuffix(".kvc")
                ]
                assert tier.purge() == 1
                assert tier.lock_path.exists()
        assert counters.get("corrupt_files") == 0
    finally:
        counters.close()


def test_purge_ram_refuses_while_a_cache_meta_owns_the_segments() -> None:
    settings = scratch_settings(prefix="ltl")
    try:
        cfg = settings.tier(TierKind.RAM)
        assert cfg is not None
        ram = Tier(cfg)
        row = put(ram, 5)
        with TierLocks.take([ram]):
            with pytest.raises(TierLocked):
                purge_ram(settings)
            assert row.exists()
        assert purge_ram(settings) == 1
        assert not row.exists() and not ram.lock_path.exists()
    finally:
        discard_scratch(settings)


def test_two_tiers_in_one_directory_are_refused_at_configuration(tmp_path: Path) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        CacheSettings(
            tiers=(
                TierConfig(TierKind.RAM_FILE, tmp_path / "same", 1),
                TierConfig(TierKind.DISK, tmp_path / "same", 1),
            ),
            counters_path=tmp_path / "counters",
        )
    assert err.value.field == "tiers"
