"""A second daemon that collides with a running one exits 75, names what is held, and
changes no byte of the first's files (issue 17; ``llamad.daemon.claim``).

Two first daemons, each started once: ``full`` with all three tiers, ``ram_off``
with the ``ram`` tier off (quota 0). Against them, real second daemons in every
collision the issue lists: the same config, the same runtime directory with
another instance and state directory, the same instance with another runtime
directory, a daemon with only a ``ram_file`` tier on the first's, one with only a
``disk`` tier on the first's, and the ``ram``-off config started twice. Each
second daemon must exit 75 with one ``daemon.in_use`` line naming exactly the
places it collides on and the first's pid; every file of the first (runtime and
state directories, ``ram`` segments, ``ram_file`` and ``disk`` roots) must have
the same bytes afterwards; and the first must still serve (a completion, and its
STATUS listing its model). Last, a SIGKILLed daemon's locks (their files left
behind) do not keep the next start from serving.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from daemon_harness import POLICY, Daemon, wait_gone, wait_until
from llamad import paths
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.config import load_config
from llamad.daemon.main import EXIT_IN_USE
from llamad.testing import Launcher

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

MODEL = "a"
# How long a refused daemon may take to exit: its start (imports, the config,
# the model file's header) on a loaded machine.
REFUSED_WITHIN_S = 60.0


def _with_ram_file(d: Daemon) -> Daemon:
    """The harness's config has ``ram_file`` off; ``full`` turns it on."""
    text = d.config.read_text()
    off = "[cache.ram_file]\nquota = 0\n"
    assert off in text
    d.config.write_text(text.replace(off, '[cache.ram_file]\nquota = "64MiB"\n'))
    return d


def _ram_off(d: Daemon) -> Daemon:
    text = d.config.read_text()
    on = '[cache.ram]\nquota = "256MiB"\n'
    assert on in text
    d.config.write_text(text.replace(on, "[cache.ram]\nquota = 0\n"))
    return d


def _with_rows(d: Daemon, *kinds: TierKind) -> Daemon:
    """Start ``d`` and give it rows to lose: a saved prompt, in the fastest
    tier and in ``disk`` by write-behind, each of ``kinds`` holding one."""
    d.start(wait_for=[MODEL])
    d.worker(MODEL).complete(_long_prompt(), max_tokens=1, temperature=0.0)
    tiers = {cfg.kind: Tier(cfg) for cfg in load_config(d.config, env={}).cache_settings().tiers}
    wait_until(lambda: all(tiers[k].row_keys() for k in kinds), f"a row in each of {kinds}", 60.0)
    return d


@pytest.fixture(scope="module")
def full() -> Iterator[Daemon]:
    d = _with_ram_file(Daemon({MODEL: {}}))
    try:
        yield _with_rows(d, TierKind.RAM, TierKind.DISK)
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def ram_off() -> Iterator[Daemon]:
    d = _ram_off(Daemon({MODEL: {}}))
    try:
        yield _with_rows(d, TierKind.DISK)
    finally:
        d.cleanup()


def _long_prompt() -> str:
    return "The river stone, the copper lamp and the paper garden. " * 6


# -- the first daemon's files ------------------------------------------------------------


def _first_roots(d: Daemon) -> list[Path]:
    return [d.runtime, d.state, d.launcher.ram_file_root]


def _snapshot(d: Daemon) -> dict[str, str]:
    """Every entry of the first daemon's places: path -> its kind, and a regular
    file's sha256 (a socket or a directory by its kind alone)."""
    out: dict[str, str] = {}
    entries: list[Path] = list(d.launcher.ram_segments())
    for root in _first_roots(d):
        if root.exists():
            entries.append(root)
            entries += root.rglob("*")
    for path in entries:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            out[str(path)] = "file " + hashlib.sha256(path.read_bytes()).hexdigest()
        elif stat.S_ISLNK(st.st_mode):
            out[str(path)] = "link " + os.readlink(path)
        else:
            out[str(path)] = "dir" if stat.S_ISDIR(st.st_mode) else f"mode {st.st_mode:o}"
    return out


