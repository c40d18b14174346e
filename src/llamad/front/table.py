"""The front's table of models: what each is, where it stands, and the decisions about it.

A plain object (no sockets, no threads, an injected clock), stepped by unit
tests. The process layer (:mod:`llamad.front.front_proc`) feeds it the outcomes of
the loads and unloads it ran and the decisions ``model_sup`` published
(:mod:`llamad.supervisor.events`), and carries out what it answers.

States (:class:`~llamad.front.wire.ModelState`)::

    (none), UNLOADED ─load─► LOADING ─ready─► READY ─unload, keep_alive─► UNLOADING ─► UNLOADED
                               │                │
                     start failed               crash: model_sup restarts it ─► LOADING ─► READY
                               ▼                │ more than MODEL_RESTARTS in MODEL_PERIOD_S
                            FAILED ◄────────────┘ (the front stops the worker)
                               └─load_model─► LOADING

Restarts are ``model_sup``'s (the worker is ``permanent``); giving up is the
front's, per model: ``model_sup`` keeps one restart window for all its
workers, so without a per-model limit one model crashing on every load would
exhaust it and take every other model down with the escalation.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

from llamad.front.wire import ModelInfo, ModelState
from llamad.supervisor.events import (
    ChildExited,
    ChildHung,
    ChildRestarted,
    ChildRestartFailed,
    SupervisorEvent,
)
from llamad.supervisor.exits import ExitReason

__all__ = [
    "MODEL_PERIOD_S",
    "MODEL_RESTARTS",
    "GiveUp",
    "ModelEntry",
    "ModelTable",
    "child_id_of",
    "exit_text",
    "model_id_of",
]

MODEL_RESTARTS: Final = 3
"""Restarts of one model's worker allowed within :data:`MODEL_PERIOD_S`; one more
and the front gives up on it (a worker restart is a model load: seconds)."""
MODEL_PERIOD_S: Final = 60.0

_CHILD_PREFIX: Final = "model."


def child_id_of(model_id: str) -> str:
    """The worker's child id under ``model_sup``: its actor name, ``model.<id>``."""
    return _CHILD_PREFIX + model_id


def model_id_of(child_id: str) -> str | None:
    return child_id[len(_CHILD_PREFIX) :] if child_id.startswith(_CHILD_PREFIX) else None


@dataclass(eq=False)
class ModelEntry:
    """One model: its worker's spec (wire form) and where it stands.

    ``configured``: listed in the config, so ``route`` (re)loads it and
    ``unload`` keeps it; a model loaded at run time is forgotten by
    ``unload`` (but kept, unloaded, by ``keep_alive``). ``attempts``: wall
    times of the restarts counted against :data:`MODEL_RESTARTS`.
    ``active_at``: monotonic time of the last activity the front saw
    (ready, a route); the worker's board adds its own requests.
    """

    model_id: str
    spec: dict[str, Any]
    path: str
    n_ctx: int
    n_seq_max: int
    keep_alive_s: float | None
    configured: bool
    state: ModelState = ModelState.UNLOADED
    pid: int | None = None
    instance: str | None = None
    loaded_at: float | None = None
    restarts: int = 0
    last_exit: str | None = None
    error: str | None = None
    active_at: float = 0.0
    attempts: deque[float] = field(default_factory=deque)

    @property
    def child_id(self) -> str:
        return child_id_of(self.model_id)

    def info(self) -> ModelInfo:
        return ModelInfo(
            model_id=self.model_id,
            path=self.path,
            state=self.state,
            n_ctx=self.n_ctx,
            n_seq_max=self.n_seq_max,
            keep_alive_s=self.keep_alive_s,
            loaded_at=self.loaded_at,
            restarts=self.restarts,
            last_exit=self.last_exit,
            error=self.error,
            pid=self.pid,
            deterministic=self.spec.get("deterministic") is True,
        )


@dataclass(frozen=True)
class GiveUp:
    """Stop ``model_id``'s worker for good: it crashed too often (``why``)."""

    model_id: str
    why: str


def exit_text(exit: str | None, cause: str | None) -> str | None:
    """A child's last exit for people: ``signal SIGKILL (hung)`` when its
    supervisor killed it for a reason."""
    if exit is None:
        return cause
    return exit if cause is None else f"{exit} ({cause})"


