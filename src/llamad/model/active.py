"""One request inside the worker core, from submission to its terminal event.

:class:`ActiveRequest` carries what the core needs between ticks: the
target tokens and the part still to feed, the sampled tokens and the text
they released, the save schedule, the timings; and it turns a sampled token
into stream events and an ending into a :class:`~llamad.model.results.Completion`.

Phases::

    QUEUED ──► ADMITTED ──► (WAITING) ──► RUNNING ──► DONE
       │           │             │           │
       └───────────┴─────────────┴───────────┴──► DONE (cancelled / failed)

ADMITTED: holds a sequence, not yet resolved. WAITING: its ``parent_key`` is
a finish save this worker has not yet seen published, or a save of a longer
prefix is in flight elsewhere (both bounded by ``session_resume_wait_ms``),
or another running request is prefilling the prefix they share
(:attr:`ActiveRequest.following`: its cells are shared once computed, SPEC
M18). RUNNING: prefilling, then generating.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from llamad.cache.key import Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcLogits
from llamad.model.backend import Sampled, SamplerHandle
from llamad.model.planner import SeqState
from llamad.model.request_metrics import RequestMetrics
from llamad.model.requests import RequestParams
from llamad.model.resolution import Resolution
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    CacheMiss,
    Completion,
    Event,
    FinishReason,
    Stats,
    ThinkingEvent,
    TokenEvent,
    TokenLogprob,
    TokenSources,
    ToolCallEvent,
    TopLogprob,
)
from llamad.model.savepoints import SaveSchedule
from llamad.model.sessions import Session
from llamad.model.stops import Section, Segment, TextStream

__all__ = ["ActiveRequest", "Phase"]


class Phase(StrEnum):
    QUEUED = "queued"
    ADMITTED = "admitted"
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"


def _ms(start: float | None, end: float | None) -> float:
    if start is None or end is None:
        return 0.0
    return round(max(0.0, end - start) * 1000.0, 3)


@dataclass(eq=False)
class ActiveRequest:
    request_id: str
    params: RequestParams
    target: list[int]
    """Tokens the sequence must hold before generating (prompt, or transcript + tail)."""
    namespace: Namespace
    sampler: SamplerHandle | None
    order: int
    submitted_at: float
    text: TextStream
    session: Session | None = None
    phase: Phase = Phase.QUEUED
    seq: int | None = None
    session_kv: bool = False
    """Its sequence is its session's live one, holding the session's KV."""
    feed: list[int] = field(default_factory=list)
    fed: int = 0
    """Tokens of ``feed`` already decoded."""
    generated: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    resolution: Resolution | None = None
    miss: CacheMiss | None = None
    schedule: SaveSchedule | None = None
    saved_max: int = 0
    """The longest row this request submitted for saving."""
    keep_logits: bool = False
    """Whether the target's last logits are kept for this request's saves
    (set at resolution: only when its finish save may be taken)."""
    prompt_logits: KvcLogits | None = None
    """The logits of the target's last position: computed by this request's
    decode of it, or read from the row it restored. Handed with every save
    that reaches that position; dropped when the request ends."""
    finish_key: bytes | None = None
    finish_reason: FinishReason | None = None
    cancel_requested: bool = False
    wait_until: float | None = None
    waited_from: float | None = None
    """When a wait began: for a save in flight, or for a leader's prefill."""
    inflight_until: float | None = None
    """Until when it may wait for a save in flight that would serve it better
    than anything published or live (set when it first sees one)."""
    wait_ms: float = 0.0
    lookup_ms: float = 0.0
    """Of the restore, the cache lookups (any wait for a save in them included)."""
    load_ms: float = 0.0
    """Of the restore, reading the row (validated) and unpacking it into the KV."""
    following: ActiveRequest | None = None
    """A running request prefilling a prefix this one shares: this one waits
    and then shares its cells rather than computing them twice."""
    follow_until: int = 0
    """Tokens of the leader's KV this one waits for."""
    sources: TokenSources | None = None
    """Where the target's tokens came from (set at resolution)."""
    prefill_tokens: int = 0
    admitted_at: float | None = None
    resolved_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    metrics: RequestMetrics | None = None
    """Its worker's counts, told of every token it samples (the core sets it)."""
    _packed_target: bytes | None = field(default=None, repr=False)
    _reply: list[str] = field(default_factory=list)
    _thinking: list[str] = field(default_factory=list)
    _tool_calls: list[str] = field(default_factory=list)

    @property
    def packed_target(self) -> bytes:
        """``target`` as u32 bytes, packed at the first call (the target never
        changes): what live sequences are compared with
        (:func:`~llamad.model.resolution.shared_prefix`)."""
        packed = self._packed_target
        if packed is None:
            packed = self._packed_target = tokens_to_bytes(self.target)
        return packed

    @property
    def continuation(self) -> bool:
        return self.params.continue_

    @property
    def wants_logits(self) -> bool:
        return not self.params.prefill_only

    @property
    def logits_at_end(self) -> bool:
        """Whether the target's last token is decoded alone, with logits: to
        sample from, or (``prefill_only``) to keep in the row it saves."""
        return self.wants_logits or self.keep_logits

    @property
    def remaining(self) -> int:
        """Tokens still to decode."""
        return len(self.feed) - self.fed

    @property
    def generating(self) -> bool:
        return bool(self.generated)

    def start_feed(self, tokens: list[int]) -> None:
        self.feed = tokens
        self.fed = 0

    def next_feed(self, limit: int) -> list[int]:
        """The next ``limit`` tokens to decode (a bounded copy for the planner)."""
        return self.feed[self.fed : self.fed + limit]

    def seq_state(self, pos: int, chunk: int) -> SeqState:
        """What the planner needs to know of this request's sequence this tick."""
        assert self.seq is not None
        limit = self.schedule.limit(pos) if self.schedule is not None else None
        # chunk + 1 tokens tell the planner all it can use (a chunk, held-back token).
        feed = self.next_feed(chunk + 1)
        return SeqState(self.seq, self.order, pos, feed, self.logits_at_end, limit)

    def consumed(self, n: int) -> None:
        if not self.generating:
            self.prefill_tokens += n
        self.fed += n

    # -- text and events -------------------------------------------------------

    def _events(
        self, segments: list[Segment], token: int | None, logprob: TokenLogprob | None
    ) -> list[Event]:
        events: list[Event] = []
        reply = []
        for seg in segments:
            if seg.section is Section.REPLY:
                reply.append(seg.text)
            elif seg.section is Section.THINKING:
                self._thinking.append(seg.text)
                events.append(ThinkingEvent(seg.text))
            else:
                self._tool_calls.append(seg.text)
                events.append(ToolCallEvent(seg.text))
        text = "".join(reply)
        self._reply.append(text)
        if token is not None or text:
            events.append(TokenEvent(text, token, logprob))
        return events

    def accept(
        self,
        sampled: Sampled,
        *,
        eog: bool,
        piece: bytes,
        kv_len: int,
        n_ctx: int,
        now: float,
    ) -> list[Event]:
        """Take one sampled token; sets :attr:`finish_reason` when it ends the request.

        ``kv_len`` is what the sequence holds now: the token would be decoded at
        that position, which must lie below ``n_ctx``.
        """
        if self.first_token_at is None:
            self.first_token_at = now
        if self.metrics is not None:
            self.metrics.token(self.submitted_at, self.last_token_at, now)
        self.last_token_at = now
        token = sampled.token
        self.generated.append(token)
        logprob = None
        if self.params.logprobs is not None and sampled.logprob is not None:
            top = tuple(TopLogprob(t, lp) for t, lp in sampled.top[: self.params.logprobs])
            logprob = TokenLogprob(token, sampled.logprob, top)
            if self.logprobs is None:
                self.logprobs = []
            self.logprobs.append(logprob)
        if eog:
            self.finish_reason = FinishReason.STOP
            segments = self.text.finish()
        else:
            segments = self.text.feed(piece)
            max_tokens = self.params.max_tokens
            if self.text.stopped is not None:
                self.finish_reason = FinishReason.STOP
            elif (max_tokens is not None and len(self.generated) >= max_tokens) or kv_len >= n_ctx:
                self.finish_reason = FinishReason.LENGTH
            if self.finish_reason is not None:
                segments += self.text.finish()
            else:
                self.start_feed([token])
        return self._events(segments, token, logprob)

    def flush(self) -> list[Event]:
        """Text still held when the request ends without a token (cancel)."""
        return self._events(self.text.finish(), None, None)

    # -- the result ------------------------------------------------------------

    def transcript(self) -> list[int]:
        return self.target + self.generated

    def completion(self, *, committed: int, now: float) -> Completion:
        assert self.finish_reason is not None
        res = self.resolution
        kind = (
            res.kind
            if res is not None
            else (CacheHitKind.CONTINUATION if self.continuation else CacheHitKind.COLD)
        )
        read = res.read if res is not None else 0
        self.finished_at = now
        end_prefill = self.first_token_at if self.first_token_at is not None else now
        return Completion(
            reply="".join(self._reply),
            generated=list(self.generated),
            context_tokens=self.transcript(),
            committed_tokens=committed,
            cache_hit_kind=kind,
            finish_reason=self.finish_reason,
            stats=Stats(
                prompt_tokens=len(self.target),
                completion_tokens=len(self.generated),
                prefill_tokens=self.prefill_tokens,
                queue_ms=_ms(self.submitted_at, self.admitted_at),
                restore_ms=_ms(self.admitted_at, self.resolved_at),
                wait_ms=round(self.wait_ms, 3),
                lookup_ms=round(self.lookup_ms, 3),
                load_ms=round(self.load_ms, 3),
                prefill_ms=_ms(self.resolved_at, end_prefill if self.resolved_at else None),
                generation_ms=_ms(self.first_token_at, now),
            ),
            cache_delta=CacheDelta(
                read=read,
                created=max(0, self.saved_max - read),
                sources=self.sources
                if self.sources is not None
                else TokenSources(computed=self.prefill_tokens),
            ),
            finish_key=self.finish_key,
            stop_sequence=self.text.stopped,
            thinking="".join(self._thinking),
            tool_calls=list(self._tool_calls),
            logprobs=self.logprobs,
            cache_miss=self.miss,
            session_id=None if self.session is None else self.session.session_id,
        )
