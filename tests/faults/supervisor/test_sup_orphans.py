"""No orphans, no zombies: whatever kills a supervisor, its whole subtree dies with it."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import pytest

from llamad.supervisor import (
    ChildState,
    Supervisor,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)
from llamad.supervisor.exits import (
    EXIT_CHILD_BOOT_FAILED,
    EXIT_CRASHED,
    EXIT_ESCALATED,
    EXIT_ORPHANED,
)
from sup_helpers import EventLog, pid_alive, toy, wait_until

pytestmark = pytest.mark.timeout(120)

_PR_SET_CHILD_SUBREAPER = 36


@contextmanager
def subreaper() -> Iterator[None]:
    """Adopt orphaned descendants so the test can reap them (and prove they died).

    Without it they would be re-parented to PID 1, which in a container may
    never reap them.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        yield
    finally:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def not_running(pid: int) -> bool:
    """Dead: reaped by us now, already gone, or a zombie waiting for its new parent."""
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped == pid
    except ChildProcessError:
        return not pid_alive(pid)


def reaped_or_gone(pid: int) -> bool:
    try:
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        return reaped == pid
    except ChildProcessError:
        return not psutil.pid_exists(pid)


def tree(events: EventLog) -> SupervisorSpec:
    inner = SupervisorSpec(
        "inner",
        SupFlags(),
        (toy(events, "sleeper", "x"), toy(events, "sleeper", "y", 0.0, True, shutdown=1.0)),
    )
    return SupervisorSpec(
        "root",
        SupFlags(),
        (toy(events, "sleeper", "a"), supervisor_child(inner), toy(events, "sleeper", "b")),
    )


def spawn_root(spec: SupervisorSpec) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "sup_toys", json.dumps(spec.to_wire())])


def test_sigkill_of_root_supervisor_kills_every_descendant_within_2s(events: EventLog) -> None:
    with subreaper():
        root = spawn_root(tree(events))
        try:
            events.wait_for("start", "b")
            descendants = [p.pid for p in psutil.Process(root.pid).children(recursive=True)]
            assert len(descendants) == 5  # a, inner, x, y (ignores SIGTERM), b
            os.kill(root.pid, signal.SIGKILL)
            killed_at = time.monotonic()
            root.wait()
            wait_until(lambda: all(not_running(p) for p in descendants), "descendants dead", 10)
            assert time.monotonic() - killed_at <= 2.0
        finally:
            if root.poll() is None:
                root.kill()
                root.wait()
        wait_until(lambda: all(reaped_or_gone(p) for p in descendants), "descendants reaped")


def test_sigterm_of_root_supervisor_stops_the_tree_in_reverse_order(events: EventLog) -> None:
    root = spawn_root(tree(events))
    events.wait_for("start", "b")
    os.kill(root.pid, signal.SIGTERM)
    # y ignores SIGTERM: it is killed after its 1 s shutdown timeout.
    assert root.wait(60) == 0
    assert events.sequence("term") == [("term", "b"), ("term", "y"), ("term", "x"), ("term", "a")]
    assert not any(pid_alive(e["pid"]) for e in events.of("start"))


def test_root_supervisor_exits_non_zero_when_intensity_is_exceeded(events: EventLog) -> None:
    spec = SupervisorSpec(
        "root", SupFlags(intensity=0), (toy(events, "sleeper", "a"), toy(events, "exiter", "e", 1))
    )
    root = spawn_root(spec)
    assert root.wait(60) == EXIT_ESCALATED
    assert events.sequence("term") == [("term", "a")]


def test_sigkill_of_nested_supervisor_kills_its_children_and_it_is_restarted(
    events: EventLog,
) -> None:
    with subreaper(), Supervisor(tree(events)) as sup:
        inner = sup.which_children()[1]
        old = {e["name"]: e["pid"] for e in events.of("start") if e["name"] in ("x", "y")}
        os.kill(inner.pid or 0, signal.SIGKILL)
        wait_until(lambda: all(reaped_or_gone(p) for p in old.values()), "x and y dead")
        wait_until(
            lambda: (
                (c := sup.which_children()[1]).state is ChildState.RUNNING and c.pid != inner.pid
            ),
            "inner restarted",
        )
        events.wait_for("start", "y", count=2)


def test_child_runner_exits_if_its_parent_is_already_gone() -> None:
    argv = [
        sys.executable,
        "-m",
        "llamad.supervisor.run_child",
        "--sup",
        "s",
        "--id",
        "c",
        "--parent",
        "1",  # not our pid: as if the real parent died before prctl took effect
        "--boot-fd",
        "0",
        "--status-fd",
        "1",
    ]
    assert subprocess.run(argv, timeout=60, check=False).returncode == EXIT_ORPHANED


@pytest.mark.parametrize("boot", [b"", b"\xc1garbage", b"\x93\x01\x02\x03", b"\x81\xa6target\x07"])
def test_malformed_boot_record_fails_the_child_cleanly(boot: bytes) -> None:
    boot_r, boot_w = os.pipe()
    status_r, status_w = os.pipe()
    argv = [
        sys.executable,
        "-m",
        "llamad.supervisor.run_child",
        "--sup",
        "s",
        "--id",
        "c",
        "--parent",
        str(os.getpid()),
        "--boot-fd",
        str(boot_r),
        "--status-fd",
        str(status_w),
    ]
    proc = subprocess.Popen(argv, pass_fds=(boot_r, status_w), stderr=subprocess.DEVNULL)
    os.close(boot_r)
    os.close(status_w)
    os.write(boot_w, boot)
    os.close(boot_w)
    assert proc.wait(60) == EXIT_CHILD_BOOT_FAILED
    assert os.read(status_r, 16) == b""  # it never claimed to be ready
    os.close(status_r)


def test_supervisor_loop_failure_kills_its_children(events: EventLog) -> None:
    sup = Supervisor(
        SupervisorSpec(
            "bug", SupFlags(), (toy(events, "sleeper", "a"), toy(events, "sleeper", "b"))
        )
    )
    sup.start()

    def broken(*args: object) -> None:
        raise RuntimeError("injected bug in the restart logic")

    sup._core.exited = broken  # type: ignore[method-assign,assignment]
    a, b = (c.pid or 0 for c in sup.which_children())
    os.kill(a, signal.SIGKILL)
    assert sup.wait(60) == EXIT_CRASHED
    assert not pid_alive(b)


def test_sigterm_during_a_child_start_abandons_the_start(events: EventLog) -> None:
    spec = SupervisorSpec(
        "root",
        SupFlags(),
        (toy(events, "sleeper", "a"), toy(events, "slow_ready", "b", 3600.0, start_timeout=None)),
    )
    root = spawn_root(spec)
    booting = events.wait_for("booting", "b")[0]["pid"]
    os.kill(root.pid, signal.SIGTERM)
    # b would never report ready and has no start timeout: only the stop request ends the wait.
    assert root.wait(60) == 0
    assert events.sequence("term") == [("term", "a")]
    assert not pid_alive(booting)
