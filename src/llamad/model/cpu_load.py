"""How much of this worker's CPUs other processes keep busy: :class:`OthersGauge`.

The thread governor (:mod:`llamad.model.threads`) falls back to fewer
threads when a decode collapses beside other work, then waits a cool-down
before it tries more threads again, doubling it (up to a minute) each time
a probe fails. When the other work stops, the rest of that wait is decode
speed thrown away: in the peers bench, P14's CPU hogs left the worker on 1
thread with a 16 s cool-down still running when the next round's decode
began. The gauge tells the governor when the other work has gone, so that it
can probe at once (``ThreadGovernor``'s quiet probe).

It reads the kernel's per-CPU times (``/proc/stat``, for the CPUs this
process may run on) and this process's own CPU time; over an interval, busy
time less this process's time is what every other process took (another
worker, a build, a test run, the hypervisor's steal). Linux only; elsewhere
(or when ``/proc/stat`` cannot be read) it reports nothing and the governor
waits out its cool-downs as before.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Final, NamedTuple

import structlog

__all__ = ["OthersGauge", "read_busy_seconds"]

log = structlog.get_logger("llamad.model.cpu_load")

USER_HZ: Final = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
"""Clock ticks per second of ``/proc/stat``'s times (100 on Linux)."""

_BUSY_FIELDS: Final = (0, 1, 2, 5, 6, 7)
"""user, nice, system, irq, softirq, steal (guest time is inside user)."""


def read_busy_seconds(text: str, cpus: frozenset[int] | None) -> float:
    """Busy CPU seconds since boot over ``cpus`` (None: every CPU) from the
    text of ``/proc/stat``. Raises ValueError when no such CPU line is there."""
    total = 0
    found = False
    for line in text.splitlines():
        if not line.startswith("cpu") or line.startswith("cpu "):
            continue
        name, *fields = line.split()
        if cpus is not None and int(name[3:]) not in cpus:
            continue
        values = [int(v) for v in fields]
        total += sum(values[i] for i in _BUSY_FIELDS if i < len(values))
        found = True
    if not found:
        raise ValueError("no per-CPU line for these CPUs in /proc/stat")
    return total / USER_HZ


class _Reading(NamedTuple):
    at: float
    busy_s: float
    own_s: float


class OthersGauge:
    """Cores other processes kept busy on this process's CPUs, over the last
    ``interval_s`` or more (module docstring).

    :meth:`sample` is cheap to call often: it reads ``/proc/stat`` at most
    every ``interval_s`` and otherwise answers the last value. A reading
    more than ``max_age_s`` old (the worker was idle) starts over rather
    than averaging over the gap. Used by one thread.
    """

    def __init__(
        self,
        cpus: Iterable[int] | None = None,
        *,
        stat_path: str = "/proc/stat",
        own_cpu_s: Callable[[], float] = time.process_time,
        interval_s: float = 0.25,
        max_age_s: float = 1.0,
    ) -> None:
        if cpus is None and hasattr(os, "sched_getaffinity"):
            cpus = os.sched_getaffinity(0)
        self._cpus = None if cpus is None else frozenset(cpus)
        self._path = stat_path
        self._own = own_cpu_s
        self._interval = interval_s
        self._max_age = max_age_s
        self._last: _Reading | None = None
        self._value: float | None = None
        self._broken = False

    def sample(self, now: float) -> float | None:
        """Other processes' busy cores over the last interval ending at most
        ``interval_s`` before ``now``; None until two readings exist (or when
        the kernel's counters cannot be read)."""
        last = self._last
        if last is not None and now - last.at < self._interval:
            return self._value
        reading = self._read(now)
        if reading is None:
            return None
        self._last = reading
        if last is None or now - last.at > self._max_age:
            self._value = None
            return None
        elapsed = reading.at - last.at
        others = (reading.busy_s - last.busy_s) - (reading.own_s - last.own_s)
        self._value = max(0.0, others / elapsed)
        return self._value

    def _read(self, now: float) -> _Reading | None:
        if self._broken:
            return None
        try:
            with open(self._path, encoding="ascii") as f:
                busy = read_busy_seconds(f.read(), self._cpus)
        except (OSError, ValueError) as exc:
            self._broken = True
            log.warning("threads.gauge_unavailable", path=self._path, error=str(exc))
            return None
        return _Reading(now, busy, self._own())
