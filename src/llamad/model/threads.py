"""How many threads each decode runs on (SPEC M14): :class:`ThreadGovernor`.

ggml's threads meet at a barrier after every graph node (several hundred per
token). When the kernel cannot run all of a decode's threads at once, because
another worker or another process holds the cores, every barrier waits for a
descheduled thread and the step collapses (measured on 2 cores with two CPU
hogs: ~230x slower at 2 threads, never at 1; ``docs/internals/threads.md``).
The governor keeps a worker out of that state, and out of needless
fallbacks, these ways:

* **A daemon-wide budget.** Every worker marks itself busy on a shared
  :class:`BusyBoard` before each decode; a worker decodes with at most
  ``cores // busy_workers`` threads, so busy workers together never ask for
  more threads than there are cores. A worker left with no request clears
  its mark at once (:meth:`ThreadGovernor.idle`).
* **Collapse detection.** Each step's time is compared with the recent
  median of healthy steps of the same thread count and the same shape: rows
  and KV cells attended over, each bucketed by powers of two
  (:func:`step_shape`; a one-row decode over 2,048 cells costs 2-4x one over
  16, and is no collapse of it). The first ``settle_steps`` steps after the
  count changes are judged but not learnt from. A step ``collapse_factor`` times slower (and
  ``collapse_min_s`` slower in absolute terms) is a collapse: the worker
  halves its thread ceiling (down to 1) for a cool-down, then *probes*:
  ``probe_steps`` steps at the higher count, kept if they beat the
  fallback count's recent median by ``probe_gain``, or if they are no
  slower than it by the same margin (``1 / probe_gain``) without collapsing
  against the higher count's own median (a probe step that collapses
  against the fallback's median ends the probe at once). A failed probe doubles the
  cool-down (up to ``cooldown_max_s``); a kept probe re-baselines the higher
  count with the probe's own steps, so a machine that is busier than when the
  baseline was learnt does not fall back again at once.
* **Exploration.** A worker that starts on an already busy machine learns a
  slow baseline and sees no collapse, so now and then (first as soon as a
  baseline exists, then every ``explore_s``, doubling while it finds
  nothing, up to ``explore_max_s``) it tries ``probe_steps`` steps at half
  its threads and falls back if they are faster by ``probe_gain``. It
  explores on small steps only (at most :data:`EXPLORE_MAX_ROWS` rows:
  decode steps): on a quiet machine half the threads make a step ~1.9x slower, which
  costs a few ms on a decode step but over a second on a 512-row prefill
  chunk (measured: a cold 1024-token prompt whose first chunk fell in an
  exploration took 4.1 s instead of 3.0 s). A larger step during an
  exploration runs on the full count and is judged as usual. A shape on
  which half the threads already measured slower than the full count runs
  now is not explored again until the full count slows to that level.
  With a ``gauge`` (``cpu_load``) it explores only while other processes
  are seen holding cores: with nothing competing fewer threads cannot win,
  and a win on the noise of a few one-row steps lowered the ceiling for the
  prefill chunks after it too.
* **The daemon's own work is not the machine's load.** A step that
  overlapped work the daemon itself runs beside the loop (``own_work``: the
  worker's writer pool saving, whose CRC and copy take both cores for tens
  of ms, and cache-meta's mover copying a row to disk) is neither judged
  nor learnt from: it reads slow while nothing outside is busy, and judging
  it fell back to 1 thread, halving every cold prompt of the next 16 s
  (``bench/ttft_sequence_probe.py``). A short step (at most
  :data:`EXPLORE_MAX_ROWS` rows) that starts while such work runs takes half
  the threads when the busy workers' threads and that work together ask
  for more than the cores (:data:`OWN_WORK_CORES`): on every thread it
  waited at its barriers for the cores the save or copy held (p99
  inter-token latency 61.7 ms with continued saves against 12.0 without,
  P8), and a decode step costs little more on fewer. A longer step keeps
  its threads: a prefill chunk (~1 s) outlasts a save (tens of ms), and on
  half the threads would take twice as long.
* **A short step that collapses alone is a burst.** Another process that
  takes a core for 20-70 ms (the daemon's own cache-meta copying a row to
  disk, a client waking) makes the one short step under way collapse, and
  nothing after it: a collapse of a step of at most
  :data:`EXPLORE_MAX_ROWS` rows falls back only when the next step judged
  collapses too (a few ms more on a real collapse). A longer step falls
  back at once: a burst cannot make a prefill chunk 3x slower, and another
  collapsed chunk would cost seconds.

Why a probe up need not be faster: on short steps (a one-row decode of a
small model) 2 threads are no faster than 1, and probes run on whatever
steps come. A probe that had to be faster there never went back up after a
burst, while the prefill chunks that run twice as fast on 2 threads ran on
1 for minutes (cool-downs doubling to 16 s and more). An exploration down
still needs fewer threads faster by ``probe_gain``: one margin, tested from
both sides.

The backend calls it around every decode (``docs/internals/threads.md``)::

    n = governor.threads_for(rows, kv_cells)   # before: marks this worker busy
    if n != ctx.threads[0]:
        ctx.set_threads(n)                     # both single-row and batch counts
    t0 = time.perf_counter()
    ctx.decode(batch)
    governor.record(rows, time.perf_counter() - t0, kv_cells)   # after: judges it

``kv_cells`` is the number of KV cells the decode attends over per row, as
the caller can tell it (:meth:`~llamad.model.llama_backend.LlamaBackend.attended_cells`:
the plan's furthest position with flash attention, every sequence's cells
without it); ``0`` when unknown, which judges by rows alone.

Pure logic: the clock and the board are injected, so unit tests step it
without processes or a model. :meth:`ThreadGovernor.status` returns an
immutable snapshot, safe to read from a status thread while the loop decodes.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final, Protocol

import msgspec
import structlog

from llamad.errors import ConfigError
from llamad.model.wire import CollapseReport, ThreadStatus

__all__ = [
    "EXPLORE_MAX_ROWS",
    "OWN_WORK_CORES",
    "QUIET_SLACK_CORES",
    "BusyBoard",
    "CollapseReport",
    "LoadGauge",
    "OwnWork",
    "SoloBoard",
    "ThreadGovernor",
    "ThreadPolicy",
    "ThreadStatus",
    "available_cores",
    "kv_bucket",
    "rows_bucket",
    "step_shape",
]

log = structlog.get_logger("llamad.model.threads")

Clock = Callable[[], float]


def available_cores() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


EXPLORE_MAX_ROWS: Final = 16
"""The largest step an exploration runs on fewer threads: decode steps of up
to 16 streams. A prefill chunk is larger (``default_chunk_size`` is at least
64 rows) and costs over a second at half the threads (module doc)."""


def rows_bucket(rows: int) -> int:
    """Batch shapes that cost about the same: 1, 2, 3-4, 5-8, 9-16, ... rows."""
    return max(0, rows - 1).bit_length()


KV_BUCKET_CELLS: Final = 256
"""KV extents below this cost the same: llama.cpp pads the cells a decode
attends over to a multiple of 256."""


def kv_bucket(cells: int) -> int:
    """KV extents that cost about the same: 0-255, 256-511, 512-1023, ... cells.

    Within one bucket the attended cells differ by at most 2x, so a step's
    attention does too, and the whole step by less: under ``collapse_factor``.
    """
    return (max(0, cells) // KV_BUCKET_CELLS).bit_length()


def step_shape(rows: int, kv_cells: int) -> tuple[int, int]:
    """The key a step is judged under besides its thread count: steps of one
    shape cost about the same on a quiet machine (:func:`rows_bucket`,
    :func:`kv_bucket`)."""
    return rows_bucket(rows), kv_bucket(kv_cells)


class BusyBoard(Protocol):
    """Where workers tell each other they are decoding (the daemon-wide budget).

    Times are the governor's clock (``time.monotonic`` for a board shared
    between processes: CLOCK_MONOTONIC is one clock for the whole machine).
    """

    def mark_busy(self, until: float) -> None:
        """This worker counts as busy until ``until``."""
        ...

    def busy_workers(self, now: float) -> int:
        """Workers busy at ``now``, this one included if it marked itself."""
        ...


class LoadGauge(Protocol):
    """Cores other processes keep busy (:class:`~llamad.model.cpu_load.OthersGauge`)."""

    def sample(self, now: float) -> float | None:
        """Their busy cores over a recent interval; None when not known."""
        ...


OwnWork = Callable[[], int | None]
"""Work the daemon itself runs beside the worker's loop (module doc): None
while some runs, otherwise a count that moves each time some starts or ends
(:meth:`llamad.model.client_cache_view.ClientCacheView.quiet_epoch`: the
writer pool's saves and cache-meta's copies)."""

OWN_WORK_CORES: Final = 2
"""The most cores the daemon's own work takes at once: a save's CRC runs on
two threads (``crc32c_split``); a copy takes one."""


def _no_own_work() -> int:
    return 0


QUIET_SLACK_CORES: Final = 0.5
"""A quiet probe goes ahead while other processes keep at most the cores the
higher count leaves free plus this: the client's reading thread, the
daemon's other processes and the machine's odd task take a fraction of a
core; a CPU hog takes a whole one."""


class SoloBoard:
    """A board with this worker alone on it (no daemon-wide budget)."""

    def __init__(self) -> None:
        self._until = -math.inf

    def mark_busy(self, until: float) -> None:
        self._until = until

    def busy_workers(self, now: float) -> int:
        return 1 if self._until >= now else 0


def _bad(name: str, message: str) -> ConfigError:
    return ConfigError(f"threads.{name}: {message}", details={"field": f"threads.{name}"})


def _positive(name: str, value: object, *, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        kind = "an integer" if integer else "a number"
        raise _bad(name, f"must be {kind}, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _bad(name, f"must be > 0, not {value!r}")


@dataclass(frozen=True)
class ThreadPolicy:
    """The governor's settings; invalid values raise naming the field.

    ``max_threads``: the configured decode thread count (the context's
    ``n_threads``), the most any step uses. ``cores``: CPUs shared by the
    daemon's workers (default: this process's affinity). ``busy_linger_s``:
    how long after its last step a worker still counts as busy (a worker
    between two ticks has not left). The rest tune collapse detection,
    probing and exploring (module docstring); ``explore_first_s`` delays the
    first exploration. The defaults come from the measurements in
    ``docs/internals/threads.md``.
    """

    max_threads: int
    cores: int = field(default_factory=available_cores)
    collapse_factor: float = 3.0
    collapse_min_s: float = 0.005
    window: int = 32
    min_samples: int = 4
    settle_steps: int = 2
    cooldown_s: float = 2.0
    cooldown_max_s: float = 60.0
    probe_steps: int = 4
    probe_gain: float = 0.9
    explore_first_s: float = 0.0
    explore_s: float = 30.0
    explore_max_s: float = 300.0
    busy_linger_s: float = 0.5

    def __post_init__(self) -> None:
        for name in ("max_threads", "cores", "window", "min_samples", "probe_steps"):
            _positive(name, getattr(self, name), integer=True)
        for name in (
            "collapse_factor",
            "collapse_min_s",
            "cooldown_s",
            "cooldown_max_s",
            "explore_s",
            "explore_max_s",
        ):
            _positive(name, getattr(self, name))
        _positive("busy_linger_s", self.busy_linger_s)
        first = self.explore_first_s
        if (
            isinstance(first, bool)
            or not isinstance(first, int | float)
            or not 0 <= first < math.inf
        ):
            raise _bad("explore_first_s", f"must be a number >= 0, not {first!r}")
        _positive("probe_gain", self.probe_gain)
        if self.collapse_factor <= 1:
            raise _bad("collapse_factor", f"must be > 1, not {self.collapse_factor!r}")
        settle = self.settle_steps
        if isinstance(settle, bool) or not isinstance(settle, int) or settle < 0:
            raise _bad("settle_steps", f"must be an integer >= 0, not {settle!r}")
        if self.min_samples > self.window:
            raise _bad("min_samples", f"must be <= window ({self.window}), not {self.min_samples}")
        if self.cooldown_max_s < self.cooldown_s:
            raise _bad("cooldown_max_s", f"must be >= cooldown_s ({self.cooldown_s})")
        if self.explore_max_s < self.explore_s:
            raise _bad("explore_max_s", f"must be >= explore_s ({self.explore_s})")
        if self.probe_gain > 1:
            raise _bad("probe_gain", f"must be in (0, 1], not {self.probe_gain!r}")


_Shape = tuple[int, int]  # step_shape(rows, kv_cells)


@dataclass
class _Collapse:
    threads: int
    rows: int
    kv_cells: int
    seconds: float
    median: float
    at: float


@dataclass
class _Probe:
    """A few steps at ``threads`` judged against ``against``'s recent median:
    up after a fallback, or down to explore whether fewer threads are faster."""

    threads: int
    against: int
    samples: list[tuple[_Shape, float]] = field(default_factory=list)

    @property
    def up(self) -> bool:
        return self.threads > self.against


class ThreadGovernor:
    """Chooses each decode's thread count and learns from its time (module docstring).

    Used by one thread (the worker's loop); :meth:`status` may be called from
    any thread. ``own_work`` (module doc) may also be set after construction,
    between steps: the worker builds its writer pool after the backend.
    """

    def __init__(
        self,
        policy: ThreadPolicy,
        *,
        board: BusyBoard | None = None,
        clock: Clock = time.monotonic,
        gauge: LoadGauge | None = None,
        own_work: OwnWork | None = None,
    ) -> None:
        self.policy = policy
        self.own_work: OwnWork = own_work if own_work is not None else _no_own_work
        self._work_before: int | None = 0  # own_work() as the step under way began
        self._beside_own_work = 0
        self._halved_beside_own_work = 0
        # A short step that collapsed, waiting for the next judged step to
        # confirm it (module doc); bursts: those the next step did not.
        self._suspect: _Collapse | None = None
        self._bursts = 0
        self._board: BusyBoard = board if board is not None else SoloBoard()
        self._clock = clock
        self._gauge = gauge
        self._quiet_probes = 0
        # When the ceiling last fell or a probe was last judged: a quiet
        # probe waits the base cool-down after either.
        self._settled_at = -math.inf
        self._history: dict[tuple[int, _Shape], deque[float]] = {}
        self._ceiling = policy.max_threads
        self._cooldown = policy.cooldown_s
        self._retry_at: float | None = None
        self._explore_every = policy.explore_s
        # A worker may start on a machine that is already busy: by default it
        # explores fewer threads as soon as it has a baseline to compare with.
        self._explore_at = clock() + policy.explore_first_s
        self._probe: _Probe | None = None
        self._pending: int | None = None  # threads of the step under way
        self._pending_probe = False  # whether that step is one of the probe's
        self._marked = False  # whether this worker's busy mark may stand on the board
        self._threads = policy.max_threads
        self._since_switch = 0  # steps at the current count since it last changed
        self._busy = 1
        self._budget = self._budget_for(1)
        self._fallbacks = 0
        self._collapses = 0
        self._probes = 0
        self._probes_kept = 0
        self._explorations = 0
        self._explorations_kept = 0
        self._last: _Collapse | None = None
        self._snapshot: ThreadStatus | None = None
        self._snapshot_of: tuple[float, ...] = ()

    # -- the two calls around a decode ------------------------------------------

    def threads_for(self, rows: int, kv_cells: int = 0) -> int:
        """Threads for the next decode of ``rows`` rows attending over
        ``kv_cells`` KV cells (0: unknown); marks this worker busy."""
        self._check_step(rows, kv_cells)
        now = self._clock()
        shape = step_shape(rows, kv_cells)
        # Busy for as long as the step runs, however long that is (record() or
        # abandon() sets the linger when it ends): a mark that guessed the
        # step's length lapsed under a slow step, exactly when the machine was
        # loaded, and another worker then took every core. A worker that dies
        # mid-step still frees its share (the board ignores a dead worker's slot).
        self._board.mark_busy(math.inf)
        self._marked = True
        self._busy = max(1, self._board.busy_workers(now))
        self._budget = self._budget_for(self._busy)
        limit = min(self._ceiling, self._budget)
        probe = self._probe
        if probe is not None and max(probe.threads, probe.against) > self._budget:
            # The budget shrank under the probe: no verdict either way.
            self._probe = probe = None
            self._retry_at = now + self._cooldown
        if probe is None:
            self._probe_early_when_quiet(now)
            probe = self._probe = self._maybe_probe(now, limit, shape, rows)
        # An exploration skips large steps (module doc): they run on the limit.
        probing = probe is not None and (probe.up or rows <= EXPLORE_MAX_ROWS)
        self._pending_probe = probing
        threads = probe.threads if probe is not None and probing else limit
        work = self._work_before = self.own_work()
        crowded = threads * self._busy + OWN_WORK_CORES > self.policy.cores
        if work is None and rows <= EXPLORE_MAX_ROWS and threads > 1 and crowded:
            # A save or a copy holds cores now (module doc): a short step on
            # every thread would wait at its barriers for them.
            threads //= 2
            self._halved_beside_own_work += 1
        if threads != self._threads:
            self._since_switch = 0
        self._pending = threads
        self._threads = threads
        return threads

    def record(self, rows: int, seconds: float, kv_cells: int = 0) -> None:
        """Judge the step :meth:`threads_for` was asked about (the same ``rows``
        and ``kv_cells``): it took ``seconds``."""
        self._check_step(rows, kv_cells)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds < 0:
            raise ValueError(f"a step's time must be a number >= 0, not {seconds!r}")
        threads = self._pending if self._pending is not None else self._threads
        probing, self._pending, self._pending_probe = self._pending_probe, None, False
        now = self._clock()
        self._board.mark_busy(now + self.policy.busy_linger_s)
        self._marked = True
        shape = step_shape(rows, kv_cells)
        probe = self._probe
        before, after = self._work_before, self.own_work()
        if before is None or after is None or before != after:
            # The worker's own work ran beside the step (module doc): its time
            # says nothing about the machine; a probe waits for other steps.
            self._beside_own_work += 1
        elif probe is not None and probing and threads == probe.threads:
            probe.samples.append((shape, float(seconds)))
            # A step that collapses against the count it is compared with
            # settles the probe at once: more such steps would only cost.
            base = self._median(probe.against, shape)
            hopeless = base is not None and self._collapsed(float(seconds), base)
            if hopeless or len(probe.samples) >= self.policy.probe_steps:
                self._judge_probe(probe, now)
        else:
            median = self._median(threads, shape)
            if median is not None and self._collapsed(float(seconds), median):
                collapse = _Collapse(threads, rows, kv_cells, float(seconds), median, now)
                if threads > 1 and rows <= EXPLORE_MAX_ROWS and self._suspect is None:
                    self._suspect = collapse  # a burst unless the next step confirms it
                else:
                    self._suspect = None
                    self._on_collapse(collapse)
            else:
                if median is not None and self._suspect is not None:
                    self._suspect = None  # the next step ran as usual: a burst
                    self._bursts += 1
                if self._since_switch >= self.policy.settle_steps:
                    # The first steps at a new count (a new context's page
                    # faults, threads starting) would make it look slower than it is.
                    self._samples(threads, shape).append(float(seconds))
        self._since_switch += 1

    def abandon(self) -> None:
        """The step :meth:`threads_for` was asked about ended without a time to
        judge (the decode raised): it is not learnt from, and the busy mark
        turns into the usual linger."""
        self._pending, self._pending_probe = None, False
        if self._marked:
            self._board.mark_busy(self._clock() + self.policy.busy_linger_s)

    def idle(self) -> None:
        """This worker has nothing left to decode: its share of the budget goes
        back now rather than ``busy_linger_s`` after its last step. The linger
        covers the gap between two ticks of a working worker; an idle one kept
        another worker's next request on ``cores // 2`` threads (a cold
        prompt's first 512-row chunk arriving within the linger ran on 1 thread)."""
        if self._marked:
            self._marked = False
            self._board.mark_busy(-math.inf)
        if self._gauge is not None and self._retry_at is not None and self._ceiling < self._budget:
            # Falling back: a load reading as the worker goes idle, so that the
            # next request's first step can tell whether the other work went
            # meanwhile (the load over the idle gap). Without it the gauge's
            # first reading after the gap answered None, and a one-chunk cold
            # prompt (one step) ran on the fallback's threads: 248 tok/s
            # against 450-475 after P14's hogs (bench/after_hogs_probe.py).
            self._gauge.sample(self._clock())

    def status(self) -> ThreadStatus:
        """A snapshot for the worker's ``status`` (ages computed now)."""
        # The worker publishes before every decode step and the counts
        # rarely change between two: the snapshot is built again only when
        # one of the values it shows did.
        shown = self._shown()
        snap = self._snapshot
        if snap is None or shown != self._snapshot_of:
            snap = self._snapshot = self._build_snapshot()
            self._snapshot_of = shown
        last = self._last
        if last is None and self._retry_at is None:
            return snap  # built with no collapse and no probe due
        now = self._clock()
        report = (
            None
            if last is None
            else CollapseReport(
                threads=last.threads,
                rows=last.rows,
                step_ms=round(last.seconds * 1e3, 3),
                median_ms=round(last.median * 1e3, 3),
                age_s=round(max(0.0, now - last.at), 3),
                kv_cells=last.kv_cells,
            )
        )
        retry = self._retry_at
        next_probe = None if retry is None or not snap.fallback else round(max(0.0, retry - now), 3)
        return msgspec.structs.replace(snap, last_collapse=report, next_probe_s=next_probe)

    # -- internals ------------------------------------------------------------------

    @staticmethod
    def _check_step(rows: int, kv_cells: int) -> None:
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"a step decodes at least one row, not {rows!r}")
        if isinstance(kv_cells, bool) or not isinstance(kv_cells, int) or kv_cells < 0:
            raise ValueError(f"a step's KV cells must be an integer >= 0, not {kv_cells!r}")

    def _budget_for(self, busy: int) -> int:
        return max(1, min(self.policy.max_threads, self.policy.cores // busy))

    def _maybe_probe(self, now: float, limit: int, shape: _Shape, rows: int) -> _Probe | None:
        retry = self._retry_at
        if self._ceiling < self._budget and retry is not None and now >= retry:
            self._probes += 1
            probe = _Probe(threads=self._up_count(), against=self._ceiling)
        elif (
            limit > 1
            and rows <= EXPLORE_MAX_ROWS
            and now >= self._explore_at
            and self._worth_exploring(limit, shape)
            and self._others_compete(now, limit)
        ):
            self._explorations += 1
            probe = _Probe(threads=limit // 2, against=limit)
        else:
            return None
        log.info("threads.probe", threads=probe.threads, against=probe.against)
        return probe

    def _quiet_for(self, others: float, threads: int) -> bool:
        """Whether other processes' ``others`` busy cores leave ``threads``
        their cores (:data:`QUIET_SLACK_CORES`)."""
        return others <= self.policy.cores - threads + QUIET_SLACK_CORES

    def _others_compete(self, now: float, threads: int) -> bool:
        """Whether an exploration of fewer than ``threads`` may win: other
        processes hold some of their cores (``cpu_load``). Without a gauge,
        assumed. With one, only on a reading that says so: an unknown load
        (the gauge's first reading after a pause answers None) waits for the
        next one, a quarter second on. With nothing competing fewer threads
        cannot win, and an exploration that "won" on the noise of four
        one-row steps (which run as fast on 1 thread as on 2) lowered the
        ceiling for every step: the next prefill chunks ran on 1 thread, at
        half speed, until a probe went back up."""
        if self._gauge is None:
            return True
        others = self._gauge.sample(now)
        return others is not None and not self._quiet_for(others, threads)

    def _worth_exploring(self, limit: int, shape: _Shape) -> bool:
        """Whether half the threads might beat ``limit`` on ``shape``: a baseline
        at ``limit`` is needed, and when half the threads already measured
        slower by ``probe_gain`` than ``limit`` runs now, another try would
        only repeat it (each costs ``probe_steps`` slow steps, ~3% of a
        128-token stream). Once ``limit``'s recent steps slow down to that
        level, exploring is worth it again."""
        current = self._median(limit, shape)
        if current is None:
            return False
        fewer = self._median(limit // 2, shape)
        return fewer is None or current >= fewer * self.policy.probe_gain

    def _samples(self, threads: int, shape: _Shape) -> deque[float]:
        key = (threads, shape)
        found = self._history.get(key)
        if found is None:
            found = self._history[key] = deque(maxlen=self.policy.window)
        return found

    def _median(self, threads: int, shape: _Shape) -> float | None:
        found = self._history.get((threads, shape))
        if found is None or len(found) < self.policy.min_samples:
            return None
        return statistics.median(found)

    def _collapsed(self, seconds: float, median: float) -> bool:
        p = self.policy
        return seconds > median * p.collapse_factor and seconds - median > p.collapse_min_s

    def _on_collapse(self, collapse: _Collapse) -> None:
        threads, rows, kv_cells = collapse.threads, collapse.rows, collapse.kv_cells
        seconds, median, now = collapse.seconds, collapse.median, collapse.at
        self._collapses += 1
        self._last = collapse
        lowered = max(1, threads // 2)
        # A collapse at one thread (or below a ceiling the budget already
        # undercuts) says nothing about the ceiling: there is less to give back.
        if threads > 1 and lowered < self._ceiling:
            self._lower(lowered, now)
        log.warning(
            "threads.collapse",
            threads=threads,
            rows=rows,
            kv_cells=kv_cells,
            step_ms=round(seconds * 1e3, 2),
            median_ms=round(median * 1e3, 2),
            ceiling=self._ceiling,
            cooldown_s=self._cooldown,
        )

    def _lower(self, ceiling: int, now: float) -> None:
        self._ceiling = ceiling
        self._fallbacks += 1
        self._retry_at = now + self._cooldown
        self._settled_at = now

    def _up_count(self) -> int:
        """The thread count a probe up tries: twice the ceiling, within the budget."""
        return min(self._ceiling * 2, self._budget)

    def _probe_early_when_quiet(self, now: float) -> None:
        """Bring a probe up that a long cool-down still holds back, once the
        other work that caused the fallback has gone (``cpu_load``): the
        other processes leave the higher count its cores, and the base
        cool-down has passed since the ceiling fell or the last probe ended.
        A failed quiet probe doubles the cool-down as any other does."""
        retry = self._retry_at
        if self._gauge is None or retry is None or now >= retry or self._ceiling >= self._budget:
            return
        if now - self._settled_at < self.policy.cooldown_s:
            return
        others = self._gauge.sample(now)
        wanted = self._up_count()
        if others is None or not self._quiet_for(others, wanted):
            return
        self._retry_at = now
        self._quiet_probes += 1
        log.info(
            "threads.quiet",
            others=round(others, 2),
            threads=wanted,
            cooldown_s=self._cooldown,
            cut_s=round(retry - now, 3),
        )

    def _judge_probe(self, probe: _Probe, now: float) -> None:
        self._probe = None
        self._settled_at = now
        ratios = []
        collapsed = False
        for shape, seconds in probe.samples:
            base = self._median(probe.against, shape)
            if base is not None:
                ratios.append(seconds / base)
            own = self._median(probe.threads, shape)
            collapsed = collapsed or (own is not None and self._collapsed(seconds, own))
        gain = self.policy.probe_gain
        if ratios:
            ratio = statistics.median(ratios)
            # Up: faster by the gain, or (module doc) no slower by the same
            # margin while not collapsing against the higher count's own median.
            kept = ratio <= gain or (probe.up and not collapsed and ratio <= 1 / gain)
        else:  # nothing to compare with: going up is fine unless it collapsed
            kept = probe.up and not collapsed
        # A kept probe's steps are the new baseline of its count (the old one
        # may have been learnt on a quieter or busier machine); a dropped
        # probe's steps still measured its count, as it runs now.
        for shape in {b for b, _ in probe.samples}:
            samples = self._samples(probe.threads, shape)
            if kept:
                samples.clear()
            samples.extend(s for b, s in probe.samples if b == shape)
        if probe.up:
            if kept:
                self._probes_kept += 1
                self._ceiling = probe.threads
                self._cooldown = self.policy.cooldown_s
                more = self._ceiling < self.policy.max_threads
                self._retry_at = now + self._cooldown if more else None
            else:
                self._cooldown = min(self._cooldown * 2, self.policy.cooldown_max_s)
                self._retry_at = now + self._cooldown
        elif kept:
            self._explorations_kept += 1
            self._lower(probe.threads, now)
            self._explore_at = now + self.policy.explore_s
            self._explore_every = self.policy.explore_s
        else:
            self._explore_at = now + self._explore_every
            self._explore_every = min(self._explore_every * 2, self.policy.explore_max_s)
        log.info(
            "threads.probed",
            threads=probe.threads,
            against=probe.against,
            kept=kept,
            ratio=round(statistics.median(ratios), 3) if ratios else None,
            cooldown_s=self._cooldown,
        )

    def _shown(self) -> tuple[float, ...]:
        """Every value :meth:`_build_snapshot` reads that may change."""
        return (
            self._threads,
            self._busy,
            self._budget,
            self._ceiling,
            self._fallbacks,
            self._collapses,
            self._probes,
            self._probes_kept,
            self._explorations,
            self._explorations_kept,
            self._quiet_probes,
            self._cooldown,
            self._beside_own_work,
            self._halved_beside_own_work,
            self._bursts,
        )

    def _build_snapshot(self) -> ThreadStatus:
        p = self.policy
        return ThreadStatus(
            threads=self._threads,
            max_threads=p.max_threads,
            cores=p.cores,
            busy_workers=self._busy,
            budget=self._budget,
            ceiling=self._ceiling,
            fallback=self._ceiling < p.max_threads,
            fallbacks=self._fallbacks,
            collapses=self._collapses,
            probes=self._probes,
            probes_kept=self._probes_kept,
            explorations=self._explorations,
            explorations_kept=self._explorations_kept,
            quiet_probes=self._quiet_probes,
            beside_own_work=self._beside_own_work,
            halved_beside_own_work=self._halved_beside_own_work,
            bursts=self._bursts,
            cooldown_s=self._cooldown,
            next_probe_s=None,
            last_collapse=None,
        )