class ModelTable:
    """Every model the front knows, and the rules that move them between states."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        restarts: int = MODEL_RESTARTS,
        period_s: float = MODEL_PERIOD_S,
    ) -> None:
        self.clock = clock
        self.wall = wall
        self.max_restarts = restarts
        self.period_s = period_s
        self.entries: dict[str, ModelEntry] = {}

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(self.entries.values())

    def get(self, model_id: str) -> ModelEntry | None:
        return self.entries.get(model_id)

    def by_child(self, child_id: str) -> ModelEntry | None:
        model_id = model_id_of(child_id)
        return None if model_id is None else self.entries.get(model_id)

    def put(self, entry: ModelEntry) -> ModelEntry:
        self.entries[entry.model_id] = entry
        return entry

    def forget(self, model_id: str) -> None:
        self.entries.pop(model_id, None)

    # -- outcomes of the front's own loads and unloads -----------------------------------

    def loading(self, entry: ModelEntry) -> None:
        entry.state = ModelState.LOADING
        entry.error = None
        entry.pid = None

    def loaded(self, entry: ModelEntry, pid: int) -> None:
        """The worker started (``start_child`` returned): a fresh load, fresh counts."""
        entry.state = ModelState.READY
        entry.pid = pid
        entry.loaded_at = self.wall()
        entry.active_at = self.clock()
        entry.restarts = 0
        entry.attempts.clear()
        entry.error = None

    def load_failed(self, entry: ModelEntry, error: str, exit: str | None) -> None:
        entry.state = ModelState.FAILED
        entry.pid = None
        entry.error = error
        if exit is not None:
            entry.last_exit = exit

    def unloading(self, entry: ModelEntry) -> None:
        entry.state = ModelState.UNLOADING

    def unloaded(self, entry: ModelEntry) -> None:
        entry.state = ModelState.UNLOADED
        entry.pid = None
        entry.instance = None

    # -- model_sup's decisions ----------------------------------------------------------

    def on_event(self, event: SupervisorEvent) -> GiveUp | None:
        """Apply one of ``model_sup``'s events; a :class:`GiveUp` when the worker
        crashed (or failed to restart) more than the per-model intensity allows."""
        child = getattr(event, "child", None)
        entry = None if not isinstance(child, str) else self.by_child(child)
        if entry is None:
            return None
        if isinstance(event, ChildExited):
            entry.last_exit = exit_text(event.exit, event.cause)
            if event.reason is ExitReason.SHUTDOWN and entry.state is ModelState.UNLOADING:
                return None
            entry.pid = None
            entry.instance = None
            return self._restart_attempt(entry, event.at, f"its worker exited ({event.exit})")
        if isinstance(event, ChildRestartFailed):
            entry.last_exit = exit_text(event.exit, event.reason) or entry.last_exit
            return self._restart_attempt(
                entry, event.at, f"its worker failed to restart ({event.exit or event.reason})"
            )
        if isinstance(event, ChildRestarted):
            entry.restarts = max(entry.restarts, event.restarts)
            if entry.state is ModelState.LOADING:
                entry.state = ModelState.READY
                entry.pid = event.pid
                entry.instance = None  # read from its board
                entry.active_at = self.clock()
            return None
        if isinstance(event, ChildHung):
            entry.last_exit = "hung"
        return None

    def _restart_attempt(self, entry: ModelEntry, at: float, what: str) -> GiveUp | None:
        if entry.state is ModelState.FAILED:
            return None  # given up already; the front's stop is on its way
        attempts = entry.attempts
        while attempts and at - attempts[0] > self.period_s:
            attempts.popleft()
        attempts.append(at)
        if len(attempts) <= self.max_restarts:
            entry.state = ModelState.LOADING
            return None
        why = (
            f"{what}: {len(attempts)} restarts within {self.period_s:g}s "
            f"(at most {self.max_restarts} allowed)"
        )
        entry.state = ModelState.FAILED
        entry.error = why
        entry.pid = None
        return GiveUp(entry.model_id, why)

    # -- keep_alive --------------------------------------------------------------------

    def idle_for(self, entry: ModelEntry, board_pending: int, board_last: float | None) -> float:
        """How long ``entry`` has been idle: nothing in flight on its worker
        (``board_pending``) and no request (its board's ``board_last``) nor
        route since then; 0 while something is in flight."""
        if board_pending > 0:
            return 0.0
        last = max(entry.active_at, board_last or 0.0)
        return max(0.0, self.clock() - last)

    def expired(self, entry: ModelEntry, board_pending: int, board_last: float | None) -> bool:
        """``entry`` is ready, has a ``keep_alive`` and has been idle that long."""
        keep = entry.keep_alive_s
        return (
            entry.state is ModelState.READY
            and keep is not None
            and self.idle_for(entry, board_pending, board_last) >= keep
        )
