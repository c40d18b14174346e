"""The others gauge (model/cpu_load.py): busy cores of other processes on this worker's CPUs."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from llamad.model.cpu_load import USER_HZ, OthersGauge, read_busy_seconds

pytestmark = pytest.mark.timeout(60)


def stat_text(cpu0: tuple[int, ...], cpu1: tuple[int, ...]) -> str:
    """/proc/stat's layout: the total line, one line per CPU, then others."""
    total = tuple(a + b for a, b in zip(cpu0, cpu1, strict=True))

    def line(name: str, values: tuple[int, ...]) -> str:
        return f"{name} " + " ".join(map(str, values))

    return "\n".join(
        [line("cpu ", total), line("cpu0", cpu0), line("cpu1", cpu1), "intr 1 2 3", "ctxt 9"]
    )


#           user nice system idle iowait irq softirq steal guest guest_nice
CPU0 = (100, 10, 50, 9000, 40, 5, 5, 30, 7, 0)
CPU1 = (200, 0, 100, 8000, 0, 0, 0, 0, 0, 0)


def test_busy_time_is_user_nice_system_irq_softirq_and_steal() -> None:
    text = stat_text(CPU0, CPU1)
    # idle and iowait are not busy; guest is already inside user.
    assert read_busy_seconds(text, frozenset({0})) == pytest.approx(200 / USER_HZ)
    assert read_busy_seconds(text, frozenset({1})) == pytest.approx(300 / USER_HZ)
    assert read_busy_seconds(text, None) == pytest.approx(500 / USER_HZ)


def test_cpus_absent_from_the_kernels_lines_are_an_error() -> None:
    with pytest.raises(ValueError, match="per-CPU"):
        read_busy_seconds(stat_text(CPU0, CPU1), frozenset({7}))


class Own:
    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds


def test_the_gauge_answers_others_busy_cores_over_each_interval(tmp_path: Path) -> None:
    path = tmp_path / "stat"
    own = Own()
    gauge = OthersGauge([0, 1], stat_path=str(path), own_cpu_s=own, interval_s=0.25)
    ticks = [0, 0]

    def kernel(busy0: int, busy1: int) -> None:
        ticks[0] += busy0
        ticks[1] += busy1
        path.write_text(
            stat_text(
                (ticks[0], 0, 0, 1000, 0, 0, 0, 0, 0, 0), (ticks[1], 0, 0, 1000, 0, 0, 0, 0, 0, 0)
            )
        )

    kernel(0, 0)
    assert gauge.sample(10.0) is None  # one reading: nothing to compare with yet
    # 0.5 s: both CPUs fully busy (2 x 0.5 s of ticks), 0.3 s of it this process's.
    kernel(USER_HZ // 2, USER_HZ // 2)
    own.seconds += 0.3
    assert gauge.sample(10.5) == pytest.approx((1.0 - 0.3) / 0.5)
    # Within the interval: the last value, the kernel not read again.
    kernel(USER_HZ, USER_HZ)
    assert gauge.sample(10.6) == pytest.approx(1.4)
    # A reading older than max_age_s (the worker was idle) starts over.
    assert gauge.sample(20.0) is None
    kernel(0, 0)
    own.seconds += 0.25
    assert gauge.sample(20.25) == pytest.approx(0.0)  # only this process ran


def test_a_gauge_without_the_kernels_counters_answers_nothing(tmp_path: Path) -> None:
    gauge = OthersGauge([0], stat_path=str(tmp_path / "absent"))
    assert gauge.sample(1.0) is None
    assert gauge.sample(2.0) is None


def test_the_real_gauge_sees_a_cpu_hog() -> None:
    """Against the real /proc/stat: a busy-loop process beside this idle one
    is at least half a core of 'others' (more on a machine busy already)."""
    gauge = OthersGauge(interval_s=0.25, max_age_s=5.0)
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)  # the interpreter started and spins
        assert gauge.sample(time.monotonic()) is None
        time.sleep(0.6)
        others = gauge.sample(time.monotonic())
    finally:
        hog.kill()
        hog.wait()
    assert others is not None
    assert others >= 0.5
