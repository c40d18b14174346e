"""The child-side helpers (readiness, heartbeats) and exit classification."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

from llamad.supervisor import child
from llamad.supervisor.exits import ExitReason, classify_exit, describe_exit

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def status_pipe(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    os.set_blocking(r, False)
    monkeypatch.setattr(child, "_ready_sent", False)
    monkeypatch.setattr(child, "_last_beat", 0.0)
    yield r, w
    os.close(r)
    os.close(w)


def supervised(monkeypatch: pytest.MonkeyPatch, fd: int, liveness: float | None) -> None:
    ctx = child.ChildContext("sup", "c", os.getppid(), fd, liveness)
    monkeypatch.setattr(child, "_context", ctx)


def drain(fd: int) -> bytes:
    try:
        return os.read(fd, 4096)
    except BlockingIOError:
        return b""


def test_helpers_are_no_ops_without_a_supervisor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child, "_context", None)
    child.heartbeat()
    child.notify_ready()
    assert child.child_context() is None
    assert child.heartbeat_interval() is None


def test_notify_ready_is_sent_once(
    monkeypatch: pytest.MonkeyPatch, status_pipe: tuple[int, int]
) -> None:
    r, w = status_pipe
    supervised(monkeypatch, w, None)
    child.notify_ready()
    child.notify_ready()
    assert drain(r) == child.READY


def test_heartbeat_writes_at_most_once_per_quarter_timeout(
    monkeypatch: pytest.MonkeyPatch, status_pipe: tuple[int, int]
) -> None:
    r, w = status_pipe
    supervised(monkeypatch, w, 400.0)  # one beat per 100 s: the loop below gets one
    for _ in range(1000):
        child.heartbeat()
    assert drain(r) == child.HEARTBEAT
    assert child.heartbeat_interval() == 100.0


def test_heartbeat_without_liveness_timeout_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, status_pipe: tuple[int, int]
) -> None:
    r, w = status_pipe
    supervised(monkeypatch, w, None)
    child.heartbeat()
    assert drain(r) == b""


@pytest.mark.timeout(10)
def test_heartbeat_never_blocks_on_a_full_pipe(
    monkeypatch: pytest.MonkeyPatch, status_pipe: tuple[int, int]
) -> None:
    _, w = status_pipe
    child.prepare_status_fd(w)  # what the child runner does to the fd it is given
    while True:
        try:
            os.write(w, b"x" * 65536)
        except BlockingIOError:
            break
    supervised(monkeypatch, w, 0.001)
    child.heartbeat()  # must return, not block or raise


@pytest.mark.parametrize(
    ("returncode", "reason"),
    [
        (0, ExitReason.NORMAL),
        (-signal.SIGTERM, ExitReason.SHUTDOWN),
        (143, ExitReason.SHUTDOWN),
        (1, ExitReason.ABNORMAL),
        (3, ExitReason.ABNORMAL),
        (-signal.SIGKILL, ExitReason.ABNORMAL),
        (-signal.SIGSEGV, ExitReason.ABNORMAL),
        (-signal.SIGABRT, ExitReason.ABNORMAL),
        (-signal.SIGINT, ExitReason.ABNORMAL),
    ],
)
def test_exit_status_maps_to_otp_reason(returncode: int, reason: ExitReason) -> None:
    assert classify_exit(returncode) is reason


def test_exit_description_names_signal_or_code() -> None:
    assert describe_exit(-signal.SIGKILL) == "signal SIGKILL"
    assert describe_exit(3) == "exit 3"
