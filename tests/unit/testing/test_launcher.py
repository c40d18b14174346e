"""The daemon harness itself (``llamad.testing``): environment, directories,
readiness, stop and leftovers.

The processes are real, but stand-ins for the daemon: small Python programs
whose tree, exit and signal handling each test chooses (an early exit, a
child left behind, SIGTERM ignored), run through the launcher's own start,
readiness and stop. The real daemon's side is in
``tests/integration/daemon/test_daemon_launcher.py``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llamad.testing import (
    KEPT,
    DaemonFailed,
    Launcher,
    WaitTimeout,
    daemon_command,
    scrubbed_env,
    wait_gone,
    wait_until,
)
from llamad.testing import launcher as launcher_module
from llamad.testing.launcher import TEST_SETTINGS

pytestmark = pytest.mark.timeout(60)

# Stand-ins for the daemon's root.
EXITS_AT_ONCE = "import sys; print('refused: models.x.n_ctx: expected an integer'); sys.exit(78)"
NEVER_LISTENS = "import time; time.sleep(120)"
STOPS_ON_SIGTERM = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print('ready', flush=True)
time.sleep(120)
"""
IGNORES_SIGTERM = """
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print('ready', flush=True)
time.sleep(120)
"""
# Exits 0 on SIGTERM, leaving its child (which ignores SIGTERM) running.
LEAVES_A_CHILD = f"""
import signal, subprocess, sys, time
subprocess.Popen([sys.executable, "-c", {IGNORES_SIGTERM!r}])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print('ready', flush=True)
time.sleep(120)
"""


class StandIn(Launcher):
    """A launcher whose root is ``program`` instead of the daemon."""

    def __init__(self, program: str, **options: Any) -> None:
        super().__init__(prefix="llt-", **options)
        self.program = program

    def command(self) -> list[str]:
        return [sys.executable, "-c", self.program]


def handling_signals(d: Launcher, starts: int = 1) -> None:
    """Until the stand-in's ``starts``-th run has set its signal handling
    (a SIGTERM before that ends it by the signal)."""
    wait_until(lambda: d.log_tail().count("ready") >= starts, "the stand-in's handlers", 30)


@pytest.fixture
def launched() -> Iterator[list[Launcher]]:
    """Launchers to close after the test, whatever it left running."""
    made: list[Launcher] = []
    yield made
    for launcher in made:
        for p in launcher.tree():
            p.kill()
        launcher.kill()
        launcher.remove()


# -- the environment and the command -------------------------------------------------


def test_the_scrub_drops_the_callers_llamad_settings_but_where_the_model_lives() -> None:
    environ = {
        "HOME": "/home/u",
        "LLAMAD_CACHE_DIR": "/models",
        "LLAMAD_DEFAULT_MODEL": "/models/m.gguf",
        "LLAMAD_RUNTIME_DIR": "/run/user/1/llamad",
        "LLAMAD_CONFIG": "/etc/llamad.toml",
        "LLAMAD_MODELS__SMOLLM2__N_CTX": "64",
    }
    env = scrubbed_env({"LLAMAD_LOG_FORMAT": "json", "HOME": "/tmp"}, environ=environ)
    assert env == {
        "HOME": "/tmp",
        "LLAMAD_CACHE_DIR": "/models",
        "LLAMAD_DEFAULT_MODEL": "/models/m.gguf",
        "LLAMAD_LOG_FORMAT": "json",
        **TEST_SETTINGS,
    }
    assert set(KEPT) == {"LLAMAD_CACHE_DIR", "LLAMAD_DEFAULT_MODEL"}


