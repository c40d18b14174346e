"""The front's model operations: loads, unloads, routes waiting on them, progress, keep_alive.

:class:`Models` runs on the front's loop thread. It owns the
:class:`~llamad.front.table.ModelTable` and every handle waiting on a model
(deferred ``route`` replies, ``load_model`` streams, ``unload`` replies), and
sends the blocking part of each operation to the ``model_sup`` lane
(:mod:`llamad.front.lanes`): ``start_child`` returns once the worker has
loaded its model and reports ready, ``terminate_child`` once its shutdown
saves are done. Operations on one model run one at a time, in arrival order
(a load behind an unload waits for it); the lane runs them in order anyway,
because ``model_sup`` does one thing at a time.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog

from llamad.actors import PendingReply, Registry, StreamSender
from llamad.errors import LlamadError, ModelNotFound, WorkerCrashed
from llamad.front.lanes import Lane, Outcome
from llamad.front.persist import save_table
from llamad.front.table import GiveUp, ModelEntry, ModelTable, child_id_of
from llamad.front.wire import LoadProgress, ModelFailed, ModelState, Route
from llamad.llama_ffi.errors import ModelLoadError
from llamad.model.status_board import (
    WorkerSnapshot,
    load_progress_path,
    read_load_progress,
    read_status,
    status_path,
)
from llamad.supervisor.core import ChildInfo, StartedChild
from llamad.supervisor.errors import ChildAlreadyStarted, ChildNotFound, StartFailed
from llamad.supervisor.events import SupervisorEvent
from llamad.supervisor.service import SupervisorClient

__all__ = ["Load", "Models", "Unload"]

log = structlog.get_logger("llamad.front")

SupLane = Lane[SupervisorClient]

KEEP_ALIVE_CHECK_S: Final = 0.5
PROGRESS_CHECK_S: Final = 0.05


@dataclass(eq=False)
class Load:
    """Start ``model_id``'s worker with ``spec`` (stopping a running one first:
    a reload with other options is a hot swap); ``streams`` are ``load_model``
    callers waiting for it."""

    spec: dict[str, Any]
    fields: dict[str, Any]
    streams: list[StreamSender] = field(default_factory=list)
    progress: float = -1.0


@dataclass(eq=False)
class Unload:
    """Stop ``model_id``'s worker; ``forget`` a model not in the config."""

    reason: str
    forget: bool
    replies: list[PendingReply] = field(default_factory=list)


Op = Load | Unload


def _start(sup: SupervisorClient, child_id: str, spec: dict[str, Any]) -> StartedChild:
    # Stop whatever runs under that id first: a hot swap, a model given up
    # whose stop is queued, a worker a previous front had started.
    with contextlib.suppress(ChildNotFound):
        sup.terminate_child(child_id)
    try:
        return sup.start_child([spec], child_id=child_id)
    except ChildAlreadyStarted:
        sup.terminate_child(child_id)
        return sup.start_child([spec], child_id=child_id)


def _stop(sup: SupervisorClient, child_id: str) -> None:
    with contextlib.suppress(ChildNotFound):
        sup.terminate_child(child_id)


