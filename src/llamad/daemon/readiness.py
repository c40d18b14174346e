"""What the daemon's root tells systemd, and when (``docs/internals/operations.md``).

Only the root process sends (the unit's ``NotifyAccess=main``), from two places:

- **The reporter** (:class:`SystemdReporter`, a thread of the root) follows
  the root supervisor's events and reads the front's table file and the
  workers' status boards (files in the runtime directory: no socket, no
  call that could wait on a busy process). Its decisions are a plain object,
  :class:`Reports`:

  * while the tree starts, ``STATUS=Starting ...`` per child;
  * once the root's children are up (``cache_sup`` reports ready only after
    cache-meta serves), ``STATUS=Loading ...`` with each configured model's
    load progress, and ``EXTEND_TIMEOUT_USEC`` every few seconds while one
    loads (each load is bounded by its own ``load_timeout_s``, so this never
    extends a start forever);
  * ``READY=1`` once every configured model has loaded or failed (a failure
    is logged and named in ``STATUS``);
  * while serving, ``STATUS=`` with the models and the active requests;
  * ``STOPPING=1`` as soon as the root starts stopping its tree.

- **The watchdog** (:class:`Watchdog`) is the root supervisor's own beat
  (:class:`~llamad.supervisor.supervisor_proc.OwnBeat`), so it runs only while the
  root's loop turns (or waits, bounded, on a child's start or stop). It
  sends ``WATCHDOG=1`` every half of ``$WATCHDOG_USEC``, and only while every
  child of the root is on time with its heartbeat (:func:`late_children`).
  Each of those children is a process whose beat proves that its own loop,
  and so its own liveness checks, run: ``cache_sup`` and ``model_sup`` kill
  their hung children themselves, so a fresh tree of beats from the root's
  children down means every level is watched.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Final

import structlog

from llamad.actors import Registry
from llamad.daemon.notify import Notifier, status_line
from llamad.front.persist import load_table, table_path
from llamad.front.wire import ModelState
from llamad.model.status_board import (
    load_progress_path,
    read_load_progress,
    read_status,
    status_path,
)
from llamad.supervisor.events import (
    ChildExited,
    ChildRestarted,
    ChildStarted,
    ChildStopped,
    EventFeed,
    SupervisorEvent,
    SupShuttingDown,
    SupStarted,
    SupStopped,
)
from llamad.supervisor.supervisor_proc import ChildBeat, Supervisor

__all__ = [
    "LATE_FRACTION",
    "ModelView",
    "Phase",
    "Readiness",
    "Reports",
    "SystemdReporter",
    "Watchdog",
    "late_children",
    "readiness",
]

log = structlog.get_logger("llamad.daemon")

LATE_FRACTION: Final = 0.5
"""A child is late once silent for this share of its liveness window: two of
the four beats a window holds went missing. The root itself kills it at the
whole window; the watchdog stops first, so systemd hears of a tree that is
not well even when the root's remedy then works (``WatchdogSec`` leaves it the
time to: see the unit)."""

LOADING_POLL_S: Final = 0.25
SERVING_POLL_S: Final = 2.0
EXTEND_EVERY_S: Final = 5.0
EXTEND_BY_S: Final = 15.0
"""Three reports' worth: one late report never lets the start time out."""

Notice = tuple[str, ...]
"""One datagram: ``KEY=VALUE`` assignments."""


# -- the rules (pure) ------------------------------------------------------------------


@dataclass(frozen=True)
class ModelView:
    """One model as the reporter sees it: the front's table row, its load
    progress while it loads, its active requests while it serves."""

    model_id: str
    state: ModelState
    loaded_at: float | None = None
    error: str | None = None
    progress: float | None = None
    active: int = 0


def _settled(view: ModelView | None) -> bool:
    if view is None:
        return False
    if view.state in (ModelState.READY, ModelState.FAILED):
        return True
    # keep_alive unloads a model after it has loaded; never a first load.
    return view.state is ModelState.UNLOADED and view.loaded_at is not None


@dataclass(frozen=True)
class Readiness:
    """Where the configured models stand: ``waiting`` (not loaded nor failed
    yet, the front's table not written yet included) and ``failed``."""

    waiting: tuple[str, ...]
    failed: tuple[str, ...]

    @property
    def ready(self) -> bool:
        return not self.waiting