def _settled(d: Daemon) -> dict[str, str]:
    """The first's files once it has stopped changing them itself (its saves,
    write-behind copies and status boards land after a reply): the same
    snapshot twice, 0.5 s apart."""
    last: list[dict[str, str]] = [_snapshot(d)]

    def same() -> dict[str, str] | None:
        time.sleep(0.5)
        now = _snapshot(d)
        stable = now == last[0]
        last[0] = now
        return now if stable else None

    return wait_until(same, "the first daemon's files to settle", 60.0)


def _changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [
        f"{p}: {before.get(p, 'absent')} -> {after.get(p, 'absent')}"
        for p in sorted(before.keys() | after.keys())
        if before.get(p) != after.get(p)
    ]


# -- the second daemon -------------------------------------------------------------------


def _config(
    launcher: Launcher,
    *,
    runtime: Path,
    state: Path,
    instance: str,
    ram: str = "0",
    ram_file: str = "0",
    disk: str = "0",
    ram_file_root: Path | None = None,
    disk_root: Path | None = None,
) -> None:
    def root(p: Path | None) -> str:
        return f'root = "{p}"\n' if p is not None else ""

    model_dir = paths.default_model_path().parent
    launcher.write_config(
        f"""
[daemon]
runtime_dir = "{runtime}"
state_dir = "{state}"
log_format = "json"

[cache]
instance = "{instance}"
[cache.ram]
quota = {ram}
[cache.ram_file]
quota = {ram_file}
{root(ram_file_root)}
[cache.disk]
quota = {disk}
{root(disk_root)}
{POLICY}
[security]
model_dirs = ["{model_dir}"]

[models.{MODEL}]
path = "default"
n_ctx = 512
n_threads = 1
n_threads_batch = 1
"""
    )


def _run_to_exit(launcher: Launcher) -> int:
    """Run the second daemon to its exit; its exit status."""
    launcher.start()
    proc = launcher.proc
    assert proc is not None
    try:
        return proc.wait(REFUSED_WITHIN_S)
    except subprocess.TimeoutExpired:
        launcher.terminate()
        pytest.fail(f"the second daemon was still running after {REFUSED_WITHIN_S} s")


def _refusal(launcher: Launcher) -> dict[str, object]:
    """The second daemon's one ``daemon.in_use`` line; nothing was started before it."""
    events = [json.loads(line) for line in launcher.log_lines() if line.startswith("{")]
    refused = [e for e in events if e.get("event") == "daemon.in_use"]
    assert len(refused) == 1, launcher.log_tail()
    assert not any(e.get("event") == "daemon.starting" for e in events), launcher.log_tail()
    return refused[0]


def _held(event: dict[str, object]) -> dict[str, object]:
    """place -> holder pid, from the refusal's ``held``."""
    held = event["held"]
    assert isinstance(held, list)
    return {h["place"]: h["holder_pid"] for h in held}


def _places(d: Daemon, *kinds: str) -> set[str]:
    """The refusal's name for each of the first daemon's places."""
    names = {
        "runtime": f"runtime directory {d.runtime}",
        "ram": f"tier ram /dev/shm/llamad-ram.{d.instance}.*",
        "ram_file": f"tier ram_file {d.launcher.ram_file_root}",
        "disk": f"tier disk {d.state / 'kvc'}",
    }
    return {names[k] for k in kinds}


