"""The heartbeat beats while the loop makes progress and goes silent for good once a
tick outlives decode_timeout_ms (SPEC M15)."""

from __future__ import annotations

import threading
import time

import pytest

from llamad.model.heartbeat import BusyMark, HeartbeatThread

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def test_busy_mark_records_the_outermost_section() -> None:
    clock = Clock()
    mark = BusyMark(clock)
    assert mark.since is None
    with mark.busy():
        clock.now = 11.0
        with mark.busy():
            assert mark.since == 10.0
        assert mark.since == 10.0
    assert mark.since is None


def test_beats_while_idle_or_within_the_timeout() -> None:
    clock = Clock()
    mark = BusyMark(clock)
    beats: list[float] = []
    hb = HeartbeatThread(mark, timeout_s=2.0, interval_s=0.1, beat=lambda: beats.append(clock.now))
    assert hb.check()
    with mark.busy():
        clock.now += 1.9
        assert hb.check()
    assert len(beats) == 2


def test_overdue_tick_silences_the_heartbeat_for_good() -> None:
    clock = Clock()
    mark = BusyMark(clock)
    beats: list[float] = []
    hb = HeartbeatThread(mark, timeout_s=2.0, interval_s=0.1, beat=lambda: beats.append(clock.now))
    with mark.busy():
        clock.now += 2.5
        assert not hb.check()
    # The tick ended before the supervisor acted: the worker still goes.
    clock.now += 1.0
    assert not hb.check()
    assert beats == []
    assert hb.silenced == 2


def test_thread_beats_periodically_and_stops() -> None:
    mark = BusyMark()
    count = 0
    lock = threading.Lock()

    def beat() -> None:
        nonlocal count
        with lock:
            count += 1

    hb = HeartbeatThread(mark, timeout_s=5.0, interval_s=0.01, beat=beat)
    hb.start()
    deadline = time.monotonic() + 10
    while count < 5:
        assert time.monotonic() < deadline, "the heartbeat thread did not beat"
        time.sleep(0.01)
    hb.stop()
    assert not hb._thread.is_alive()