def test_with_no_config_file_the_places_go_through_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = Launcher(prefix="llt-", env={"LLAMAD_LOG_FORMAT": "console"})
    try:
        # Read at each start, not when the launcher was made.
        monkeypatch.setenv("LLAMAD_RUNTIME_DIR", "/elsewhere")
        monkeypatch.setenv("NOTIFY_SOCKET", "@x")
        env = d.environment()
        assert env["LLAMAD_RUNTIME_DIR"] == str(d.runtime)
        assert env["STATE_DIRECTORY"] == str(d.state)
        assert env["LLAMAD_CACHE__INSTANCE"] == d.instance
        assert env["LLAMAD_LOG_FORMAT"] == "console"
        assert env["NOTIFY_SOCKET"] == "@x"
        assert d.command() == [sys.executable, "-m", "llamad.daemon"]

        config = d.write_config("[daemon]\n")
        assert config == d.base / "llamad.toml" and config.read_text() == "[daemon]\n"
        assert d.command() == [sys.executable, "-m", "llamad.daemon", "--config", str(config)]
        assert d.command() == daemon_command(config)
        # The file names the places; the environment does not override them.
        assert not {"LLAMAD_RUNTIME_DIR", "STATE_DIRECTORY", "LLAMAD_CACHE__INSTANCE"} & set(
            d.environment()
        )
    finally:
        d.remove()


def test_the_directory_is_private_short_and_holds_the_endpoint() -> None:
    d = Launcher(prefix="llt-")
    try:
        assert d.base.parent == Path("/tmp") and d.base.name.startswith("llt-")
        assert d.base.stat().st_mode & 0o777 == 0o700
        assert d.endpoint == f"ipc://{d.base}/run/llamad.sock"
        assert d.registry_root == d.base / "run" / "actors"
        # An actor's socket path must fit in 107 bytes.
        assert len(os.fsencode(d.registry_root / "llamad.model_sup.sock")) < 80
        other = Launcher(prefix="llt-")
        assert other.base != d.base and other.instance != d.instance
        other.remove()
    finally:
        d.remove()


# -- wait_until ----------------------------------------------------------------------


def test_wait_until_returns_the_first_truthy_value() -> None:
    values = iter([None, 0, "", "found"])
    assert wait_until(lambda: next(values), "a value", 5.0, 0.001) == "found"


def test_wait_until_fails_as_an_assertion_naming_what_it_waited_for() -> None:
    with pytest.raises(WaitTimeout, match=r"timed out after 0\.05s waiting for the moon") as info:
        wait_until(lambda: None, "the moon", 0.05, 0.01)
    assert isinstance(info.value, AssertionError)


# -- start, readiness, stop ----------------------------------------------------------


def test_a_root_that_exits_early_fails_readiness_at_once_with_its_log_tail(
    launched: list[Launcher],
) -> None:
    d = StandIn(EXITS_AT_ONCE)
    launched.append(d)
    d.start()
    with pytest.raises(DaemonFailed) as info:
        # Far longer than the stand-in lives: the failure must not wait for it.
        d.wait_routed(["m"], timeout=300)
    message = str(info.value)
    assert "exited with status 78" in message
    assert "refused: models.x.n_ctx: expected an integer" in message


def test_a_root_that_never_routes_fails_readiness_after_the_timeout(
    launched: list[Launcher],
) -> None:
    d = StandIn(NEVER_LISTENS)
    launched.append(d)
    d.start()
    with pytest.raises(DaemonFailed, match="no route to 'm' within 1 s"):
        d.wait_routed(["m"], timeout=1.0)
    # It did not handle SIGTERM: the signal ended it.
    assert d.terminate().code == -signal.SIGTERM


def test_stop_returns_the_exit_status_and_a_restart_reuses_the_directory(
    launched: list[Launcher],
) -> None:
    d = StandIn(STOPS_ON_SIGTERM)
    launched.append(d)
    first = d.start().pid
    handling_signals(d)
    assert d.stop() == 0
    assert d.start().pid != first
    handling_signals(d, 2)
    assert d.stop() == 0
    assert d.base.is_dir() and d.log_path.is_file()