def readiness(configured: Iterable[str], views: Mapping[str, ModelView]) -> Readiness:
    waiting, failed = [], []
    for model_id in configured:
        view = views.get(model_id)
        if not _settled(view):
            waiting.append(model_id)
        elif view is not None and view.state is ModelState.FAILED:
            failed.append(model_id)
    return Readiness(tuple(waiting), tuple(failed))


def _percent(view: ModelView | None) -> str:
    if view is None or view.progress is None:
        return ""
    return f" {round(view.progress * 100)}%"


def loading_status(configured: Sequence[str], views: Mapping[str, ModelView]) -> str:
    r = readiness(configured, views)
    loading = ", ".join(m + _percent(views.get(m)) for m in r.waiting)
    done = len(configured) - len(r.waiting)
    return f"Loading {loading} ({done} of {len(configured)} configured models done)"


def serving_status(views: Mapping[str, ModelView], restarting: Iterable[str] = ()) -> str:
    ready = sorted(m for m, v in views.items() if v.state is ModelState.READY)
    active = sum(v.active for v in views.values() if v.state is ModelState.READY)
    parts = [
        f"Serving {len(ready)} model{'s' if len(ready) != 1 else ''}"
        + (f" ({', '.join(ready)})" if ready else "")
        + f", {active} active request{'s' if active != 1 else ''}"
    ]
    for state in (ModelState.LOADING, ModelState.FAILED, ModelState.UNLOADED):
        names = sorted(m for m, v in views.items() if v.state is state)
        if names:
            parts.append(f"{state.value}: {', '.join(names)}")
    if restarting:
        parts.append(f"restarting: {', '.join(sorted(restarting))}")
    return "; ".join(parts)


def late_children(beats: Iterable[ChildBeat]) -> list[str]:
    """The children whose heartbeat is late (:data:`LATE_FRACTION` of their
    window), or that were killed and are not reaped yet (a kill that did not
    work: a process stuck in the kernel)."""
    late = []
    for b in beats:
        if b.killed_for is not None or (
            b.liveness_timeout is not None and b.silent_s > b.liveness_timeout * LATE_FRACTION
        ):
            late.append(b.child_id)
    return late


class Phase(StrEnum):
    STARTING = "starting"
    """The root's children start (cache_sup, model_sup, front)."""
    LOADING = "loading"
    """They are up; the configured models load. ``READY=1`` ends it."""
    SERVING = "serving"
    STOPPING = "stopping"


@dataclass
class Reports:
    """The reporter's decisions, stepped by the root's events and the models'
    views; each step returns the datagrams to send."""

    configured: tuple[str, ...]
    phase: Phase = Phase.STARTING
    started: list[str] = field(default_factory=list)
    restarting: set[str] = field(default_factory=set)
    _last_status: str | None = None
    _next_extend: float = 0.0

    def on_event(self, event: SupervisorEvent) -> list[Notice]:
        if isinstance(event, SupShuttingDown) and self.phase is not Phase.STOPPING:
            self.phase = Phase.STOPPING
            return [("STOPPING=1", self._status(f"Stopping ({event.reason}): the front first"))]
        if self.phase is Phase.STOPPING:
            if isinstance(event, ChildStopped):
                return self._changed(f"Stopping: {event.child} stopped")
            if isinstance(event, SupStopped):
                return self._changed(f"Stopped (exit {event.exit_code})")
            return []
        if isinstance(event, ChildStarted) and self.phase is Phase.STARTING:
            self.started.append(event.child)
            return self._changed(f"Starting: {', '.join(self.started)} up")
        if isinstance(event, SupStarted) and self.phase is Phase.STARTING:
            self.phase = Phase.LOADING
            return self._changed("Loading the configured models")
        if isinstance(event, ChildExited):
            self.restarting.add(event.child)
        elif isinstance(event, ChildRestarted):
            self.restarting.discard(event.child)
        return []

    def on_models(self, views: Mapping[str, ModelView], now: float) -> list[Notice]:
        if self.phase is Phase.LOADING:
            r = readiness(self.configured, views)
            if r.ready:
                self.phase = Phase.SERVING
                for model_id in r.failed:
                    log.error("daemon.model_failed", model=model_id, error=views[model_id].error)
                log.info("daemon.ready", models=list(self.configured), failed=list(r.failed))
                return [("READY=1", self._status(serving_status(views, self.restarting)))]
            out = self._changed(loading_status(self.configured, views))
            if now >= self._next_extend:
                self._next_extend = now + EXTEND_EVERY_S
                out.append((f"EXTEND_TIMEOUT_USEC={round(EXTEND_BY_S * 1_000_000)}",))
            return out
        if self.phase is Phase.SERVING:
            return self._changed(serving_status(views, self.restarting))
        return []

    def poll_every(self) -> float | None:
        """How soon :meth:`on_models` wants fresh views (``None``: it does not)."""
        if self.phase is Phase.LOADING:
            return LOADING_POLL_S
        if self.phase is Phase.SERVING:
            return SERVING_POLL_S
        return None

    def _status(self, text: str) -> str:
        self._last_status = text
        return status_line(text)

    def _changed(self, text: str) -> list[Notice]:
        return [] if text == self._last_status else [(self._status(text),)]


