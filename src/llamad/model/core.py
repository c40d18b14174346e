"""WorkerCore: the model worker's scheduler as a plain object stepped tick by tick.

The process shell owns the context, the actor endpoint and the cache client;
it forwards requests to this core and calls :meth:`WorkerCore.step` between
serving messages. The core reaches the model only through a
:class:`~llamad.model.backend.Backend` and the cache only through a
:class:`~llamad.model.cache_view_protocol.CacheView`, reads time from an injected
clock and starts no thread: a unit test steps it with a stub backend and an
in-memory cache and sees every decision.

One :meth:`~WorkerCore.step` is one tick:

1. requests cancelled since the last tick end (``done``, ``cancelled``);
2. queued requests take free sequences, oldest first (an empty one, else
   the least recently used idle entry's; the least recently used idle
   session is parked, after an evict save, when none is free); when some
   request is about to resolve, the idle entries whose rows a tier has
   published or is writing are released, but those it would reuse
   (``release_saved_idle``);
3. newly admitted requests resolve (:mod:`llamad.model.restore`): live KV
   first (an idle entry kept in place, or another sequence's prefix shared),
   then the cache; one that shares a prefix another running request is
   still prefilling waits for it instead of computing it twice. One whose
   KV comes with the logits of its target's last position samples its first
   token from them, and the tick ends here, with no decode, so that token
   reaches its client now (it is decoded at the next tick);
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

from llamad.cache.key import Namespace
from llamad.errors import BadRequest, ContextOverflow, LlamadError, Unavailable
from llamad.model.active import ActiveRequest, Phase
from llamad.model.admission import AdmissionQueue, SequencePool
from llamad.model.backend import Backend
from llamad.model.cache_view_protocol import CacheView
from llamad.model.config import WorkerConfig
from llamad.model.core_status import has_work, next_wakeup, status_of
from llamad.model.decoding import Outcome, run_batch, sample_stored
from llamad.model.endings import Endings
from llamad.model.planner import BatchPlan, plan_tick
from llamad.model.request_metrics import RequestMetrics
from llamad.model.requests import RequestParams, checked_tokens, target_tokens
from llamad.model.resolution import shared_prefix
from llamad.model.restore import Restorer, best_live
from llamad.model.results import (
    CacheHitKind,
    Event,
    FinishReason,
    WorkerStatus,
)
from llamad.model.savepoints import SaveJob
from llamad.model.saver import Saver
from llamad.model.sessions import Session, SessionTable
from llamad.model.slots import SequenceTable, Slot
from llamad.model.stops import TextStream
from llamad.model.strategies import BatchStrategy, strategy_named

__all__ = ["FOLLOW_MIN_TOKENS", "RELEASE_KEEP_MIN_TOKENS", "TickReport", "WorkerCore"]

log = structlog.get_logger("llamad.model")

FOLLOW_MIN_TOKENS = 32
"""A request waits for another's prefill only when it would share at least this
many more tokens than it can get now: below it, computing them costs less
than the ticks spent waiting."""

RELEASE_KEEP_MIN_TOKENS = 32
"""A starting request keeps a saved idle entry it would reuse from being
released only when it reuses all of it or at least this many tokens: every
prompt in a chat template shares its first few tokens with every entry, and
keeping 2,000 cells attended at every step to save prefilling a handful of
tokens is the wrong trade."""


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
        self.queue: AdmissionQueue[ActiveRequest] = AdmissionQueue(config.max_queue)
        self.sessions = SessionTable()
        self.requests: dict[str, ActiveRequest] = {}
        self.saver = Saver(backend, cache, self.sessions, clock)
        self.seqs = SequenceTable(
            config.n_seq_max, backend, self.sessions, self.saver, keep_idle=config.live_reuse
        )
        self.restorer = Restorer(
            config,
            backend,
            cache,
            clock,
            self.seqs,
            on_bad_row=self.saver.forget_written,
            on_row_read=self.saver.row_read,
        )
        self.endings = Endings(self.seqs, self.saver, backend)
        self.ticks = 0
        # What _report_live last told the cache (the idle entries' signature).
        self._live_signature: tuple[tuple[int, Namespace | None, int, float], ...] = ()
        self.decoding = False
        """Inside a tick's decode (a cancel then only marks its request)."""
        self.last_cache_hit: CacheHitKind | None = None
        self.stored_logits_hits = 0
        """First tokens sampled from stored logits, a row's or live KV's (status)."""
        self.live_hits = 0
        """Requests that kept or shared live KV another request left (status)."""
        self.metrics = RequestMetrics()
        """Outcomes, cache hits, prompt tokens by source, latency histograms
        since start (published with the status board)."""
        self.closed = False
        self._orders = 0
        self._sampled_stored = False
        self._outbox: list[tuple[str, Event]] = []
        self._finished: list[str] = []
        self.send_early: Callable[[list[tuple[str, Event]]], None] | None = None
        """Set by the shell: takes the events of this tick so far, before a
        request's ending packs its finish save (see :meth:`_finish`)."""

    # -- requests --------------------------------------------------------------------

    def submit(
        self,
        request_id: str,
        tokens: Sequence[int],
        params: RequestParams,
        *,
        waited_s: float = 0.0,
    ) -> int | None:
        """Admit a request: ``None`` when it holds a sequence now, else its queue
        position. Refusals raise at once: ``overloaded``, ``sticky_busy``,
        ``no_session``, ``transcript_mismatch``, ``context_overflow``,
        ``invalid_token``, ``bad_request``, or the sampler's own errors.

        ``waited_s``: how long before now the client sent it (it waited for a
        tick in progress, or on its way); counted in its ``queue_ms``."""
        if self.closed:
            raise Unavailable("the worker is shutting down")
        if request_id in self.requests:
            raise BadRequest(
                f"request {request_id!r} is already running", details={"field": "request_id"}
            )
        checked = checked_tokens(tokens, self.backend.n_vocab)
        now = self.clock()
        sent = now - max(0.0, waited_s)
        session = None
        if params.session_id is not None:
            if params.continue_:
                self.sessions.known(params.session_id)
            session = self.sessions.claim(params.session_id, request_id, params.salt, now)
        try:
            req = self._new_request(request_id, checked, params, session, sent)
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
        target = target_tokens(
            tokens,
            params,
            transcript=session.transcript if session is not None else [],
            committed=session.committed if session is not None else 0,
            n_ctx=self.config.n_ctx,
        )
        namespace = self.cache.namespace(params.salt)
        sampler = None if params.prefill_only else self.backend.open_sampler(params)
        self._orders += 1
        text = TextStream(
            params.stop, thinking=self.config.thinking, tool_call=self.config.tool_call
        )
        req = ActiveRequest(
            request_id, params, target, namespace, sampler, self._orders, now, text, session
        )
        req.metrics = self.metrics
        return req

    def _admit_or_queue(self, req: ActiveRequest, now: float) -> int | None:
        session = req.session
        seq = None
        if session is not None and session.seq is not None:
            seq = session.seq  # a live session's sequence is its request's: no queue
        elif not self.queue:
            seq = self.seqs.acquire()
        if seq is None:
            try:
                position = self.queue.push(req.request_id, req)
            except BaseException:
                if req.sampler is not None:
                    self.backend.close_sampler(req.sampler)
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
        if req.phase is Phase.QUEUED and not self.decoding:
            self.queue.remove(request_id)
            self._finish(req, FinishReason.CANCELLED, self.clock())
        else:
            # During a decode (the shell looks for cancels from inside it,
            # WorkerProcess._interrupted) only a mark: the tick's state must
            # not change under it. The next tick ends the request.
            req.cancel_requested = True
        return True

    # -- sessions (SPEC M12) -------------------------------------------------------------

    def end_session(self, session_id: str) -> None:
        """Forget a session and free its sequence (``no_session``, ``sticky_busy``)."""
        self.seqs.end_session(session_id)

    def reset_session(self, session_id: str) -> None:
        """Empty a session's transcript and KV; it keeps its sequence."""
        self.seqs.reset_session(session_id)

    def fork_session(self, source_id: str, new_id: str) -> bool:
        """A new session with ``source_id``'s transcript. True when its KV was copied
        into a free sequence (``seq_cp``); False when none was free and the new
        session starts parked (its first request restores or prefills)."""
        return self.seqs.fork_session(source_id, new_id, self.clock())

    # -- the shell's other doors -----------------------------------------------------------

    def save_done(self, key: bytes, published: bool) -> None:
        """The writer finished an asynchronous save of ``key``."""
        self.saver.done(key, published)

    def has_work(self) -> bool:
        """Whether :meth:`step` would do anything now (else the shell may block)."""
        return has_work(self)

    def next_wakeup(self) -> float | None:
        """The earliest clock time a waiting request must be looked at again."""
        return next_wakeup(self)

    def status(self) -> WorkerStatus:
        return status_of(self)

    @property
    def pending_events(self) -> int:
        """Events produced since the last report (a queued request cancelled)."""
        return len(self._outbox)

    @property
    def slots(self) -> list[Slot]:
        return self.seqs.slots

    @property
    def pool(self) -> SequencePool:
        return self.seqs.pool

    @property
    def cells_used(self) -> int:
        return self.seqs.cells_used

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
                if req.phase is Phase.QUEUED:
                    self.queue.remove(req.request_id)
                self._finish(req, FinishReason.CANCELLED, now)
        self._admit_from_queue(now)
        self._sampled_stored = False
        starting = [
            r
            for r in sorted(self.requests.values(), key=lambda r: r.order)
            if r.phase in (Phase.ADMITTED, Phase.WAITING)
        ]
        if starting:
            # What they would reuse, worked out only when a release or a move
            # can happen (a follower is a starting request at every tick).
            reused: set[Slot] | None = None
            # The release runs before resolution, not after: a request
            # restored from a row unpacks it during resolution, and llama.cpp
            # gives a sequence the first free cells, so the entries must be
            # gone first for its cells (and a cold prefill's, at the decode)
            # to land low and shrink the span every decode attends over.
            if self.config.release_saved_idle and self.seqs.any_saved_idle():
                reused = self._reused_live(starting)
                self.seqs.release_saved(reused)
            # After any release (the cells it freed are where entries move
            # to), and again once the requests resolved: one that took an
            # idle entry's sequence kept its KV in place until then, and an
            # entry sharing cells with it could not move. The entries they
            # are about to reuse stay put (SequenceTable.compact_idle).
            if self.seqs.gapped():
                if reused is None:
                    reused = self._reused_live(starting)
                self.seqs.compact_idle(keep=reused)
        for req in starting:
            if req.phase in (Phase.ADMITTED, Phase.WAITING):
                self._resolve(req, now)
        if starting:
            self.seqs.compact_idle()
        if self._sampled_stored:
            # A first token sampled from stored logits goes out before any
            # decode: the decode would put a whole step into its TTFT. The
            # shell steps again at once (the token is its next feed).
            return self._report(BatchPlan(()))
        plan = self._plan(now)
        if plan:
            self.ticks += 1
            self._decode(plan)
        return self._report(plan)

    def drain(self) -> TickReport:
        """Events produced between ticks (a queued request cancelled), without a tick."""
        return self._report(BatchPlan(()))

    def _report(self, plan: BatchPlan) -> TickReport:
        self._report_live()
        report = TickReport(self._outbox, plan, self.saver.take_jobs(), self._finished)
        self._outbox, self._finished = [], []
        return report

    def _report_live(self) -> None:
        """Tell the cache which idle entries are kept live, when that changed.

        cache-meta publishes them as KV events (medium ``live``), so a router
        sees a prompt this worker can reuse without a restore. Compared per
        tick by a small signature (a few slots); sent only on a change.
        """
        idle = [s for s in self.seqs if s.idle and s.namespace is not None]
        signature = tuple((s.seq, s.namespace, len(s.kv), s.idle_since) for s in idle)
        if signature == self._live_signature:
            return
        self._live_signature = signature
        self.cache.report_live([(s.seq, s.namespace, s.kv) for s in idle if s.namespace])

    def _emit(self, req: ActiveRequest, events: Sequence[Event]) -> None:
        self._outbox.extend((req.request_id, e) for e in events)

    def _bind(self, req: ActiveRequest, seq: int, now: float) -> None:
        self.seqs.bind(req, seq)
        req.phase = Phase.ADMITTED
        req.admitted_at = now

    def _admit_from_queue(self, now: float) -> None:
        while self.queue:
            seq = self.seqs.acquire()
            if seq is None:
                if not self._park_idle_session(now):
                    return
                continue
            self._bind(self.queue.pop(), seq, now)

    def _park_idle_session(self, now: float) -> bool:
        deadline = now + self.config.policy.evict_save_timeout_ms / 1000.0
        return self.seqs.park_idle_session(deadline)

    def _resolve(self, req: ActiveRequest, now: float) -> None:
        assert req.seq is not None
        if self._follows(req):
            return
        parent = req.params.parent_key
        pending = None if parent is None else self.saver.inflight_finish.get(parent)
        if pending is not None and not self._live_covers(req, pending):
            # Our own finish save of the previous turn is still being written
            # and no live KV holds as much: wait for it between ticks rather
            # than miss it (SPEC C8 resume).
            if req.wait_until is None:
                req.wait_until = now + self.config.policy.session_resume_wait_ms / 1000.0
                # One bound for the request, whichever save it waits for.
                req.inflight_until = req.wait_until
                req.waited_from = now
                req.phase = Phase.WAITING
            if now < req.wait_until:
                return
        req.wait_until = None
        # Blocking on another process's in-flight save would stall every other
        # sequence, so the cache may wait only while nothing else runs.
        may_wait = not any(
            r is not req and r.phase is Phase.RUNNING for r in self.requests.values()
        )
        res = self.restorer.resolve(req, self.slots[req.seq], may_wait=may_wait)
        if res is None:
            # A save in flight would serve it better: wait between ticks
            # (other sequences decode), asking again, until it lands or the
            # bound passes (SPEC M18).
            req.phase = Phase.WAITING
            req.wait_until = req.inflight_until
            if req.waited_from is None:
                req.waited_from = now
            return
        req.wait_until = None
        self.last_cache_hit = res.kind
        if res.live and req.session is None and res.keep > 0:
            self.live_hits += 1
        if req.waited_from is not None:
            req.wait_ms = max(0.0, self.clock() - req.waited_from) * 1000.0
        if req.sources is not None:
            self.metrics.resolved(res.kind, req.sources)
            try:
                self.cache.account(req.sources)
            except (LlamadError, OSError) as exc:  # counting never costs a request
                log.warning("model.account_failed", error=repr(exc))
        if res.stored_logits:
            self._sampled_stored = True
            out = sample_stored(
                req,
                self.slots[req.seq],
                backend=self.backend,
                n_ctx=self.config.n_ctx,
                clock=self.clock,
            )
            if out.error is None:
                self.stored_logits_hits += 1
            self._settle(out, self.clock())
        elif req.remaining == 0:
            # prefill_only on a target the cache already held whole.
            self._finish(req, FinishReason.LENGTH, self.clock())

    def _reused_live(self, starting: Sequence[ActiveRequest]) -> set[Slot]:
        """The idle entries ``starting`` would reuse live once they resolve:
        what resolution will choose from (:func:`best_live`: the entry a
        request continues, repeats or shares a prefix of, its
        ``parent_key``'s turn), when it reuses all of it or at least
        :data:`RELEASE_KEEP_MIN_TOKENS`. A request's own sequence is held,
        never an idle entry."""
        reused: set[Slot] = set()
        if not any(s.idle for s in self.seqs.slots):
            return reused
        for req in starting:
            assert req.seq is not None
            live = best_live(self.seqs, req, self.slots[req.seq])
            if live is None:
                continue
            source = self.slots[live.seq]
            if live.common >= min(len(source.kv), RELEASE_KEEP_MIN_TOKENS):
                reused.add(source)
        return reused

    def _drop_unresolved_kv(self) -> bool:
        """Clear the idle entry a request took with its sequence but has not
        resolved yet (it waits for a leader or a save): it decides what to
        keep only when it resolves, and its cells may be needed before."""
        for req in sorted(self.requests.values(), key=lambda r: r.order, reverse=True):
            if req.resolution is None and req.seq is not None and not req.session_kv:
                slot = self.slots[req.seq]
                if slot.kv:
                    self.seqs.clear(slot)
                    return True
        return False

    def _live_covers(self, req: ActiveRequest, n_tokens: int) -> bool:
        """Whether live KV already holds at least ``n_tokens`` of ``req``'s target."""
        assert req.seq is not None
        live = best_live(self.seqs, req, self.slots[req.seq])
        return live is not None and live.common >= n_tokens

    def _follows(self, req: ActiveRequest) -> bool:
        """Whether ``req`` waits (this tick) for another running request to prefill
        the prefix they share, so that it shares those cells instead of
        computing them again (SPEC M18: concurrent agents over one prefix)."""
        if req.session is not None or req.continuation or not self.config.live_reuse:
            return False
        leader = req.following
        if leader is not None:
            if (
                leader.phase is Phase.RUNNING
                and not leader.generating
                and leader.seq is not None
                and len(self.slots[leader.seq].kv) < req.follow_until
            ):
                return True
            req.following = None  # it got there, or it stopped: resolve now
            return False
        assert req.seq is not None
        live = best_live(self.seqs, req, self.slots[req.seq])
        have = 0 if live is None else live.common
        best: tuple[int, ActiveRequest] | None = None
        for other in self.requests.values():
            if (
                other is req
                or other.phase is not Phase.RUNNING
                or other.generating
                or other.seq is None
                or other.namespace != req.namespace
            ):
                continue
            # It will hold its whole target once it has prefilled and decoded
            # its last token; wait for no more than it will hold while prefilling.
            reach = min(shared_prefix(other.target, req.packed_target), len(other.target) - 1)
            held = len(self.slots[other.seq].kv)
            if reach - max(held, have) >= FOLLOW_MIN_TOKENS and (best is None or reach > best[0]):
                best = (reach, other)
        if best is None:
            return False
        req.follow_until, req.following = best
        req.phase = Phase.WAITING
        if req.waited_from is None:
            req.waited_from = self.clock()
        log.debug(
            "model.request_follows",
            request_id=req.request_id,
            leader=best[1].request_id,
            tokens=best[0],
        )
        return True

    def _plan(self, now: float) -> BatchPlan:
        while True:
            states = [
                r.seq_state(len(self.slots[r.seq].kv), self.config.chunk)
                for r in self.requests.values()
                if r.phase is Phase.RUNNING and r.remaining > 0 and r.seq is not None
            ]
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
        """No KV cell is free for any waiting row: drop the least recently used
        idle entry, else park an idle session, else stop the newest running
        request that holds cells (older ones go on)."""
        if self.seqs.drop_idle():
            return True
        if self._drop_unresolved_kv():
            return True
        if self._park_idle_session(now):
            return True
        running = [r for r in self.requests.values() if r.phase is Phase.RUNNING]
        victim = self.seqs.newest_holder(running)
        if victim is None:
            return False
        if victim.generating:
            self._finish(victim, FinishReason.LENGTH, now)
        else:
            overflow = ContextOverflow(
                "the context's KV cells are all held by other sequences",
                details={"n_ctx": self.config.n_ctx},
            )
            self._fail(victim, overflow, now)
        return True

    def _decode(self, plan: BatchPlan) -> None:
        self.decoding = True
        try:
            outcomes = run_batch(
                plan,
                backend=self.backend,
                seqs=self.seqs,
                saver=self.saver,
                n_ctx=self.config.n_ctx,
                clock=self.clock,
            )
        finally:
            self.decoding = False
        now = self.clock()  # after the decode: what ends now ended after it
        # Every token of the step first, then the endings: an ending may pack
        # a finish save, and the tokens go out before it (see _finish).
        for out in outcomes:
            self._emit(out.req, out.events)
        for out in outcomes:
            self._end(out, now)

    def _settle(self, out: Outcome, now: float) -> None:
        self._emit(out.req, out.events)
        self._end(out, now)

    def _end(self, out: Outcome, now: float) -> None:
        if out.error is not None:
            self._fail(out.req, out.error, now)
        elif out.finished is not None:
            self._finish(out.req, out.finished, now)

    # -- endings ---------------------------------------------------------------------

    def _finish(self, req: ActiveRequest, reason: FinishReason, now: float) -> None:
        if req.phase is not Phase.DONE:
            if self.send_early is not None and self._outbox:
                # The finish save packs the sequence's KV on this loop (tens of
                # MB, milliseconds each). The tokens sampled so far leave first:
                # a request that ends on its first token (max_tokens 1, agents
                # finishing together) would otherwise carry its own and its
                # siblings' packs in its TTFT (P6: ~45 ms of three 1,056-token
                # rows on the benchmark VM).
                out, self._outbox = self._outbox, []
                self.send_early(out)
            self._emit(req, self.endings.finish(req, reason, now, allow_save=not self.closed))
            self.metrics.finished(reason, req.submitted_at, req.admitted_at, now)
            self._retire(req)

    def _fail(self, req: ActiveRequest, exc: LlamadError, now: float) -> None:
        if req.phase is not Phase.DONE:
            self._emit(req, self.endings.fail(req, exc, now))
            self.metrics.failed(req.submitted_at, req.admitted_at, now)
            self._retire(req)

    def _retire(self, req: ActiveRequest) -> None:
        req.phase = Phase.DONE
        req.wait_until = None
        self.requests.pop(req.request_id, None)
        self._finished.append(req.request_id)
