"""WorkerCore: the model worker's scheduler as a plain object stepped tick by tick.

The process shell owns the context, the actor endpoint and the cache client;
it forwards requests to this core and calls :meth:`WorkerCore.step` between
serving messages. The core reaches the model only through a
:class:`~llamad.model.backend.Backend` and the cache only through a
:class:`~llamad.model.cacheview.CacheView`, reads time from an injected
clock and starts no thread: a unit test steps it with a stub backend and an
in-memory cache and sees every decision.

One :meth:`~WorkerCore.step` is one tick:

1. requests cancelled since the last tick end (``done``, ``cancelled``);
2. queued requests take free sequences, oldest first (the least recently
   used idle session is parked, after an evict save, when none is free);
3. newly admitted requests resolve (:mod:`llamad.model.restore`);
4. the planner builds one batch over every running sequence
   (:mod:`llamad.model.planner`), within ``n_batch`` and the free KV cells;
5. one ``decode``; each logits row is sampled, its text matched against
   stop strings and markers, and its events queued;
6. save points due at the new lengths are taken; finished requests take
   their finish save and give their sequence back.

Events, save jobs and finished request ids come back in a :class:`TickReport`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from llamad.errors import BadRequest, ContextOverflow, LlamadError, TranscriptMismatch, Unavailable
from llamad.llama_ffi.errors import InvalidToken
from llamad.model.active import ActiveRequest, Phase
from llamad.model.admission import AdmissionQueue, SequencePool
from llamad.model.backend import Backend
from llamad.model.cacheview import CacheView
from llamad.model.config import WorkerConfig
from llamad.model.planner import BatchPlan, SeqState, plan_tick
from llamad.model.requests import RequestParams
from llamad.model.restore import Restorer
from llamad.model.results import (
    CacheHitKind,
    DoneEvent,
    ErrorEvent,
    Event,
    FinishReason,
    WorkerPhase,
    WorkerStatus,
)
from llamad.model.savepoints import SaveJob
from llamad.model.saver import Saver
from llamad.model.sessions import Session, SessionTable
from llamad.model.slots import Slot, cells_used
from llamad.model.stops import TextStream
from llamad.model.strategies import BatchStrategy, strategy_named

__all__ = ["TickReport", "WorkerCore"]

log = structlog.get_logger("llamad.model")


@dataclass(frozen=True, slots=True)
class TickReport:
    """What one :meth:`WorkerCore.step` did."""

    events: list[tuple[str, Event]]
    """``(request_id, event)`` in order; the shell streams each to its client."""
    batch: BatchPlan
    saves: list[SaveJob]
    """Saves handed to the cache (already carried out or queued by it)."""
    finished: list[str]
    """Requests that reached their terminal event."""

    @property
    def idle(self) -> bool:
        return not (self.batch or self.events or self.saves)


class WorkerCore:
    """Admission, resolution, the tick and the save points of one model worker."""

    def __init__(
        self,
        config: WorkerConfig,
        backend: Backend,
        cache: CacheView,
        *,
        clock: Callable[[], float] = time.monotonic,
        strategy: BatchStrategy | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.cache = cache
        self.clock = clock
        self.strategy = strategy if strategy is not None else strategy_named(config.strategy)
        self.slots = [Slot(i) for i in range(config.n_seq_max)]
        self.pool = SequencePool(config.n_seq_max)
        self.queue: AdmissionQueue[ActiveRequest] = AdmissionQueue(config.max_queue)
        self.sessions = SessionTable()
        self.requests: dict[str, ActiveRequest] = {}
        self.restorer = Restorer(config, backend, cache, clock)
        self.saver = Saver(backend, cache, self.sessions)
        self.ticks = 0
        self.last_cache_hit: CacheHitKind | None = None
        self.closed = False
        self._orders = 0
        self._outbox: list[tuple[str, Event]] = []
        self._finished: list[str] = []

    # -- requests --------------------------------------------------------------------

    def submit(self, request_id: str, tokens: Sequence[int], params: RequestParams) -> int | None:
        """Admit a request: ``None`` when it holds a sequence now, else its queue
        position. Refusals raise at once: ``overloaded``, ``sticky_busy``,
        ``no_session``, ``transcript_mismatch``, ``context_overflow``,
        ``invalid_token``, ``bad_request``, or the sampler's own errors."""
        if self.closed:
            raise Unavailable("the worker is shutting down")
        if request_id in self.requests:
            raise BadRequest(
                f"request {request_id!r} is already running", details={"field": "request_id"}
            )
        tokens = list(tokens)
        n_vocab = self.backend.n_vocab
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < n_vocab:
                raise InvalidToken(
                    f"token {i} ({t!r}) is outside [0, {n_vocab})",
                    details={"index": i, "n_vocab": n_vocab},
                )
        now = self.clock()
        session = None
        if params.session_id is not None:
            if params.continue_:
                self.sessions.known(params.session_id)
            session = self.sessions.claim(params.session_id, request_id, params.salt, now)
        try:
            req = self._new_request(request_id, tokens, params, session, now)
            return self._admit_or_queue(req, now)
        except BaseException:
            if session is not None:
                self.sessions.unclaim_new(session.session_id, request_id)
            raise

    def _new_request(
        self,
        request_id: str,
        tokens: list[int],
        params: RequestParams,
        session: Session | None,
        now: float,
    ) -> ActiveRequest:
        if params.continue_:
            assert session is not None
            expected = params.expect_committed
            if expected is not None and expected != session.committed:
                raise TranscriptMismatch(
                    f"session {session.session_id!r} has {session.committed} committed tokens, "
                    f"the caller expected {expected}",
                    details={"committed": session.committed, "expected": expected},
                )
            target = session.transcript + tokens
        else:
            target = tokens
        if not target:
            raise BadRequest("the prompt is empty", details={"field": "tokens"})
        if len(target) > self.config.n_ctx:
            raise ContextOverflow(
                f"{len(target)} tokens do not fit a context of {self.config.n_ctx}",
                details={"tokens": len(target), "n_ctx": self.config.n_ctx},
            )
        namespace = self.cache.namespace(params.salt)
        sampler = None if params.prefill_only else self.backend.open_sampler(params)
        self._orders += 1
        stream = TextStream(
            params.stop, thinking=self.config.thinking, tool_call=self.config.tool_call
        )
        return ActiveRequest(
            request_id=request_id,
            params=params,
            target=target,
            namespace=namespace,
            sampler=sampler,
            order=self._orders,
            submitted_at=now,
            text=stream,
            session=session,
            continuation=params.continue_,
        )

    def _admit_or_queue(self, req: ActiveRequest, now: float) -> int | None:
        session = req.session
        seq = None
        if session is not None and session.seq is not None:
            seq = session.seq  # a live session's sequence is its request's: no queue
        elif not self.queue:
            seq = self.pool.acquire()
        if seq is None:
            try:
                position = self.queue.push(req.request_id, req)
            except BaseException:
                self._close_sampler(req)
                raise
            self.requests[req.request_id] = req
            return position
        self.requests[req.request_id] = req
        self._bind(req, seq, now)
        return None

    def cancel(self, request_id: str) -> bool:
        """Cancel a request: ``done``/``cancelled`` at the next tick (at once when
        still queued; see :meth:`drain`). False if no such request is pending."""
        req = self.requests.get(request_id)
        if req is None:
            return False
        if req.phase is Phase.QUEUED:
            self.queue.remove(request_id)
            self._finish(req, FinishReason.CANCELLED, self.clock())
        else:
            req.cancel_requested = True
        return True

    # -- sessions (SPEC M12) -------------------------------------------------------------

    def end_session(self, session_id: str) -> None:
        """Forget a session and free its sequence (``no_session``, ``sticky_busy``)."""
        session = self.sessions.end(session_id)
        if session.seq is not None:
            self._clear_slot(self.slots[session.seq])
            self.pool.release(session.seq)

    def reset_session(self, session_id: str) -> None:
        """Empty a session's transcript and KV; it keeps its sequence."""
        session = self.sessions.reset(session_id)
        if session.seq is not None:
            slot = self.slots[session.seq]
            if slot.kv:
                self.backend.seq_truncate(slot.seq, 0)
            slot.kv = []

    def fork_session(self, source_id: str, new_id: str) -> bool:
        """A new session with ``source_id``'s transcript. True when its KV was copied
        into a free sequence (``seq_cp``); False when none was free and the new
        session starts parked (its first request restores or prefills)."""
        source, fork = self.sessions.fork(source_id, new_id, self.clock())
        if source.seq is None or not self.slots[source.seq].kv:
            return False
        seq = self.pool.acquire()
        if seq is None:
            return False
        self.backend.seq_copy(source.seq, seq)
        slot = self.slots[seq]
        slot.kv = list(self.slots[source.seq].kv)
        slot.session = fork
        self.sessions.bind(fork, seq)
        return True

    # -- the shell's other doors -----------------------------------------------------------

    def save_done(self, key: bytes, published: bool) -> None:
        """The writer finished an asynchronous save of ``key``."""
        self.saver.done(key, published)

    def has_work(self) -> bool:
        """Whether :meth:`step` would do anything now (else the shell may block)."""
        if self._outbox:
            return True
        return any(
            r.cancel_requested or r.phase in (Phase.ADMITTED, Phase.RUNNING)
            for r in self.requests.values()
        ) or (bool(self.queue) and (len(self.pool) > 0 or self.sessions.lru_idle() is not None))

    def next_wakeup(self) -> float | None:
        """The earliest clock time a waiting request must be looked at again."""
        waits = [r.wait_until for r in self.requests.values() if r.wait_until is not None]
        return min(waits, default=None)

    @property
    def cells_used(self) -> int:
        return cells_used(self.slots)

    def status(self) -> WorkerStatus:
        running = [r for r in self.requests.values() if r.phase is not Phase.QUEUED]
        if not self.requests:
            phase = WorkerPhase.IDLE
        elif running and all(r.generating for r in running):
            phase = WorkerPhase.GENERATING
        else:
            phase = WorkerPhase.PREFILLING
        return WorkerStatus(
            phase=phase,
            pending_len=len(self.requests),
            queue_depth=len(self.queue),
            active_sequences=len(running),
            free_sequences=len(self.pool),
            sessions=len(self.sessions),
            kv_cells_used=self.cells_used,
            ticks=self.ticks,
            last_cache_hit=self.last_cache_hit,
        )

    def shutdown(self) -> TickReport:
        """Save every live sequence synchronously (all within
        ``evict_save_timeout_ms``), then end every request as cancelled; later
        submissions are refused with ``unavailable``."""
        self.closed = True
        deadline = self.clock() + self.config.policy.evict_save_timeout_ms / 1000.0
        self.saver.shutdown(self.slots, deadline, self.clock)
        for req in sorted(self.requests.values(), key=lambda r: r.order):
            if req.phase is Phase.QUEUED:
                self.queue.remove(req.request_id)
            self._finish(req, FinishReason.CANCELLED, self.clock())
        return self._report(BatchPlan(()))

    # -- the tick ----------------------------------------------------------------------

    def step(self) -> TickReport:
        """One tick (see the module doc); returns at once when there is nothing to do."""
        now = self.clock()
        for req in list(self.requests.values()):
            if req.cancel_requested:
                self._finish(req, FinishReason.CANCELLED, now)
        self._admit_from_queue(now)
        for req in sorted(self.requests.values(), key=lambda r: r.order):
            if req.phase in (Phase.ADMITTED, Phase.WAITING):
                self._resolve(req, now)
        plan = self._plan(now)
        if plan:
            self.ticks += 1
            self._decode(plan, self.clock())
        return self._report(plan)

    def drain(self) -> TickReport:
        """Events produced between ticks (a queued request cancelled), without a tick."""
        return self._report(BatchPlan(()))

    def _report(self, plan: BatchPlan) -> TickReport:
        report = TickReport(self._outbox, plan, self.saver.take_jobs(), self._finished)
        self._outbox, self._finished = [], []
        return report

    def _emit(self, req: ActiveRequest, events: Sequence[Event]) -> None:
        self._outbox.extend((req.request_id, e) for e in events)

    def _bind(self, req: ActiveRequest, seq: int, now: float) -> None:
        slot = self.slots[seq]
        slot.owner = req
        req.seq = seq
        req.phase = Phase.ADMITTED
        req.admitted_at = now
        session = req.session
        if session is not None and session.seq is None:
            self.sessions.bind(session, seq)
            slot.session = session

    def _admit_from_queue(self, now: float) -> None:
        while self.queue:
            seq = self.pool.acquire()
            if seq is None:
                if not self._park_idle_session(now):
                    return
                continue
            self._bind(self.queue.pop(), seq, now)

    def _park_idle_session(self, now: float) -> bool:
        """Give the least recently used idle session's sequence back (evict save first)."""
        session = self.sessions.lru_idle()
        if session is None or session.seq is None:
            return False
        slot = self.slots[session.seq]
        self.saver.evict(slot, now + self.config.policy.evict_save_timeout_ms / 1000.0)
        self._clear_slot(slot)
        self.pool.release(self.sessions.park(session))
        log.info("model.session_parked", session_id=session.session_id, seq=slot.seq)
        return True

    def _clear_slot(self, slot: Slot) -> None:
        if slot.kv:
            self.backend.seq_truncate(slot.seq, 0)
        slot.kv = []
        slot.session = None
        slot.owner = None

    def _resolve(self, req: ActiveRequest, now: float) -> None:
        parent = req.params.parent_key
        if parent is not None and parent in self.saver.inflight_finish:
            # Our own finish save of the previous turn is still being written:
            # wait for it between ticks rather than miss it (SPEC C8 resume).
            if req.wait_until is None:
                req.wait_until = now + self.config.policy.session_resume_wait_ms / 1000.0
                req.phase = Phase.WAITING
            if now < req.wait_until:
                return
        req.wait_until = None
        assert req.seq is not None
        # Blocking on another process's in-flight save would stall every other
        # sequence, so the cache may wait only while nothing else runs.
        may_wait = not any(
            r is not req and r.phase is Phase.RUNNING for r in self.requests.values()
        )
        res = self.restorer.resolve(req, self.slots[req.seq], may_wait=may_wait)
        self.last_cache_hit = res.kind
        if req.remaining == 0:
            # prefill_only on a target the cache already held whole.
            self._finish(req, FinishReason.LENGTH, self.clock())

    def _plan(self, now: float) -> BatchPlan:
        while True:
            states = []
            for r in self.requests.values():
                if r.phase is not Phase.RUNNING or r.remaining == 0 or r.seq is None:
                    continue
                pos = len(self.slots[r.seq].kv)
                limit = r.schedule.limit(pos) if r.schedule is not None else None
                feed = r.next_feed(self.config.chunk + 1)
                states.append(SeqState(r.seq, r.order, pos, feed, r.wants_logits, limit))
            plan = plan_tick(
                states,
                self.strategy,
                n_batch=self.config.n_batch,
                chunk=self.config.chunk,
                free_cells=self.config.n_ctx - self.cells_used,
            )
            if plan or not states or not self._relieve_cells(now):
                return plan

    def _relieve_cells(self, now: float) -> bool:
        """No KV cell is free for any waiting row: park an idle session, else stop
        the newest running request that holds cells (older ones go on)."""
        if self._park_idle_session(now):
            return True
        holders = [
            r
            for r in self.requests.values()
            if r.phase is Phase.RUNNING and r.seq is not None and self.slots[r.seq].kv
        ]
        if not holders:
            return False
        victim = max(holders, key=lambda r: r.order)
        if victim.generating:
            self._finish(victim, FinishReason.LENGTH, now)
        else:
            overflow = ContextOverflow(
                "the context's KV cells are all held by other sequences",
                details={"n_ctx": self.config.n_ctx},
            )
            self._fail(victim, overflow, now)
        return True

    def _decode(self, plan: BatchPlan, now: float) -> None:
        try:
            self.backend.decode(plan)
        except LlamadError as exc:
            for span in plan.spans:
                owner = self.slots[span.seq].owner
                if owner is not None:
                    self._fail(owner, exc, now)
            return
        for span in plan.spans:
            slot = self.slots[span.seq]
            req = slot.owner
            assert req is not None
            slot.kv.extend(span.tokens)
            req.consumed(len(span.tokens))
            if span.want_logits and not self._sample(req, slot, plan, now):
                continue
            self.saver.save_due(req, slot)
            if req.finish_reason is not None:
                self._finish(req, req.finish_reason, now)
            elif req.remaining == 0 and not req.wants_logits:
                self._finish(req, FinishReason.LENGTH, now)

    def _sample(self, req: ActiveRequest, slot: Slot, plan: BatchPlan, now: float) -> bool:
        if req.schedule is not None:
            req.schedule.generation_started(len(slot.kv))
        try:
            row = plan.output_row(slot.seq)
            sampled = self.backend.sample(req.sampler, row, req.params.logprobs)
            eog = self.backend.is_eog(sampled.token)
            piece = b"" if eog else self.backend.piece(sampled.token)
        except LlamadError as exc:
            self._fail(req, exc, now)
            return False
        n_ctx = self.config.n_ctx
        events = req.accept(
            sampled, eog=eog, piece=piece, kv_len=len(slot.kv), n_ctx=n_ctx, now=now
        )
        self._emit(req, events)
        return True

    # -- endings ---------------------------------------------------------------------

    def _finish(self, req: ActiveRequest, reason: FinishReason, now: float) -> None:
        """End ``req`` with ``done``: finish save, session settled, sequence freed."""
        if req.phase is Phase.DONE:
            return
        req.finish_reason = reason
        self._emit(req, req.flush())
        slot = None if req.seq is None else self.slots[req.seq]
        committed = 0
        if slot is not None and req.resolution is not None:
            self.saver.finish(req, slot, allowed=not self.closed)
            committed = len(slot.kv)
        session = req.session
        if session is not None:
            if req.resolution is None:
                # It never ran: the session is as it was.
                transcript, committed = session.transcript, session.committed
            else:
                transcript = req.transcript()
                session.namespace = req.namespace
            self.sessions.settle(session, transcript, committed, now)
            if slot is not None:
                slot.owner = None
                if not slot.kv and session.seq is not None:
                    # An IDLE session holds KV; one with none gives its sequence back.
                    self.pool.release(self.sessions.park(session))
                    slot.session = None
        elif slot is not None:
            self._clear_slot(slot)
            self.pool.release(slot.seq)
        self._close_sampler(req)
        result = req.completion(committed=committed, now=now)
        self._emit(req, [DoneEvent(result)])
        self._retire(req)
        log.info(
            "model.request_done",
            request_id=req.request_id,
            finish_reason=reason.value,
            cache_hit_kind=result.cache_hit_kind.value,
            prompt_tokens=result.stats.prompt_tokens,
            completion_tokens=result.stats.completion_tokens,
        )

    def _fail(self, req: ActiveRequest, exc: LlamadError, now: float) -> None:
        """End ``req`` with ``error``. Its sequence's KV is dropped (a failed decode
        may have left it anywhere); a session keeps its transcript, parked."""
        if req.phase is Phase.DONE:
            return
        slot = None if req.seq is None else self.slots[req.seq]
        session = req.session
        if slot is not None:
            self.backend.seq_truncate(slot.seq, 0)
            slot.kv = []
            slot.owner = None
        if session is not None:
            self.sessions.settle(session, session.transcript, session.committed, now)
            if session.seq is not None:
                self.pool.release(self.sessions.park(session))
            if slot is not None:
                slot.session = None
        elif slot is not None:
            self.pool.release(slot.seq)
        self._close_sampler(req)
        wire = exc.to_wire()
        self._emit(req, [ErrorEvent(wire["code"], wire["message"], wire["details"])])
        self._retire(req)
        log.warning("model.request_failed", request_id=req.request_id, code=exc.code)

    def _retire(self, req: ActiveRequest) -> None:
        req.phase = Phase.DONE
        req.wait_until = None
        self.requests.pop(req.request_id, None)
        self._finished.append(req.request_id)

    def _close_sampler(self, req: ActiveRequest) -> None:
        if req.sampler is not None:
            sampler, req.sampler = req.sampler, None
            self.backend.close_sampler(sampler)
