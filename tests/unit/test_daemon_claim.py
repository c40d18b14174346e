"""The daemon's claim on its places (``llamad.daemon.claim``), without a daemon.

flock belongs to an open file description, so two claims in one process
collide like two daemons do. The real daemons are in
``tests/faults/daemon/test_second_daemon.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from llamad.cache.tier_kind import TierKind
from llamad.cache.tier_lock import TierLocks
from llamad.cache.tiers import Tier
from llamad.config import load_config
from llamad.daemon.claim import LOCK_NAME, DaemonClaim, Place, daemon_places
from llamad.errors import ConfigError, DaemonInUse
from llamad.testing import wait_until


def _place(directory: Path, name: str = "runtime directory") -> Place:
    return Place(f"{name} {directory}", "daemon.runtime_dir", directory, directory / LOCK_NAME)


@pytest.fixture
def places(tmp_path: Path) -> list[Place]:
    return [_place(tmp_path / n, n) for n in ("one", "two", "three")]


def test_a_second_claim_is_refused_naming_every_held_place_and_holds_none(
    places: list[Place],
) -> None:
    with DaemonClaim.take(places[:2]) as first:
        assert first.places == places[:2]
        held = [p.lock.read_bytes() for p in places[:2]]
        assert held == [f"{os.getpid()}\n".encode()] * 2
        with pytest.raises(DaemonInUse) as refused:
            DaemonClaim.take(places)
        assert refused.value.code == "daemon_in_use"
        assert refused.value.details["held"] == [
            {"place": p.what, "lock": str(p.lock), "holder_pid": os.getpid()} for p in places[:2]
        ]
        for p in places[:2]:
            assert f"{p.what} (pid {os.getpid()})" in refused.value.message
        assert places[2].what not in refused.value.message
        # The refused claim changed nothing of the holder's, and let go of the
        # place it had taken before seeing the others held.
        assert [p.lock.read_bytes() for p in places[:2]] == held
        DaemonClaim.take(places[2:]).release()


def test_a_release_removes_the_lock_files_and_the_places_can_be_claimed_again(
    places: list[Place],
) -> None:
    claim = DaemonClaim.take(places)
    claim.release()
    claim.release()  # idempotent
    assert not any(p.lock.exists() for p in places)
    assert all(p.directory.is_dir() for p in places)
    DaemonClaim.take(places).release()


def test_a_lock_file_left_by_a_dead_holder_is_taken(places: list[Place]) -> None:
    place = places[0]
    place.directory.mkdir()
    place.lock.write_text("4000000\n")  # a holder that died without releasing
    with DaemonClaim.take([place]):
        assert place.lock.read_text() == f"{os.getpid()}\n"


def test_a_killed_holders_children_do_not_keep_its_places(tmp_path: Path) -> None:
    """The root's lock dies with the root, even while a child it started (one
    that inherits every descriptor it may) outlives it."""
    place = _place(tmp_path / "run")
    ready = tmp_path / "ready"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import subprocess, sys, time
                from pathlib import Path
                from llamad.daemon.claim import DaemonClaim, LOCK_NAME, Place
                d = Path({str(place.directory)!r})
                claim = DaemonClaim.take([Place("runtime directory", "k", d, d / LOCK_NAME)])
                child = subprocess.Popen(["sleep", "120"], close_fds=False)
                Path({str(ready)!r}).write_text(str(child.pid))
                time.sleep(120)
                """
            ),
        ]
    )
    child: int | None = None
    try:
        child = int(wait_until(lambda: ready.exists() and ready.read_text(), "the holder", 60.0))
        with pytest.raises(DaemonInUse):
            DaemonClaim.take([place])
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        os.kill(child, 0)  # the child still runs
        assert place.lock.read_text() == f"{holder.pid}\n"  # and the file is still there
        with DaemonClaim.take([place]):
            assert place.lock.read_text() == f"{os.getpid()}\n"
    finally:
        holder.kill()
        holder.wait(10)
        if child is not None:
            os.kill(child, signal.SIGKILL)


def test_cache_meta_takes_its_tier_locks_while_the_daemon_holds_the_tiers(
    tmp_path: Path,
) -> None:
    """A restarted cache-meta must start inside a daemon that holds its places:
    the daemon's flock on daemon.lock never meets cache-meta's OFD lock on
    cache-meta.lock."""
    from llamad.cache.tiers import TierConfig  # noqa: PLC0415

    tier = Tier(TierConfig(TierKind.DISK, tmp_path / "disk", 1 << 20, "x"))
    place = Place("tier disk", "cache.disk.root", tier.root, tier.root / LOCK_NAME)
    with DaemonClaim.take([place]), TierLocks.take([tier]) as locks:
        assert [lock.held for lock in locks.locks] == [True]


def test_a_place_that_cannot_be_made_is_a_config_error_naming_its_key(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    place = Place("tier disk", "cache.disk.root", a_file / "kvc", a_file / "kvc" / LOCK_NAME)
    with pytest.raises(ConfigError) as refused:
        DaemonClaim.take([place])
    assert refused.value.details == {"field": "cache.disk.root"}
    assert refused.value.message.startswith("cache.disk.root: ")


def test_a_daemons_places_are_its_runtime_dir_and_each_tier_with_a_quota(tmp_path: Path) -> None:
    instance = f"claim-{uuid.uuid4().hex[:10]}"
    toml = tmp_path / "llamad.toml"
    toml.write_text(
        textwrap.dedent(
            f"""
            [daemon]
            runtime_dir = "{tmp_path / "run"}"
            state_dir = "{tmp_path / "state"}"
            [cache]
            instance = "{instance}"
            [cache.ram]
            quota = "1MiB"
            [cache.ram_file]
            quota = "1MiB"
            root = "{tmp_path / "rf"}"
            [cache.disk]
            quota = 0
            """
        )
    )
    config = load_config(toml, env={})
    assert [(p.what, p.key, p.lock) for p in daemon_places(config)] == [
        (
            f"runtime directory {tmp_path / 'run'}",
            "daemon.runtime_dir",
            tmp_path / "run" / LOCK_NAME,
        ),
        (
            f"tier ram /dev/shm/llamad-ram.{instance}.*",
            "cache.instance",
            Path(f"/dev/shm/llamad-ram.{instance}.{LOCK_NAME}"),
        ),
        (f"tier ram_file {tmp_path / 'rf'}", "cache.ram_file.root", tmp_path / "rf" / LOCK_NAME),
    ]
    # A lock file is none of the tiers' rows, so their scans leave it alone.
    tiers = [Tier(cfg) for cfg in config.cache_settings().tiers]
    assert [t.name for t in tiers] == [TierKind.RAM, TierKind.RAM_FILE]
    for place in daemon_places(config)[1:]:
        assert all(t.key_of(place.lock) is None for t in tiers)
