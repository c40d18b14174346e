"""The front process: the daemon's client-facing actor (control plane).

:func:`run_front` is the supervised entry point (the root's last child, see
:mod:`llamad.daemon.tree`). It binds ``config.endpoint`` as actor
``llamad.front`` (message limits from ``[security]``; a tcp endpoint with the
daemon's CURVE keys when they are set), rebuilds its table
(the file a previous front of this daemon left, ``model_sup``'s
``which_children``), reports ready, loads the configured models, and serves
:data:`llamad.front.wire.OPS` until SIGTERM:

.. code-block:: text

    while not stopped:
        actor.poll(up to the next progress/keep_alive check)   # ops; lane outcomes wake it
        mailbox.run()        # lane outcomes and model_sup's events, on this thread
        models.tick()        # load progress to load_model streams; keep_alive unloads
        heartbeat()

Nothing blocking runs on the loop: ``model_sup`` calls (loads, unloads) on
one lane, root and ``cache_sup`` inspection on another, cache-meta calls on a
third (:mod:`llamad.front.lanes`); ``model_sup``'s events arrive from a
watch thread (:mod:`llamad.front.watch`). Token streams never pass here: a
client routes once, then talks to the worker actor.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
import structlog

from llamad import logs
from llamad.actors import Actor, Handler, PendingReply, Registry, Request
from llamad.cache.client import CacheClient
from llamad.cache.counters import Counters
from llamad.config import LlamadConfig
from llamad.errors import ModelNotFound, Unavailable
from llamad.front.lanes import Lane, Mailbox, Outcome
from llamad.front.load_request import TemplateLimits, load_request
from llamad.front.metrics import daemon_metrics
from llamad.front.models import Load, Models, Unload
from llamad.front.persist import load_table, table_path
from llamad.front.status import Supervisors, daemon_status
from llamad.front.table import ModelEntry, ModelTable
from llamad.front.watch import SupervisorWatch
from llamad.front.wire import (
    EVICT_ALL,
    FRONT_ACTOR,
    OPS,
    DaemonStatus,
    EvictBytes,
    GcReport,
    LoadModel,
    MetricsSnapshot,
    ModelInfo,
    ModelRef,
    ModelState,
    NoArgs,
    Route,
    SetKeepAlive,
)
from llamad.model.worker_spec import WorkerSpec
from llamad.supervisor.child import heartbeat, heartbeat_interval, notifies_ready, notify_ready
from llamad.supervisor.core import ChildInfo
from llamad.supervisor.service import SupervisorClient

__all__ = ["Front", "run_front"]

log = structlog.get_logger("llamad.front")

_INSPECT_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class TreeServices:
    """The actor names of the supervisors the front asks (given by the tree
    that starts it: a child never imports its parent's tree)."""

    root: str
    cache_sup: str
    model_sup: str


@notifies_ready
def run_front(
    config: Mapping[str, Any],
    started_at: float,
    limits: Mapping[str, float],
    services: Mapping[str, str],
) -> None:
    """Supervised entry point: rebuild, bind, report ready, serve until SIGTERM."""
    logs.configure()
    front = Front(
        msgspec.convert(config, LlamadConfig),
        started_at=started_at,
        limits=TemplateLimits(**limits),
        services=TreeServices(**services),
    )
    front.serve(ready=notify_ready)


def _entry_of(
    model_id: str, spec: WorkerSpec, keep_alive_s: float | None, configured: bool
) -> ModelEntry:
    return ModelEntry(
        model_id=model_id,
        spec=spec.to_wire(),
        path=spec.model_path,
        n_ctx=spec.context.n_ctx,
        n_seq_max=spec.context.n_seq_max,
        keep_alive_s=keep_alive_s,
        configured=configured,
    )


class _Inspect:
    """The inspection lane's clients (made on its thread)."""

    def __init__(self, registry: Registry, services: TreeServices) -> None:
        self.root = SupervisorClient(services.root, registry=registry, timeout=_INSPECT_TIMEOUT_S)
        self.cache_sup = SupervisorClient(
            services.cache_sup, registry=registry, timeout=_INSPECT_TIMEOUT_S
        )

    def children(self) -> Supervisors:
        return Supervisors(root=_children(self.root), cache_sup=_children(self.cache_sup))

    def close(self) -> None:
        self.root.close()
        self.cache_sup.close()


def _which_children(sup: SupervisorClient) -> list[ChildInfo]:
    return sup.which_children()


def _children(sup: SupervisorClient) -> list[ChildInfo] | str:
    try:
        return sup.which_children()
    except Exception as exc:
        return f"no answer: {getattr(exc, 'message', exc)}"


class Front:
    """The front actor, its table and its lanes (see the module doc)."""

    def __init__(
        self,
        config: LlamadConfig,
        *,
        started_at: float,
        limits: TemplateLimits,
        services: TreeServices,
    ) -> None:
        self.config = config
        self.services = services
        self.started_at = started_at
        self.limits = limits
        self.registry = Registry(config.registry_root)
        self.curve = config.curve_server()
        self.actor = Actor(
            FRONT_ACTOR,
            endpoint=config.endpoint,
            registry=self.registry,
            limits=config.limits(),
            curve=self.curve,
        )
        handlers: dict[str, Handler] = {
            "route": self.route,
            "load_model": self.load_model,
            "unload": self.unload,
            "list_models": self.list_models,
            "model_info": self.model_info,
            "set_keep_alive": self.set_keep_alive,
            "status": self.status,
            "counters": self.counters,
            "metrics": self.metrics,
            "evict_bytes": self.evict_bytes,
            "gc": self.gc,
        }
        assert handlers.keys() == OPS.keys()
        for name, spec in OPS.items():
            self.actor.add_op(spec, handlers[name])
        self.table = ModelTable()
        self._counters: Counters | None = None

    # -- life ---------------------------------------------------------------------------

    def serve(self, ready: Any = None) -> None:
        self.actor.start()
        restore = self.actor.stop_on_signals()
        self.mailbox = Mailbox(self.actor.wake)
        self.sup_lane: Lane[SupervisorClient] = Lane(
            "model_sup",
            self.mailbox,
            lambda: SupervisorClient(self.services.model_sup, registry=self.registry),
            lambda c: c.close(),
        )
        self.inspect_lane: Lane[_Inspect] = Lane(
            "inspect",
            self.mailbox,
            lambda: _Inspect(self.registry, self.services),
            lambda i: i.close(),
        )
        self.cache_lane: Lane[CacheClient] = Lane(
            "cache",
            self.mailbox,
            lambda: CacheClient(registry=self.registry, timeout=120.0),
            lambda c: c.close(),
        )
        self.models = Models(
            self.table,
            self.sup_lane,
            self.registry,
            table_path(self.config.runtime_dir),
            server_key=None if self.curve is None else self.curve.public_key,
        )
        self.watch = SupervisorWatch(
            self.services.model_sup, self.registry, self.mailbox, self.models.on_event, self._resync
        )
        try:
            self._rebuild()
            self.watch.start()
            if ready is not None:
                ready()
            log.info("front.serving", endpoint=self.actor.endpoint, models=len(self.table.entries))
            beat = heartbeat_interval()
            while not self.actor.stop_requested:
                wait = self.models.tick(time.monotonic())
                if beat is not None:
                    wait = min(wait, beat)
                self.actor.poll(wait)
                self.mailbox.run()
                heartbeat()
        finally:
            restore()
            self.models.close(Unavailable("the daemon's front is stopping"))
            self.watch.stop(timeout=2.0)
            for lane in (self.sup_lane, self.inspect_lane, self.cache_lane):
                lane.close(timeout=1.0)
            if self._counters is not None:
                self._counters.close()
            self.actor.close()
            log.info("front.stopped")

    def _rebuild(self) -> None:
        """The table as a previous front left it (or the config's models), then
        matched to ``model_sup``'s children once it answers."""
        saved = load_table(table_path(self.config.runtime_dir))
        for entry in saved:
            self.table.put(entry)
        for model_id, model in self.config.models.items():
            if self.table.get(model_id) is None:
                spec = self.config.worker_spec(model_id)
                entry = self.table.put(_entry_of(model_id, spec, model.keep_alive, True))
                entry.state = ModelState.LOADING  # loaded once model_sup answers
        log.info("front.rebuilding", saved=len(saved), models=len(self.table.entries))
        self._resync()

    def _resync(self) -> None:
        self.sup_lane.submit(_which_children, self._reconcile)

    def _reconcile(self, outcome: Outcome[list[ChildInfo]]) -> None:
        if outcome.error is not None:
            log.warning("front.which_children_failed", error=str(outcome.error))
            self._resync()  # model_sup restarting: ask again
            return
        self.models.reconcile(outcome.get())

    # -- ops ----------------------------------------------------------------------------

    def route(self, req: Request[ModelRef]) -> Route | None:
        return self.models.route(req.body.model_id, req.defer)

    def load_model(self, req: Request[LoadModel]) -> None:
        body = req.body
        checked = load_request(self.config, body.model_id, body.path, body.options, self.limits)
        spec = checked.spec
        entry = self.table.get(body.model_id)
        configured = body.model_id in self.config.models
        if entry is None:
            entry = self.table.put(
                _entry_of(body.model_id, spec, checked.model.keep_alive, configured)
            )
        fields = {
            "path": spec.model_path,
            "n_ctx": spec.context.n_ctx,
            "n_seq_max": spec.context.n_seq_max,
            "keep_alive_s": checked.model.keep_alive,
        }
        self.models.enqueue(entry, Load(spec.to_wire(), fields, [req.stream()]))

    def unload(self, req: Request[ModelRef]) -> None:
        model_id = req.body.model_id
        entry = self.table.get(model_id)
        if entry is None:
            raise ModelNotFound(f"no model {model_id!r}", details={"model_id": model_id})
        op = Unload("unload", forget=True, replies=[req.defer()])
        self.models.enqueue(entry, op)

    def list_models(self, req: Request[NoArgs]) -> list[ModelInfo]:
        return [e.info() for e in sorted(self.table, key=lambda e: e.model_id)]

    def model_info(self, req: Request[ModelRef]) -> ModelInfo:
        entry = self.table.get(req.body.model_id)
        if entry is None:
            raise ModelNotFound(
                f"no model {req.body.model_id!r}", details={"model_id": req.body.model_id}
            )
        return entry.info()

    def set_keep_alive(self, req: Request[SetKeepAlive]) -> ModelInfo:
        """The model's ``keep_alive`` from now on (an HTTP client's, e.g.
        Ollama's per-request ``keep_alive``); kept in the saved table, so a
        restarted front keeps it too."""
        body = req.body
        entry = self.table.get(body.model_id)
        if entry is None:
            raise ModelNotFound(f"no model {body.model_id!r}", details={"model_id": body.model_id})
        entry.keep_alive_s = body.keep_alive_s
        self.models.save()
        log.info("front.keep_alive_set", model=body.model_id, keep_alive=body.keep_alive_s)
        return entry.info()

    def status(self, req: Request[NoArgs]) -> None:
        pending = req.defer()
        self.inspect_lane.submit(lambda i: i.children(), lambda o: self._status(pending, o))

    def _status(self, pending: PendingReply, outcome: Outcome[Supervisors]) -> None:
        if outcome.error is not None:
            pending.fail(outcome.error)
            return
        status: DaemonStatus = daemon_status(
            self.config,
            started_at=self.started_at,
            entries=list(self.table),
            board=self.models.board,
            supervisors=outcome.get(),
            gauges=self._gauges(),
        )
        pending.reply(status)

    def _counter_file(self) -> Counters | None:
        if self._counters is None:
            try:
                self._counters = Counters.attach(self.config.cache_settings().counters_path)
            except Exception as exc:  # cache-meta has not created it (yet)
                log.warning("front.counters_unavailable", error=str(exc))
                return None
        return self._counters

    def _gauges(self) -> dict[str, int]:
        counters = self._counter_file()
        return {} if counters is None else counters.snapshot()

    def counters(self, req: Request[NoArgs]) -> dict[str, int]:
        counters = self._counter_file()
        if counters is None:
            raise Unavailable("the cache's counters are not there yet (cache-meta is starting)")
        return counters.snapshot()

    def metrics(self, req: Request[NoArgs]) -> MetricsSnapshot:
        # Files only (boards, counters) and the table: answered at once, on
        # the loop, whatever a worker or cache-meta is doing. The cache's part
        # is empty while cache-meta has not created its counters yet.
        return daemon_metrics(
            self.config,
            started_at=self.started_at,
            entries=list(self.table),
            board=self.models.board,
            counters=self._gauges(),
        )

    def evict_bytes(self, req: Request[EvictBytes]) -> None:
        # The wire refused any tier that is not a TierKind before this runs.
        tiers = req.body.tiers
        pending = req.defer()
        n = min(req.body.n, EVICT_ALL)  # cache-meta's wire stops at EVICT_ALL
        self.cache_lane.submit(
            lambda cache: cache.evict_bytes(n, tiers)[1], lambda o: _answer(pending, o)
        )

    def gc(self, req: Request[NoArgs]) -> None:
        pending = req.defer()
        self.cache_lane.submit(
            lambda cache: GcReport(**msgspec.structs.asdict(cache.gc())),
            lambda o: _answer(pending, o),
        )


def _answer(pending: PendingReply, outcome: Outcome[int] | Outcome[GcReport]) -> None:
    if outcome.error is not None:
        pending.fail(outcome.error)
    else:
        pending.reply(outcome.value)
