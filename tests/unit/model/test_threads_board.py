"""The daemon-wide thread board (SPEC M14): real files, real OFD locks, real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llamad.errors import ConfigError
from llamad.model.thread_board import ThreadBoard
from llamad.model.threads import ThreadGovernor, ThreadPolicy

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def board_path(tmp_path: Path) -> Path:
    return tmp_path / "threads"


def test_workers_on_one_board_see_each_other_busy(board_path: Path) -> None:
    with ThreadBoard(board_path) as a, ThreadBoard(board_path) as b:
        assert a.slot is not None and b.slot is not None and a.slot != b.slot
        now = time.monotonic()
        assert a.busy_workers(now) == 0
        a.mark_busy(now + 10.0)
        assert a.busy_workers(now) == 1
        assert b.busy_workers(now) == 1
        b.mark_busy(now + 10.0)
        assert a.busy_workers(now) == b.busy_workers(now) == 2


def test_a_busy_mark_expires_on_its_own(board_path: Path) -> None:
    with ThreadBoard(board_path) as a, ThreadBoard(board_path) as b:
        a.mark_busy(100.0)
        assert b.busy_workers(99.0) == 1
        assert b.busy_workers(100.5) == 0


def test_a_closed_board_gives_its_slot_back_idle(board_path: Path) -> None:
    a = ThreadBoard(board_path)
    slot = a.slot
    a.mark_busy(time.monotonic() + 100.0)
    a.close()
    a.close()  # idempotent
    assert a.busy_workers(time.monotonic()) == 0
    with ThreadBoard(board_path) as b:
        assert b.slot == slot  # reused
        assert b.busy_workers(time.monotonic()) == 0
    a.mark_busy(time.monotonic() + 100.0)  # after close: ignored, not a crash


def test_a_killed_workers_mark_is_dropped_at_once(board_path: Path) -> None:
    code = (
        "import sys, time\n"
        "from llamad.model.thread_board import ThreadBoard\n"
        f"b = ThreadBoard({str(board_path)!r})\n"
        "b.mark_busy(time.monotonic() + 3600)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        with ThreadBoard(board_path) as me:
            assert me.busy_workers(time.monotonic()) == 1
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
            # Its mark still says an hour, but nobody holds its slot any more.
            assert me.busy_workers(time.monotonic()) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)


def test_a_slot_taken_over_from_a_dead_worker_starts_idle(board_path: Path) -> None:
    code = (
        "import os, time\n"
        "from llamad.model.thread_board import ThreadBoard\n"
        f"b = ThreadBoard({str(board_path)!r})\n"
        "b.mark_busy(time.monotonic() + 3600)\n"
        "os._exit(0)\n"  # no close: the kernel drops the lock, the mark stays
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)
    with ThreadBoard(board_path) as heir, ThreadBoard(board_path) as other:
        assert heir.slot == 0
        assert other.busy_workers(time.monotonic()) == 0  # the heir has not decoded yet


def test_a_full_board_still_lets_a_worker_run(board_path: Path) -> None:
    with ThreadBoard(board_path, slots=1) as first, ThreadBoard(board_path, slots=1) as extra:
        assert first.slot == 0 and extra.slot is None
        now = time.monotonic()
        first.mark_busy(now + 10.0)
        extra.mark_busy(now + 10.0)
        assert extra.busy_workers(now) == 2  # itself and the registered one
        assert first.busy_workers(now) == 1  # the unregistered one is invisible


def test_the_first_opener_decides_the_slot_count(board_path: Path) -> None:
    with ThreadBoard(board_path, slots=3) as a, ThreadBoard(board_path, slots=50) as b:
        assert a.slots == b.slots == 3
        assert board_path.stat().st_size == 16 + 3 * 8


def test_an_empty_file_becomes_a_board(board_path: Path) -> None:
    board_path.write_bytes(b"")
    with ThreadBoard(board_path, slots=5) as b:
        assert b.slots == 5 and b.slot == 0


@pytest.mark.parametrize("content", [b"LLMDTHR", b"NOTABORD" + bytes(24), b"x" * 100])
def test_a_file_that_is_not_a_board_is_refused_untouched(board_path: Path, content: bytes) -> None:
    board_path.write_bytes(content)
    with pytest.raises(ConfigError) as err:
        ThreadBoard(board_path)
    assert err.value.details["field"] == "threads.board"
    assert board_path.read_bytes() == content


@pytest.mark.parametrize("slots", [0, -1, True, 10**6])
def test_a_bad_slot_count_is_refused(board_path: Path, slots: int) -> None:
    with pytest.raises(ConfigError):
        ThreadBoard(board_path, slots=slots)
    assert not board_path.exists()


def test_governors_on_real_boards_split_the_cores(board_path: Path) -> None:
    policy = ThreadPolicy(max_threads=2, cores=2)
    with ThreadBoard(board_path) as ba, ThreadBoard(board_path) as bb:
        a = ThreadGovernor(policy, board=ba)
        b = ThreadGovernor(policy, board=bb)
        assert a.threads_for(1) == 2
        assert b.threads_for(1) == 1
        assert a.threads_for(1) == 1
        a.record(1, 0.01)
        b.record(1, 0.01)


def test_the_board_file_is_private(board_path: Path) -> None:
    with ThreadBoard(board_path):
        assert board_path.stat().st_mode & 0o777 == 0o600


def test_a_worker_killed_mid_step_frees_its_share_at_once(board_path: Path) -> None:
    # A step's mark stands for as long as the step runs (no end time): only
    # the worker's death can end it early, and it does.
    code = (
        "from llamad.model.thread_board import ThreadBoard\n"
        "from llamad.model.threads import ThreadGovernor, ThreadPolicy\n"
        "import time\n"
        f"board = ThreadBoard({str(board_path)!r})\n"
        "gov = ThreadGovernor(ThreadPolicy(max_threads=2, cores=2), board=board)\n"
        "gov.threads_for(512, 512)\n"
        "print('stepping', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "stepping"
        with ThreadBoard(board_path) as me:
            assert me.busy_workers(time.monotonic() + 3600) == 1
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
            assert me.busy_workers(time.monotonic()) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=10)