class Models:
    """Every model operation of the front (see the module doc)."""

    def __init__(
        self,
        table: ModelTable,
        lane: SupLane,
        registry: Registry,
        table_file: Path,
        server_key: str | None = None,
    ) -> None:
        self.table = table
        self.lane = lane
        self.registry = registry
        self.table_file = table_file
        self.server_key = server_key
        self.routes: dict[str, list[PendingReply]] = {}
        self.queued: dict[str, deque[Op]] = {}
        self.running: dict[str, Op] = {}
        self._last_keep_alive = 0.0

    # -- reading ------------------------------------------------------------------------

    def board(self, entry: ModelEntry) -> WorkerSnapshot | None:
        """The worker's status board while it runs (never asks the worker)."""
        if entry.pid is None:
            return None
        snapshot = read_status(status_path(self.registry.root, entry.child_id))
        return snapshot if snapshot is not None and snapshot.pid == entry.pid else None

    def _route(self, entry: ModelEntry) -> Route | None:
        found = self.registry.lookup(entry.child_id)
        if found is None or entry.pid is None or found.pid != entry.pid:
            return None
        entry.instance = found.instance
        tcp_port = None
        if found.tcp_endpoint:
            tcp_port = int(found.tcp_endpoint.rpartition(":")[2])
        return Route(
            model_id=entry.model_id,
            actor=entry.child_id,
            registry_root=str(self.registry.root),
            instance=found.instance,
            tcp_port=tcp_port,
            server_key=self.server_key if tcp_port is not None else None,
        )

    def save(self) -> None:
        save_table(self.table_file, self.table)

    # -- ops ----------------------------------------------------------------------------

    def route(self, model_id: str, pending: Callable[[], PendingReply]) -> Route | None:
        """The route now, or ``None`` with the caller's reply deferred until the
        model is ready (loading it when it is unloaded)."""
        entry = self.table.get(model_id)
        if entry is None:
            raise ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})
        entry.active_at = self.table.clock()
        if entry.state is ModelState.FAILED:
            raise self._failed(entry)
        if entry.state is ModelState.READY and model_id not in self.running:
            route = self._route(entry)
            if route is not None:
                return route
        self.routes.setdefault(model_id, []).append(pending())
        if entry.state is ModelState.UNLOADED and not self._busy(model_id):
            self.enqueue(entry, Load(entry.spec, {}))
        return None

    def enqueue(self, entry: ModelEntry, op: Op) -> None:
        self.queued.setdefault(entry.model_id, deque()).append(op)
        self._next(entry.model_id)

    def _busy(self, model_id: str) -> bool:
        return model_id in self.running or bool(self.queued.get(model_id))

    def _failed(self, entry: ModelEntry) -> ModelFailed:
        return ModelFailed(
            f"model {entry.model_id!r} failed: {entry.error}",
            details={
                "model_id": entry.model_id,
                "error": entry.error,
                "last_exit": entry.last_exit,
            },
        )

    # -- running operations, one model at a time -----------------------------------------

    def _next(self, model_id: str) -> None:
        if model_id in self.running:
            return
        queue = self.queued.get(model_id)
        if not queue:
            self.queued.pop(model_id, None)
            self._settle(model_id)
            return
        op = queue.popleft()
        entry = self.table.get(model_id)
        if entry is None:
            self._refuse(
                op, ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})
            )
            self._next(model_id)
            return
        self.running[model_id] = op
        if isinstance(op, Load):
            self._begin_load(entry, op)
        else:
            self._begin_unload(entry, op)

    def _finish(self, model_id: str) -> None:
        self.running.pop(model_id, None)
        self.save()
        self._next(model_id)

    def _begin_load(self, entry: ModelEntry, op: Load) -> None:
        if entry.state is ModelState.READY and entry.spec == op.spec:
            for sender in op.streams:
                sender.end(entry.info())
            self._finish(entry.model_id)
            return
        for name, value in op.fields.items():
            setattr(entry, name, value)
        entry.spec = op.spec
        self.table.loading(entry)
        self.save()
        with contextlib.suppress(FileNotFoundError):
            load_progress_path(self.registry.root, entry.child_id).unlink()
        log.info("front.model_loading", model=entry.model_id, path=entry.path)
        child_id, spec = entry.child_id, op.spec
        self.lane.submit(
            lambda sup: _start(sup, child_id, spec), lambda o: self._loaded(entry, op, o)
        )

    def _loaded(self, entry: ModelEntry, op: Load, outcome: Outcome[StartedChild]) -> None:
        if outcome.error is None:
            started = outcome.get()
            self.table.loaded(entry, started.pid)
            self._route(entry)
            log.info("front.model_ready", model=entry.model_id, pid=started.pid)
            if op.progress < 1.0:
                for sender in op.streams:
                    sender.emit(LoadProgress(1.0))
            for sender in op.streams:
                sender.end(entry.info())
        else:
            err = outcome.error
            exit_text = None
            if isinstance(err, StartFailed):
                exit_text = err.details.get("exit") or err.details.get("reason")
            self.table.load_failed(entry, f"its load failed: {_why(err)}", exit_text)
            log.warning("front.model_load_failed", model=entry.model_id, error=_why(err))
            refusal = ModelLoadError(
                f"model {entry.model_id!r} failed to load: {_why(err)}",
                details={"model_id": entry.model_id, "exit": exit_text, "error": _why(err)},
            )
            for sender in op.streams:
                sender.fail(refusal)
        self._finish(entry.model_id)

    def _begin_unload(self, entry: ModelEntry, op: Unload) -> None:
        if entry.state in (ModelState.UNLOADED, ModelState.FAILED) and entry.pid is None:
            self._unloaded(entry, op, Outcome(None))
            return
        self.table.unloading(entry)
        self.save()
        log.info("front.model_unloading", model=entry.model_id, reason=op.reason)
        child_id = entry.child_id
        self.lane.submit(lambda sup: _stop(sup, child_id), lambda o: self._unloaded(entry, op, o))

    def _unloaded(self, entry: ModelEntry, op: Unload, outcome: Outcome[None]) -> None:
        if outcome.error is not None:
            log.warning(
                "front.model_unload_failed", model=entry.model_id, error=_why(outcome.error)
            )
            for reply in op.replies:
                reply.fail(outcome.error)
        else:
            if entry.state is not ModelState.FAILED:
                self.table.unloaded(entry)
            if op.forget and not entry.configured:
                self.table.forget(entry.model_id)
            log.info("front.model_unloaded", model=entry.model_id, reason=op.reason)
            for reply in op.replies:
                reply.reply(None)
        self._finish(entry.model_id)

    def _refuse(self, op: Op, error: LlamadError) -> None:
        if isinstance(op, Load):
            for sender in op.streams:
                sender.fail(error)
        else:
            for reply in op.replies:
                reply.fail(error)

    def _settle(self, model_id: str) -> None:
        """Answer the routes waiting on ``model_id`` now that nothing runs for it."""
        waiting = self.routes.get(model_id)
        if not waiting:
            self.routes.pop(model_id, None)
            return
        entry = self.table.get(model_id)
        if entry is None:
            self._answer(model_id, ModelNotFound(f"no model {model_id!r}"))
        elif entry.state is ModelState.FAILED:
            self._answer(model_id, self._failed(entry))
        elif entry.state is ModelState.READY:
            route = self._route(entry)
            if route is not None:
                self._answer(model_id, route)
        elif entry.state is ModelState.UNLOADED:
            self.enqueue(entry, Load(entry.spec, {}))
        # LOADING with nothing running: model_sup is restarting it; its
        # child.restarted event settles the routes.

    def _answer(self, model_id: str, answer: Route | LlamadError) -> None:
        for pending in self.routes.pop(model_id, []):
            if isinstance(answer, LlamadError):
                pending.fail(answer)
            else:
                pending.reply(answer)

    # -- model_sup's events ---------------------------------------------------------------

    def on_event(self, event: SupervisorEvent) -> None:
        decision = self.table.on_event(event)
        child = getattr(event, "child", "")
        entry = self.table.by_child(child) if isinstance(child, str) else None
        if isinstance(decision, GiveUp):
            log.error("front.model_given_up", model=decision.model_id, why=decision.why)
            child_id = child
            self.lane.submit(lambda sup: _stop(sup, child_id), lambda o: self.save())
        if entry is not None:
            self.save()
            if entry.model_id not in self.running:
                self._settle(entry.model_id)

    def reconcile(self, children: list[ChildInfo]) -> None:
        """Match the table to ``model_sup``'s children (a front that started, or a
        ``model_sup`` that restarted): reload what should run and does not."""
        running = {c.id: c for c in children}
        for entry in list(self.table):
            if entry.model_id in self.running:
                continue
            info = running.pop(entry.child_id, None)
            if info is not None and info.pid is not None:
                entry.state = ModelState.READY
                entry.pid = info.pid
                entry.restarts = info.restarts
                if info.last_exit is not None:
                    entry.last_exit = info.last_exit.exit
                entry.active_at = self.table.clock()
                entry.loaded_at = entry.loaded_at or self.table.wall()
            elif info is not None:
                entry.state = ModelState.LOADING  # model_sup is restarting it
            elif entry.state in (ModelState.READY, ModelState.LOADING):
                entry.state = ModelState.UNLOADED
                entry.pid = None
                self.enqueue(entry, Load(entry.spec, {}))
            elif entry.state is ModelState.UNLOADING:
                self.table.unloaded(entry)
        for child_id in running:
            log.warning("front.unknown_worker", child=child_id)
        self.save()
        for model_id in list(self.routes):
            if model_id not in self.running:
                self._settle(model_id)

    # -- the loop's periodic work -----------------------------------------------------------

    def tick(self, now: float) -> float:
        """Progress and keep_alive; the longest the loop may sleep before the next."""
        wait = KEEP_ALIVE_CHECK_S
        for model_id, op in list(self.running.items()):
            if isinstance(op, Load) and op.streams:
                wait = PROGRESS_CHECK_S
                path = load_progress_path(self.registry.root, child_id_of(model_id))
                progress = read_load_progress(path)
                if progress is not None and progress.fraction > op.progress:
                    op.progress = progress.fraction
                    for sender in op.streams:
                        sender.emit(LoadProgress(round(progress.fraction, 4)))
        if now - self._last_keep_alive >= KEEP_ALIVE_CHECK_S:
            self._last_keep_alive = now
            self._keep_alive()
            # Routes wait for an event (a load's end, child.restarted); should
            # the worker be serving without one reaching us, look again.
            for model_id in list(self.routes):
                if model_id not in self.running:
                    self._settle(model_id)
        return wait

    def _keep_alive(self) -> None:
        for entry in list(self.table):
            if entry.keep_alive_s is None or entry.state is not ModelState.READY:
                continue
            if self._busy(entry.model_id) or self.routes.get(entry.model_id):
                continue
            board = self.board(entry)
            if board is None:
                continue
            pending = board.status.pending_len + (board.busy_since is not None)
            if self.table.expired(entry, pending, board.last_request_at):
                log.info(
                    "front.keep_alive_expired", model=entry.model_id, keep_alive=entry.keep_alive_s
                )
                self.enqueue(entry, Unload("keep_alive", forget=False))

    def close(self, why: LlamadError) -> None:
        """The front stops: whatever waits is told (the actor answers the rest)."""
        for model_id in list(self.routes):
            self._answer(model_id, why)
        for op in [*self.running.values(), *(o for q in self.queued.values() for o in q)]:
            self._refuse(op, why)
        self.running.clear()
        self.queued.clear()


def _why(err: BaseException) -> str:
    if isinstance(err, WorkerCrashed):
        return "model_sup stopped while it was starting the worker"
    if isinstance(err, LlamadError):
        return err.message
    return f"{type(err).__name__}: {err}"