def _check_collision(first: Daemon, second: Launcher, *held: str) -> None:
    before = _settled(first)
    code = _run_to_exit(second)
    changes = _changes(before, _snapshot(first))
    assert changes == [], f"the second daemon (exit {code}) changed the first's files: {changes}"
    assert code == EXIT_IN_USE, f"exit {code}:\n{second.log_tail()}"
    event = _refusal(second)
    names = _held(event)
    assert set(names) == _places(first, *held), event
    assert set(names.values()) == {first.pid}, event
    message = event["error"]
    assert isinstance(message, str)
    assert all(place in message for place in names), message
    assert f"pid {first.pid}" in message, message
    # The first still serves: a completion, and its STATUS lists its model.
    reply = first.worker(MODEL).complete("Hi", max_tokens=2, temperature=0.0)
    assert reply.stats.completion_tokens >= 1
    assert [m.info.model_id for m in first.status().models] == [MODEL]


@pytest.fixture
def second() -> Iterator[Launcher]:
    # Its own directory (for its log) and instance; what it shares with the
    # first is only what its config names, so removing its leftovers removes
    # nothing of the first's.
    launcher = Launcher(prefix="lld2-")
    try:
        yield launcher
    finally:
        launcher.close()


# -- the collisions ----------------------------------------------------------------------


def test_the_same_config_twice(full: Daemon, second: Launcher) -> None:
    second.config = full.config
    _check_collision(full, second, "runtime", "ram", "ram_file", "disk")


def test_the_same_runtime_dir_with_another_instance_and_state_dir(
    full: Daemon, second: Launcher
) -> None:
    _config(
        second,
        runtime=full.runtime,
        state=second.state,
        instance=second.instance,
        ram='"64MiB"',
        disk='"64MiB"',
    )
    _check_collision(full, second, "runtime")


def test_the_same_instance_with_another_runtime_dir(full: Daemon, second: Launcher) -> None:
    _config(
        second,
        runtime=second.runtime,
        state=second.state,
        instance=full.instance,
        ram='"64MiB"',
        ram_file='"64MiB"',
        disk='"64MiB"',
    )
    _check_collision(full, second, "ram", "ram_file")


def test_a_daemon_with_only_a_ram_file_tier_on_the_firsts(full: Daemon, second: Launcher) -> None:
    _config(
        second,
        runtime=second.runtime,
        state=second.state,
        instance=second.instance,
        ram_file='"64MiB"',
        ram_file_root=full.launcher.ram_file_root,
    )
    _check_collision(full, second, "ram_file")


def test_a_daemon_with_only_a_disk_tier_on_the_firsts(full: Daemon, second: Launcher) -> None:
    _config(
        second,
        runtime=second.runtime,
        state=second.state,
        instance=second.instance,
        disk='"64MiB"',
        disk_root=full.state / "kvc",
    )
    _check_collision(full, second, "disk")


def test_the_same_config_with_the_ram_tier_off_twice(ram_off: Daemon, second: Launcher) -> None:
    second.config = ram_off.config
    _check_collision(ram_off, second, "runtime", "disk")


# -- a killed daemon ---------------------------------------------------------------------


def test_a_sigkilled_daemons_locks_do_not_block_the_next_start(ram_off: Daemon) -> None:
    killed = ram_off.pid
    tree = [psutil.Process(killed), *ram_off.tree()]
    os.kill(killed, signal.SIGKILL)
    assert wait_gone(tree, 30.0) == [], "the killed daemon's tree outlived it"
    ram_off.close_clients()
    assert ram_off.proc is not None
    ram_off.proc.wait(10)
    # Its lock files are left behind, unheld (nobody unlinked them).
    assert (ram_off.runtime / "daemon.lock").read_text() == f"{killed}\n"
    assert (ram_off.state / "kvc" / "daemon.lock").read_text() == f"{killed}\n"
    ram_off.start(wait_for=[MODEL])
    reply = ram_off.worker(MODEL).complete("Hi", max_tokens=2, temperature=0.0)
    assert reply.stats.completion_tokens >= 1
    assert ram_off.pid != killed
    assert (ram_off.runtime / "daemon.lock").read_text() == f"{ram_off.pid}\n"
