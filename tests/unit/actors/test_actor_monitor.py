"""Process monitors: a watched process's exit is reported once, pid reuse is not fooled."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from llamad.actors import monitor
from llamad.actors.monitor import ProcessRef, ProcessWatch, start_ticks

pytestmark = pytest.mark.timeout(60)


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_current_process_is_local_and_alive() -> None:
    me = ProcessRef.current()
    assert me.pid == os.getpid()
    assert me.start_ticks == start_ticks(os.getpid())
    assert me.is_local()
    assert me.alive()


def test_ref_from_another_boot_is_not_local_and_never_alive() -> None:
    me = ProcessRef.current()
    other = ProcessRef(me.pid, me.start_ticks, "another-boot", me.pidns)
    assert not other.is_local()
    assert not other.alive()


def test_recycled_pid_is_not_the_same_incarnation() -> None:
    me = ProcessRef.current()
    impostor = ProcessRef(me.pid, me.start_ticks + 1, me.boot_id, me.pidns)
    assert not impostor.alive()
    watch = ProcessWatch()
    try:
        assert not watch.watch(impostor)
        assert len(watch) == 0
    finally:
        watch.close()


def test_zombie_counts_as_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = ProcessRef.of(proc.pid)
    deadline = time.monotonic() + 30
    # Not reaped yet: the child becomes a zombie, which must read as dead.
    while start_ticks(proc.pid) is not None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert start_ticks(proc.pid) is None
    assert ref is None or not ref.alive()
    proc.wait()


def test_exit_of_a_watched_process_is_reported_once() -> None:
    proc = sleeper()
    watch = ProcessWatch()
    try:
        ref = ProcessRef.of(proc.pid)
        assert ref is not None
        assert watch.watch(ref)
        assert watch.watch(ref)  # idempotent
        assert ref in watch
        assert watch.exited() == []
        proc.kill()
        assert watch.wait(30) == [ref]
        assert watch.exited() == []
        assert ref not in watch
        assert watch.fds() == []
    finally:
        proc.kill()
        proc.wait()
        watch.close()


def test_pidfd_becomes_readable_when_the_process_dies() -> None:
    proc = sleeper()
    watch = ProcessWatch()
    try:
        ref = ProcessRef.of(proc.pid)
        assert ref is not None and watch.watch(ref)
        [fd] = watch.fds()
        assert watch.exited([fd + 1000]) == []  # fds not ours are ignored
        proc.kill()
        proc.wait()
        assert watch.exited([fd]) == [ref]
    finally:
        watch.close()


def test_without_pidfds_the_watch_falls_back_to_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(pid: int, flags: int = 0) -> int:
        raise PermissionError("pidfd_open blocked")

    monkeypatch.setattr(monitor.os, "pidfd_open", refused)
    proc = sleeper()
    watch = ProcessWatch()
    try:
        ref = ProcessRef.of(proc.pid)
        assert ref is not None and watch.watch(ref)
        assert watch.fds() == []
        assert watch.poll_interval() == ProcessWatch.fallback_interval
        proc.kill()
        proc.wait()
        assert watch.wait(30) == [ref]
        assert watch.poll_interval() is None
    finally:
        proc.kill()
        proc.wait()
        watch.close()


def test_unwatch_releases_the_fd() -> None:
    proc = sleeper()
    watch = ProcessWatch()
    try:
        ref = ProcessRef.of(proc.pid)
        assert ref is not None and watch.watch(ref)
        watch.unwatch(ref)
        assert watch.fds() == [] and len(watch) == 0
        proc.kill()
        proc.wait()
        assert watch.exited() == []
    finally:
        watch.close()
