"""A stand-in for the daemon's front, for client tests that need no daemon.

A real tree (supervisor, cache-meta, model workers: ``WorkerTree``) and a
small front actor, in a thread of the test process, answering ``route``
(and ``status``) as the contract in ``llamad.front_wire`` says. The tests
that must go through the real daemon use ``daemon_proc.py`` instead.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from llamad.actors import Actor, OpKind, OpSpec, Request
from llamad.errors import ModelNotFound
from llamad.front_wire import (
    FRONT_ACTOR,
    DaemonStatus,
    ModelInfo,
    ModelRef,
    ModelState,
    ModelStatus,
    NoArgs,
    Route,
)
from llamad.model.status_board import read_status, status_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "model"))

from worker_tree import WorkerTree

__all__ = ["StandInFront"]


class StandInFront:
    """``WorkerTree`` plus a front actor serving ``route`` and ``status``."""

    def __init__(self, endpoint: str, **tree: Any) -> None:
        self.tree = WorkerTree(**tree)
        self.endpoint = endpoint
        self.routes = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True, name="standin-front")
        self._actor: Actor | None = None
        self._error: BaseException | None = None

    def start(self) -> StandInFront:
        self.tree.start()
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"stand-in front did not start: {self._error!r}")
        return self

    def close(self) -> None:
        if self._actor is not None:
            self._actor.request_stop()
        self._thread.join(10)
        self.tree.close()

    def _serve(self) -> None:
        try:
            actor = Actor(FRONT_ACTOR, endpoint=self.endpoint, registry=self.tree.registry)
            actor.add_op(OpSpec("route", OpKind.CALL, body=ModelRef), self._route)
            actor.add_op(OpSpec("status", OpKind.CALL, body=NoArgs), self._status)
            actor.start()
            self._actor = actor
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            raise
        self._ready.set()
        try:
            while not actor.stop_requested:
                actor.poll(0.1)
        finally:
            actor.close()

    def _info(self, model_id: str) -> ModelInfo:
        spec = self.tree.specs.get(model_id)
        if spec is None:
            raise ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})
        return ModelInfo(
            model_id=model_id,
            path=spec.model_path,
            state=ModelState.READY,
            n_ctx=spec.context.n_ctx,
            n_seq_max=spec.context.n_seq_max,
        )

    def _route(self, req: Request[ModelRef]) -> Route:
        model_id = req.body.model_id
        spec = self.tree.specs.get(model_id)
        if spec is None:
            raise ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})
        self.routes += 1
        entry = self.tree.registry.lookup(spec.actor_name)
        return Route(
            model_id=model_id,
            actor=spec.actor_name,
            registry_root=str(self.tree.registry.root),
            instance=entry.instance if entry is not None else "",
        )

    def _status(self, req: Request[NoArgs]) -> DaemonStatus:
        models = []
        for model_id, spec in self.tree.specs.items():
            board = read_status(status_path(self.tree.registry.root, spec.actor_name))
            models.append(ModelStatus(info=self._info(model_id), worker=board))
        return DaemonStatus(pid=os.getpid(), uptime_s=time.monotonic(), models=models)