# -- the watchdog: the root supervisor's own beat -----------------------------------------


class Watchdog:
    """``WATCHDOG=1`` every ``period_s`` (half of ``$WATCHDOG_USEC``), sent from
    the root supervisor's loop and only while no child of it is late."""

    def __init__(
        self,
        notifier: Notifier,
        period_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.notifier = notifier
        self.period_s = period_s
        self._clock = clock
        self._due = clock()
        self._withheld: list[str] = []

    def interval(self) -> float:
        # Capped at a quarter period: the supervisor's waits on a start or a
        # stop read this once, and must call again soon enough that a ping is
        # never more than 1.25 periods late (systemd acts after two).
        left = self._due - self._clock()
        return min(self.period_s / 4, max(self.period_s / 20, left))

    def beat(self, sup: Supervisor) -> None:
        now = self._clock()
        if now < self._due:
            return
        late = late_children(sup.child_beats())
        if late:
            if late != self._withheld:
                log.warning("daemon.watchdog_withheld", late=late)
            self._withheld = late
            return
        if self._withheld:
            log.info("daemon.watchdog_resumed", was_late=self._withheld)
            self._withheld = []
        if self.notifier.watchdog():
            self._due = now + self.period_s


# -- the reporter thread -----------------------------------------------------------------


class SystemdReporter:
    """Runs :class:`Reports` on a thread of the root: the root supervisor's
    events as they come, the models' views at the pace it asks for."""

    def __init__(
        self,
        notifier: Notifier,
        events: EventFeed,
        *,
        configured: Sequence[str],
        runtime_dir: Path,
        registry_root: Path,
    ) -> None:
        self.notifier = notifier
        self.events = events
        self.reports = Reports(tuple(configured))
        self.table_file = table_path(runtime_dir)
        self.registry = Registry(registry_root)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name="systemd-reporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        """Let the thread report the root's last events (it ends by itself
        after ``sup.stopped``), then end it."""
        with contextlib.suppress(RuntimeError):  # never started
            self._thread.join(timeout)
        self._stop.set()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout)

    def _run(self) -> None:
        seq = 0
        next_poll = 0.0
        while not self._stop.is_set() and not self._done:
            every = self.reports.poll_every()
            wait = 0.5 if every is None else max(0.0, next_poll - time.monotonic())
            for event in self.events.wait(seq, min(wait, 0.5)):
                seq = event.seq
                self._send(self.reports.on_event(event))
                self._done = self._done or isinstance(event, SupStopped)
            now = time.monotonic()
            every = self.reports.poll_every()
            if every is not None and now >= next_poll:
                next_poll = now + every
                try:
                    views = self.views()
                except Exception:  # a report must never take the root down
                    log.exception("daemon.report_failed")
                    continue
                self._send(self.reports.on_models(views, now))

    def _send(self, notices: list[Notice]) -> None:
        for notice in notices:
            self.notifier.send(*notice)

    def views(self) -> dict[str, ModelView]:
        """Every model the front's table names, with load progress and active requests."""
        views = {}
        for entry in load_table(self.table_file):
            progress, active = None, 0
            if entry.state is ModelState.LOADING:
                p = read_load_progress(load_progress_path(self.registry.root, entry.child_id))
                progress = None if p is None else p.fraction
            elif entry.state is ModelState.READY:
                found = self.registry.lookup(entry.child_id)
                board = read_status(status_path(self.registry.root, entry.child_id))
                if found is not None and board is not None and board.pid == found.pid:
                    active = board.status.pending_len
            views[entry.model_id] = ModelView(
                model_id=entry.model_id,
                state=entry.state,
                loaded_at=entry.loaded_at,
                error=entry.error,
                progress=progress,
                active=active,
            )
        return views