def test_stop_reports_a_process_of_the_tree_left_behind(
    launched: list[Launcher], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child ignores SIGTERM and sleeps 120 s: it outlives any grace the
    # stop gives the tree, and the stop waits that grace out in full (GONE_S,
    # 10 s, made this the module's slowest test by 9 s). One second is the
    # grace here; how long it is is not what is tested.
    monkeypatch.setattr(launcher_module, "GONE_S", 1.0)
    d = StandIn(LEAVES_A_CHILD)
    launched.append(d)
    d.start()
    (child,) = wait_until(d.tree, "the stand-in's child", 30)
    handling_signals(d, 2)  # the root's and its child's
    try:
        with pytest.raises(
            DaemonFailed, match=f"left behind after the root exited: \\[{child.pid}\\]"
        ):
            d.stop(timeout=30)
        assert d.proc is not None and d.proc.returncode == 0
    finally:
        child.kill()
    assert wait_gone([child], 10) == []


def test_a_root_that_ignores_sigterm_is_killed_and_the_stop_says_so(
    launched: list[Launcher],
) -> None:
    d = StandIn(IGNORES_SIGTERM)
    launched.append(d)
    d.start()
    handling_signals(d)
    stopped = d.terminate(timeout=0.5)
    assert stopped.code is None and stopped.left == () and not stopped.clean
    assert d.proc is not None and d.proc.returncode == -signal.SIGKILL
    d.start()
    handling_signals(d, 2)
    with pytest.raises(DaemonFailed, match="did not stop within 0 s of SIGTERM"):
        d.stop(timeout=0.2)


_DRIVER = """
import sys, time
from llamad.testing import Launcher

class StandIn(Launcher):
    def command(self):
        return [sys.executable, "-c", sys.argv[1]]

d = StandIn(prefix="llt-", own_session=True)
d.start()
print(d.pid, d.base, flush=True)
time.sleep(120)
"""

# Writes a mark (at MARK, defined before it) when SIGTERM comes, then exits.
_MARKS_SIGTERM = """
import pathlib, signal, sys, time
def stop(*_):
    pathlib.Path(MARK).write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(120)
"""


def test_an_own_session_daemon_gets_sigterm_when_its_driver_is_killed(tmp_path: Path) -> None:
    mark = tmp_path / "mark"
    program = f"MARK = {str(mark)!r}\n" + _MARKS_SIGTERM
    driver = subprocess.Popen(
        [sys.executable, "-c", _DRIVER, program],
        stdout=subprocess.PIPE,
        text=True,
        env=scrubbed_env(),
    )
    assert driver.stdout is not None
    pid_text, base = driver.stdout.readline().split()
    pid = int(pid_text)
    try:
        # Its own session: a Ctrl-C at the driver's terminal is not its.
        assert os.getsid(pid) == pid != os.getsid(driver.pid)
        log = Path(base) / "daemon.log"
        wait_until(lambda: log.exists() and "ready" in log.read_text(), "the stand-in", 30)
        driver.kill()
        driver.wait(10)
        assert wait_until(lambda: mark.exists() and mark.read_text(), "SIGTERM", 30) == "SIGTERM"
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)
        if not mark.exists():  # still running: this test's to end
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


# -- what it leaves ------------------------------------------------------------------


def test_remove_takes_the_directory_the_instances_segments_and_its_ram_file_root() -> None:
    d = Launcher(prefix="llt-")
    mine = Path(f"/dev/shm/llamad-ram.{d.instance}.0a1b.kvc")
    lock = Path(f"/dev/shm/llamad-ram.{d.instance}.cache-meta.lock")
    # Another instance whose name starts with this one's: not this one's.
    other = Path(f"/dev/shm/llamad-ram.{d.instance}x.0a1b.kvc")
    try:
        for path in (mine, lock, other):
            path.write_bytes(b"x")
        d.ram_file_root.mkdir(parents=True)
        (d.ram_file_root / "row.kvc").write_bytes(b"x")
        assert d.ram_segments() == sorted([lock, mine])
        assert set(d.leftovers()) == {d.base, d.ram_file_root, mine, lock}
        d.remove()
        assert d.leftovers() == []
        assert other.exists()
    finally:
        for path in (mine, lock, other):
            path.unlink(missing_ok=True)
        d.remove()


def test_close_stops_a_running_daemon_then_removes_what_it_left(
    launched: list[Launcher],
) -> None:
    d = StandIn(STOPS_ON_SIGTERM)
    launched.append(d)
    d.start()
    segment = Path(f"/dev/shm/llamad-ram.{d.instance}.0a1b.kvc")
    segment.write_bytes(b"x")
    handling_signals(d)
    try:
        d.close()
        assert d.proc is not None and d.proc.returncode == 0
        assert d.leftovers() == []
    finally:
        segment.unlink(missing_ok=True)
