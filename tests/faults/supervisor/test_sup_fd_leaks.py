"""A supervisor holds a child's fds exactly as long as the child: none leak on any exit path.

Per child the supervisor holds a pidfd and the read end of the status pipe
(and, while spawning, the boot pipe's write end). A leak per exit is how a
long-running daemon ends up unable to spawn (EMFILE) and escalates.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from llamad.supervisor import (
    ChildState,
    StartFailed,
    Supervisor,
    SupervisorSpec,
    SupFlags,
)
from sup_helpers import EventLog, toy, wait_until

pytestmark = pytest.mark.timeout(240)

KILLS = 50


def fd_table(pid: int | str = "self") -> dict[int, str]:
    """Open fds of ``pid`` and what each points at (fds closed while listing are skipped)."""
    table = {}
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):
            table[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
    return table


def pidfds(pid: int) -> int:
    return sum(1 for target in fd_table(pid).values() if target == "anon_inode:[pidfd]")


def test_unplanned_exits_leave_the_supervisor_fd_count_unchanged(events: EventLog) -> None:
    spec = SupervisorSpec(
        "root", SupFlags(intensity=KILLS * 2, period=3600), (toy(events, "sleeper", "w"),)
    )
    root = subprocess.Popen([sys.executable, "-m", "sup_toys", json.dumps(spec.to_wire())])
    try:
        # "start" is recorded after the spawn finished: the root then holds the
        # child's pidfd and status pipe and nothing transient.
        pid = events.wait_for("start", "w")[0]["pid"]
        baseline = len(fd_table(root.pid))
        assert pidfds(root.pid) == 1
        for i in range(KILLS):
            os.kill(pid, signal.SIGKILL)
            pid = events.wait_for("start", "w", count=i + 2)[-1]["pid"]
        wait_until(
            lambda: len(fd_table(root.pid)) == baseline,
            f"the root's fd count back at {baseline} (now {len(fd_table(root.pid))})",
            timeout=10,
        )
        assert pidfds(root.pid) == 1
        root.send_signal(signal.SIGTERM)
        assert root.wait(60) == 0
    finally:
        if root.poll() is None:
            root.kill()
            root.wait()


def test_stopped_supervisor_has_closed_every_fd_it_opened(events: EventLog) -> None:
    before = fd_table()
    spec = SupervisorSpec(
        "fds",
        SupFlags(intensity=20, period=3600),
        (
            toy(events, "sleeper", "a"),
            toy(events, "exiter", "n", 0, restart="transient"),
            toy(events, "beater", "h", 0.3, restart="temporary", liveness_timeout=0.5),
        ),
    )
    with Supervisor(spec) as sup:
        # An outside SIGTERM, then a crash: both restarted.
        a = sup.which_children()[0].pid or 0
        os.kill(a, signal.SIGTERM)
        a = events.wait_for("start", "a", count=2)[-1]["pid"]
        os.kill(a, signal.SIGKILL)
        events.wait_for("start", "a", count=3)
        # A normal exit (kept, not restarted) and a liveness kill (forgotten).
        wait_until(
            lambda: (
                [(c.id, c.state) for c in sup.which_children()]
                == [("a", ChildState.RUNNING), ("n", ChildState.UNDEFINED)]
            ),
            "n exited and h was killed as hung",
        )
        # Exits the supervisor causes: terminate_child, and a failed start.
        sup.terminate_child("a")
        with pytest.raises(StartFailed):
            sup.start_child(toy(events, "exiter", "early", 9, start_timeout=0.001))
        sup.restart_child("a")
    assert sup.exit_code == 0
    assert fd_table() == before


def test_child_without_a_pidfd_is_killed_and_leaves_no_fd(
    events: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Supervisor(SupervisorSpec("nopidfd", SupFlags(), ())) as sup:
        before = fd_table()
        # Earlier tests may leave long-lived helpers of this process behind
        # (multiprocessing's resource tracker): only a new child counts.
        children_before = set(psutil.Process().children(recursive=True))

        def no_more_fds(pid: int, flags: int = 0) -> int:
            raise OSError(24, "Too many open files")

        monkeypatch.setattr(os, "pidfd_open", no_more_fds)
        with pytest.raises(StartFailed) as e:
            sup.start_child(toy(events, "sleeper", "x"))
        monkeypatch.undo()
        assert e.value.details["reason"] == "spawn"
        # Killed and reaped before start_child returned: nothing runs unwatched.
        assert set(psutil.Process().children(recursive=True)) == children_before
        assert fd_table() == before


def test_fd_table_sees_an_open_file(tmp_path: Path) -> None:
    """The helper the tests above rely on: a file opened here shows up, and goes."""
    before = fd_table()
    with open(tmp_path / "x", "w") as f:
        assert fd_table()[f.fileno()] == str(tmp_path / "x")
    assert fd_table() == before
