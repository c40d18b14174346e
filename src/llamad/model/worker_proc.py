"""The model worker process: the thin shell around :class:`WorkerCore` (SPEC M1, M7, M10, M15).

:func:`run_worker` is the supervised child's entry point (see
:func:`llamad.model.worker_spec.worker_child_spec`). It builds the worker's
parts (:mod:`llamad.model.worker_parts`: the model, its context, the backend
and the cache view), serves actor ``model.<id>`` (ops:
:mod:`llamad.model.wire`, handlers: :mod:`llamad.model.worker_ops`), reports
ready, and runs the loop until SIGTERM:

.. code-block:: text

    while not stopped:
        actor.poll(0 if core.has_work() else until core.next_wakeup())
            # requests, cancels, session ops, status; finished saves (fd reader);
            # disconnected clients cancel their requests (handle on_cancel)
            # long texts' tokens from the text thread (fd reader, text_jobs)
        report = core.step()             # one llama_decode at most; a cancel of
                                         # its requests, a stop or its deadline
                                         # stops it under way (_interrupted)
        deliver report.events            # stream events, done/error terminals
        apply adapter changes once idle  # and admit the requests held behind them
        publish status                   # shared file, readable without the loop
    core.shutdown()                      # shutdown saves, capped; requests end cancelled

No event-loop code of its own: the actor's :meth:`~llamad.actors.Actor.poll`
waits on the socket, the wake pipe (signals), the clients' pidfds and the
save-completions fd at once. A heartbeat thread proves liveness to the
supervisor while no tick has run longer than ``HUNG_FACTOR`` times
``decode_timeout_ms`` (:mod:`llamad.model.heartbeat`); a decode is stopped
at ``decode_timeout_ms`` (its deadline), so the heartbeat is the last resort
for a tick that cannot be.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import structlog

from llamad import logs
from llamad._heap import release_free_heap
from llamad.actors import Actor, Limits, Registry
from llamad.llama_ffi.spin import spin_setting
from llamad.model.active import ActiveRequest
from llamad.model.backend import Interruptible
from llamad.model.core import TickReport, WorkerCore
from llamad.model.deliveries import Deliveries
from llamad.model.heartbeat import BusyMark, HeartbeatThread
from llamad.model.observed_backend import ObservedBackend
from llamad.model.planner import BatchPlan
from llamad.model.results import Event, TokenEvent
from llamad.model.status_board import StatusBoard, Throughput, WorkerSnapshot, status_path
from llamad.model.wire import WorkerMetrics
from llamad.model.worker_ops import WorkerOps
from llamad.model.worker_parts import WorkerParts, build_parts
from llamad.model.worker_spec import WorkerSpec, apply_numerics
from llamad.supervisor.child import heartbeat, heartbeat_interval, notifies_ready, notify_ready

__all__ = ["WorkerProcess", "run_worker"]

log = structlog.get_logger("llamad.model")

INTERRUPT_PROBE_S: Final = 0.003
"""How often a decode under way looks for cancels (a zero-timeout poll of the
actor's socket and fds from the abort check: ~20 us on this loaded 2-core
machine), once it has run 10 ms (``Context.set_abort_probe``'s ``first_s``),
or 30 ms for a generation step
(:data:`~llamad.model.llama_backend.GENERATION_FIRST_PROBE_S`): a generation
step of a few streams pays for none."""

METRICS_EVERY_S: Final = 0.25
"""Mid-decode, a token's counts (``generation_tokens``, the TTFT and
inter-token histograms) are published at most this often: building and
encoding them cost ~11 us of every ~10 ms step. A request's outcome, cache
hit or prompt sources, and every count once no decode follows, go out at
once (:meth:`WorkerProcess.snapshot`)."""

PUBLISH_EVERY_S: Final = 0.1
"""While one decode step follows another over the same sequences, each a
single generated row, with no request arriving, queued or ending between
them, the pre-decode snapshot goes out at most this often: what changes
from one such step to the next is only counts and rates (ticks, cells,
tokens per second), and building and writing the snapshot cost ~80 us of
a ~6 ms step of the default model on 2 cores. Any other step (a prefill
chunk, a new or finished request, a message handled) publishes before it
decodes, and the last step before the loop goes idle always publishes."""

HUNG_FACTOR: Final = 1.5
"""A decode is stopped at ``decode_timeout_ms``; a tick still busy at this
many times it silences the heartbeat (one that cannot be stopped)."""

AHEAD_AFTER_IDLE_S: Final = 0.1
"""After this long with no request in flight, the cache view may start what it
keeps off the request path (:meth:`CacheView.idle`: the read buffer for the
largest row seen). Not at once: a client sending its next request the moment
a reply ends (a chat, an agent) would find the helper's page faults beside
its restore on two cores, as the first repeat after a restart did."""

IDLE_TRIM_S: Final = 1.0
"""After this long with no request in flight, the worker hands the C heap's
free pages back (:func:`llamad._heap.release_free_heap`): what the model's
load and the last requests freed stays resident otherwise (~11 MB of the
default model's worker, SPEC P9). Once per idle spell, and once after the
load; the trim takes a few ms, between ticks."""

# A prompt travels inside the request's msgpack header: allow long ones.
_LIMITS: Final = Limits(max_header_bytes=32 << 20)


@notifies_ready
def run_worker(spec: Mapping[str, Any]) -> None:
    """Supervised entry point: load, report ready once serving, loop until SIGTERM."""
    logs.configure()
    parsed = WorkerSpec.from_wire(spec)
    apply_numerics(parsed)  # before the library computes anything
    worker = WorkerProcess(parsed)
    worker.serve(ready=notify_ready)


class WorkerProcess:
    """One model worker: its parts, its core, its actor and its loop."""

    def __init__(
        self,
        spec: WorkerSpec,
        *,
        clock: Callable[[], float] = time.monotonic,
        release_heap: Callable[[], object] = release_free_heap,
    ) -> None:
        self.spec = spec
        self.clock = clock
        self._release_heap = release_heap
        # When the idle trim is due (None: done, until a request comes);
        # due at once when the loop starts, the load's garbage being freed.
        self._trim_at: float | None = None
        # When the view's deferred work may start (None: done, until a request comes).
        self._ahead_at: float | None = None
        started = clock()
        self.parts: WorkerParts = build_parts(spec)
        try:
            # The namespace fingerprints the model file (a read of all of it):
            # pay that while loading, not inside the first request's tick.
            self.parts.cache.namespace(None)
            self.mark = BusyMark(clock)
            self.throughput = Throughput()
            self.backend = ObservedBackend(
                self.parts.backend, before=self._before_decode, after=self._after_decode
            )
            self.core = WorkerCore(spec.worker, self.backend, self.parts.cache, clock=clock)
            self.registry = Registry(spec.registry)
            remote = spec.remote
            self.actor = Actor(
                spec.actor_name,
                registry=self.registry,
                limits=_LIMITS,
                # With a tcp daemon endpoint the worker listens there too, so
                # a client on another host gets its tokens straight from here.
                tcp_host=None if remote is None else remote.host,
                curve=None if remote is None or remote.curve is None else remote.curve.load(),
            )
            self.deliveries = Deliveries()
            self._early_tokens = 0
            self.core.send_early = self._send_early
            self.ops = WorkerOps(
                self.core,
                self.parts,
                self.deliveries,
                self.mark,
                self.snapshot,
                adapter_dirs=spec.adapter_dirs,
            )
            self.ops.register(self.actor)
            # A cancel, a shutdown or the decode's deadline stops a decode
            # under way (see _interrupted); the heartbeat stays the last resort.
            self.actor.interrupt_ops = frozenset({"cancel"})
            inner = self.parts.backend
            self._interruptible = inner if isinstance(inner, Interruptible) else None
            if self._interruptible is not None:
                self._interruptible.set_interrupt(self._interrupted, INTERRUPT_PROBE_S)
        except BaseException:
            self.parts.close()
            raise
        self.board: StatusBoard | None = None
        # The process that serves is the one that built the worker (no fork
        # between): one getpid syscall less on every publish.
        self._pid = os.getpid()
        self._metrics: WorkerMetrics | None = None
        self._metrics_changes = -1
        self._metrics_taken = 0.0
        self._seq = 0
        self._last_tick_ms = 0.0
        self._tick_started: float | None = None
        self._owed = False
        """A tick's snapshot was left to the next tick's (see :meth:`step`)."""
        self._published_at = -float("inf")
        self._published_shape: tuple[object, ...] | None = None
        """The decode-only step the last pre-decode snapshot showed (its
        sequences and the request and queue counts), else ``None``."""
        self._in_batch: list[ActiveRequest] = []
        """The requests of the decode under way (what a cancel must stop)."""
        self.interrupts = 0
        """Decodes stopped under way by a cancel or a stop."""
        log.info(
            "model.worker_loaded",
            model=spec.model_id,
            path=spec.model_path,
            n_ctx=spec.worker.n_ctx,
            n_seq_max=spec.worker.n_seq_max,
            load_s=round(clock() - started, 3),
        )

    # -- status (SPEC M10) -------------------------------------------------------------

    def snapshot(self, *, decoding: bool = False) -> WorkerSnapshot:
        """The worker as it stands now (what :meth:`_publish` writes).

        ``decoding``: published just before a decode, with more to follow;
        the request metrics are then the last ones taken unless a request
        changed them since or they are :data:`METRICS_EVERY_S` old."""
        now = self.clock()
        generated, rows = self.throughput.rates(now)
        governor = self.parts.threads
        self._seq += 1
        return WorkerSnapshot(
            model_id=self.spec.model_id,
            pid=self._pid,
            instance=self.actor.instance,
            seq=self._seq,
            at=now,
            status=self.core.status(),
            busy_since=self.mark.since,
            generated_per_s=round(generated, 2),
            rows_per_s=round(rows, 2),
            last_tick_ms=round(self._last_tick_ms, 3),
            requests_total=self.ops.requests_total,
            threads=None if governor is None else governor.status(),
            spin=spin_setting(),
            last_request_at=self.ops.last_request_at,
            tokenizing=self.ops.text_jobs.waiting,
            metrics=self._metrics_at(now, fresh=not decoding),
        )

    def _metrics_at(self, now: float, *, fresh: bool) -> WorkerMetrics:
        metrics = self.core.metrics
        kept = self._metrics
        if (
            fresh
            or kept is None
            or metrics.changes != self._metrics_changes
            or now - self._metrics_taken >= METRICS_EVERY_S
        ):
            kept = self._metrics = metrics.snapshot()
            self._metrics_changes = metrics.changes
            self._metrics_taken = now
        return kept

    def _publish(self, *, decoding: bool = False, shape: tuple[object, ...] | None = None) -> None:
        self._owed = False
        self._published_shape = shape
        if self.board is not None:
            snapshot = self.snapshot(decoding=decoding)
            self._published_at = snapshot.at
            self.board.publish(snapshot)

    def _steady_shape(
        self, plan: BatchPlan, owners: list[ActiveRequest]
    ) -> tuple[object, ...] | None:
        """What a generation step looks like from outside, else ``None``: its
        sequences, the request and queue counts, and whether each of its
        requests is generating (a prompt's last row is a one-row step too)."""
        if len(owners) != len(plan.spans) or any(len(span.tokens) != 1 for span in plan.spans):
            return None
        core = self.core
        return (
            tuple(
                (span.seq, owner.generating) for span, owner in zip(plan.spans, owners, strict=True)
            ),
            len(core.requests),
            len(core.queue),
        )

    def _before_decode(self, plan: BatchPlan) -> None:
        # The batch is admitted and planned: readers see it while it decodes.
        now = self._tick_started = self.clock()
        slots = self.core.slots
        self._in_batch = owners = [
            owner for span in plan.spans if (owner := slots[span.seq].owner) is not None
        ]
        shape = self._steady_shape(plan, owners)
        if (
            shape is None
            or shape != self._published_shape
            or now - self._published_at >= PUBLISH_EVERY_S
        ):
            self._publish(decoding=True, shape=shape)
        else:
            # The same generation step as the one on the board: it stays
            # there, and the snapshot after the last step is still owed.
            self._owed = True
        if self._interruptible is not None:
            # decode_timeout_ms from the tick's start; the heartbeat judges
            # the tick hung only at HUNG_FACTOR times it, which leaves a
            # starved machine time to finish the node under way (one took
            # 0.5 s at a load of 11 on 2 cores) and put the batch back.
            since = self.mark.since if self.mark.since is not None else self._tick_started
            self._interruptible.decode_deadline = since + self.spec.decode_timeout_s

    def _interrupted(self) -> bool:
        """Called from inside a decode (every INTERRUPT_PROBE_S at most, on
        this thread, which the decode holds): whether to stop it now.

        The actor reads what is pending: cancels, closes, clients that exited
        and the ``cancel`` op are handled at once (they only mark requests in
        the core, :meth:`WorkerCore.cancel`), everything else is kept for the
        next poll. A stop signal or a cancel of a request of this batch stops
        the decode; the core puts the batch's sequences back, ends the
        cancelled request and plans the others' rows again (SPEC M7)."""
        self.actor.intake()
        if self.actor.stop_requested or any(r.cancel_requested for r in self._in_batch):
            self.interrupts += 1
            return True
        return False

    def _after_decode(self, plan: BatchPlan, seconds: float) -> None:
        self._last_tick_ms = seconds * 1000.0
        self._in_batch = []

    # -- the loop ----------------------------------------------------------------------

    def serve(self, ready: Callable[[], None] | None = None) -> None:
        """Serve until SIGTERM/SIGINT (or :meth:`Actor.request_stop`), then shut down."""
        self.actor.start()
        restore = self.actor.stop_on_signals()
        beats = self._heartbeat()
        clean = False
        try:
            self.board = StatusBoard(status_path(self.registry.root, self.spec.actor_name))
            completions = self.parts.completions
            if completions is not None:
                self.actor.add_reader(completions.fileno(), self._saves_done)
            self.actor.add_reader(self.ops.text_jobs.fileno(), self.ops.text_jobs.drain)
            self._publish()
            self._trim_at = self.clock()
            if ready is not None:
                ready()
            log.info("model.worker_serving", model=self.spec.model_id, actor=self.actor.name)
            while not self.actor.stop_requested:
                self.step(self._timeout())
            self.shutdown()
            clean = True
        finally:
            restore()
            if beats is not None:
                beats.stop()
            self.ops.close()
            self.actor.close()
            if self.board is not None:
                self.board.close(remove=clean)
            self.parts.close()

    def step(self, timeout: float | None = 0.0) -> TickReport:
        """One loop iteration: serve what is pending (waiting up to ``timeout``),
        then one tick."""
        handled = self.actor.poll(timeout)
        if handled:
            # A message may have changed what a snapshot shows (a session,
            # a request queued or cancelled): the next decode publishes.
            self._published_shape = None
        with self.mark.busy():
            report = self.core.step()
        if self.core.requests or not report.idle:
            # A request in flight (running, queued or waiting) is not idle
            # time: keep_alive counts from the last of these.
            self.ops.last_request_at = self.clock()
            self._trim_at = self.ops.last_request_at + IDLE_TRIM_S
            self._ahead_at = self.ops.last_request_at + AHEAD_AFTER_IDLE_S
        governor = self.parts.threads
        if governor is not None and not self.core.requests:
            # Nothing left to decode: the other workers get the cores now,
            # not after the governor's linger (threads.py, ThreadGovernor.idle).
            governor.idle()
        self._deliver(report)
        self.ops.settle()
        if report.batch and self.core.has_work():
            # Another tick follows at once, and a tick that decodes publishes
            # just before its decode: a snapshot now would be replaced within
            # a tick (the two publishes of a decode step took ~70 us of a
            # ~10 ms step of the default model). Owed, it goes out after the
            # next tick if that one does not decode.
            self._owed = True
        elif handled or not report.idle or self._owed:
            self._publish()
        trim_at, ahead_at = self._trim_at, self._ahead_at
        idle = report.idle and not self.core.requests
        if idle and ahead_at is not None and self.clock() >= ahead_at:
            # Work kept off the request path (the read buffer for the
            # largest row seen) starts now, with nothing beside it.
            self._ahead_at = None
            self.parts.cache.idle()
        if idle and trim_at is not None and self.clock() >= trim_at:
            self._trim_at = None
            self._release_heap()
        return report

    def shutdown(self) -> None:
        """Shutdown saves (capped by ``evict_save_timeout_ms``), then every open
        request ends ``cancelled`` and its client is told."""
        log.info("model.worker_stopping", model=self.spec.model_id, open=len(self.deliveries))
        with self.mark.busy():
            report = self.core.shutdown()
        self._deliver(report)
        self._publish()

    def _timeout(self) -> float | None:
        if self.core.has_work():
            return 0.0
        wakes = [
            w for w in (self.core.next_wakeup(), self._ahead_at, self._trim_at) if w is not None
        ]
        return max(0.0, min(wakes) - self.clock()) if wakes else None

    def _send_early(self, events: list[tuple[str, Event]]) -> None:
        """A tick's events so far, sent before a finish save packs (WorkerCore._finish)."""
        self._early_tokens += self._send(events)

    def _deliver(self, report: TickReport) -> None:
        generated = self._early_tokens + self._send(report.events)
        self._early_tokens = 0
        if report.batch and self._tick_started is not None:
            self.throughput.add(self._tick_started, generated, report.batch.n_rows)
            self._tick_started = None

    def _send(self, events: Sequence[tuple[str, Event]]) -> int:
        """Hand ``events`` to their deliveries; how many were sampled tokens.
        Several go to each client in one message (a gateway streaming several
        requests gets a tick's tokens together: SocketOutbox.batched)."""
        tokens = 0
        with self.actor.batched() if len(events) > 1 else contextlib.nullcontext():
            for request_id, event in events:
                if type(event) is TokenEvent and event.token is not None:
                    tokens += 1
                self.deliveries.deliver(request_id, event)
        return tokens

    def _saves_done(self) -> None:
        completions = self.parts.completions
        assert completions is not None
        for key, published in completions.drain():
            self.core.save_done(key, published)

    def _heartbeat(self) -> HeartbeatThread | None:
        interval = heartbeat_interval()
        if interval is None:
            return None  # not supervised, or no liveness asked for
        beats = HeartbeatThread(
            self.mark,
            timeout_s=self.spec.decode_timeout_s * HUNG_FACTOR,
            interval_s=interval / 2,
            beat=heartbeat,
        )
        beats.start()
        return beats
