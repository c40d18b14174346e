"""What a request answers: its result and its stream events, as wire types (SPEC M7, M8, M16).

Every type here is a frozen msgspec Struct that travels as-is from the worker
to the client. Stream events are a tagged union on ``kind`` (the
:class:`EventKind` values); decode them with :data:`EVENT_DECODER` or
``msgspec.convert(raw, Event)``.

Texts on a stream add up: the ``text`` of every ``token`` event, in order, is
the completion's ``reply``; of every ``thinking`` event its ``thinking``; the
``tool_call`` events are its ``tool_calls``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Final

import msgspec

__all__ = [
    "EVENT_DECODER",
    "CacheDelta",
    "CacheHitKind",
    "CacheMiss",
    "Completion",
    "DoneEvent",
    "ErrorEvent",
    "Event",
    "EventKind",
    "FinishReason",
    "IdleEntry",
    "ReadBufferStats",
    "Stats",
    "ThinkingEvent",
    "TokenEvent",
    "TokenLogprob",
    "TokenSource",
    "TokenSources",
    "ToolCallEvent",
    "TopLogprob",
    "WorkerPhase",
    "WorkerStatus",
]


class CacheHitKind(StrEnum):
    """How a request's starting state was obtained (SPEC M3).

    Not :class:`llamad.cache.lookup.HitKind`, which says how a cache *row*
    relates to a prompt: a prompt restored from a longer row is a ``common``
    row but an ``exact`` hit, and the sticky and continuation kinds involve no
    row at all.
    """

    EXACT = "exact"
    """A restored row, or live KV, covered the whole prompt."""
    PARTIAL = "partial"
    """A restored row, or live KV, covered a prefix; the rest was prefilled."""
    COLD = "cold"
    """Nothing usable was cached; the whole prompt was prefilled."""
    STICKY = "sticky"
    """The session's live sequence already held a prefix of the prompt."""
    CONTINUATION = "continuation"
    """``continue``: the tail was appended to the session as asserted by the caller."""


class FinishReason(StrEnum):
    STOP = "stop"
    """End of generation token, or a stop sequence."""
    LENGTH = "length"
    """``max_tokens`` reached, the context is full, or ``prefill_only`` (no tokens asked)."""
    CANCELLED = "cancelled"


class EventKind(StrEnum):
    """The ``kind`` tag of each stream event type."""

    TOKEN = "token"
    THINKING = "thinking"
    TOOL_CALL = "tool_call"
    DONE = "done"
    ERROR = "error"


class TokenSource(StrEnum):
    """Where a prompt token's KV came from (SPEC M18, C12)."""

    LIVE = "live"
    """Cells already in the context: an idle entry, a session, another sequence."""
    RAM = "ram"
    RAM_FILE = "ram_file"
    DISK = "disk"
    REMOTE = "remote"
    COMPUTED = "computed"
    """Prefilled by this request."""


class TokenSources(msgspec.Struct, frozen=True):
    """Prompt tokens by where their KV came from; they add up to the prompt.

    A token held back to be decoded alone (the prompt's last, for fresh
    logits) counts as ``computed`` even when the row or the live KV covered it.
    """

    live: int = 0
    ram: int = 0
    ram_file: int = 0
    disk: int = 0
    remote: int = 0
    computed: int = 0

    def of(self, source: TokenSource) -> int:
        value: int = getattr(self, source.value)
        return value

    @property
    def reused(self) -> int:
        """Tokens not computed by this request."""
        return self.live + self.ram + self.ram_file + self.disk + self.remote

    def as_dict(self) -> dict[str, int]:
        return {s.value: self.of(s) for s in TokenSource}


class CacheDelta(msgspec.Struct, frozen=True):
    """Prompt tokens the cache supplied (``read``: a row or live KV covered
    them), new tokens this request submitted for saving beyond them
    (``created``), and where every prompt token came from (``sources``)."""

    read: int = 0
    created: int = 0
    sources: TokenSources = msgspec.field(default_factory=TokenSources)


class Stats(msgspec.Struct, frozen=True):
    """Counts and times of one request; times in milliseconds of the worker's clock.

    ``prompt_tokens``: tokens the sequence had to hold before generating
    (prompt, or session transcript plus tail); ``prefill_tokens``: how many of
    them were decoded here (the rest came from the cache or the live session).
    ``queue_ms``: from when the request was sent (by a client on the same
    host; else from when the worker read it) to its admission to a sequence:
    transport, a tick already running when it arrived, and the wait for a
    free sequence; ``restore_ms``: from admission to a
    resolved start (live KV kept or shared, cache lookup and restore, and any
    wait); ``wait_ms``: the part of it spent waiting, for a save of this
    prompt still in flight or for another request prefilling the prefix they
    share; ``prefill_ms``: until the first token's logits; ``generation_ms``:
    from then to the end. Of ``restore_ms``, ``lookup_ms`` went to the cache
    lookups (a wait in them included) and ``load_ms`` to reading the row
    (validated: its checksums) and unpacking it into the KV, the part a
    copy of the row's bytes bounds from below (SPEC P1's floor).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    prefill_tokens: int = 0
    queue_ms: float = 0.0
    restore_ms: float = 0.0
    prefill_ms: float = 0.0
    generation_ms: float = 0.0
    wait_ms: float = 0.0
    lookup_ms: float = 0.0
    load_ms: float = 0.0


class CacheMiss(msgspec.Struct, frozen=True):
    """Why the cache did not cover the whole prompt (SPEC M16).

    ``nearest_key`` is the saved row sharing the most leading tokens with the
    prompt (``None``: nothing saved in this namespace), and the prompt leaves
    it at token ``diverged_at``. ``before`` / ``after`` are the prompt's text
    just before and from that token, so a changed chat template shows.
    ``restored_tokens`` is what was restored (or kept live) nevertheless (0
    when cold). ``inflight_key`` / ``inflight_tokens``: a row still being
    written when the request resolved that would have covered more
    (``inflight_tokens`` of the prompt), and ``waited_ms``: how long the
    request waited for such a save before going on (SPEC M18: a lookup never
    runs cold silently past a save in flight).
    """

    prompt_tokens: int
    diverged_at: int
    restored_tokens: int = 0
    nearest_key: bytes | None = None
    before: str = ""
    after: str = ""
    inflight_key: bytes | None = None
    inflight_tokens: int = 0
    waited_ms: float = 0.0


class TopLogprob(msgspec.Struct, frozen=True, array_like=True):
    token: int
    logprob: float


class TokenLogprob(msgspec.Struct, frozen=True):
    """The sampled token's log-probability and the ``k`` most likely alternatives."""

    token: int
    logprob: float
    top: tuple[TopLogprob, ...] = ()


class Completion(msgspec.Struct, frozen=True):
    """The full result of one request (the ``done`` event's payload; SPEC M8).

    ``generated``: sampled tokens (an end-of-generation token included).
    ``context_tokens``: what the sequence stands for at the end (prompt, or
    session transcript plus tail, then ``generated``); the KV holds the first
    ``committed_tokens`` of them (the last sampled token is decoded only when a
    session goes on). ``finish_key``: the cache key of the row the finish save
    wrote (or found already written); pass it as the next turn's
    ``parent_key``. ``cache_miss``: set unless the hit was exact, sticky or a
    continuation.
    """

    reply: str
    generated: list[int]
    context_tokens: list[int]
    committed_tokens: int
    cache_hit_kind: CacheHitKind
    finish_reason: FinishReason
    stats: Stats
    cache_delta: CacheDelta = CacheDelta()
    finish_key: bytes | None = None
    stop_sequence: str | None = None
    thinking: str = ""
    tool_calls: list[str] = msgspec.field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    cache_miss: CacheMiss | None = None
    session_id: str | None = None

    @property
    def cancelled(self) -> bool:
        return self.finish_reason is FinishReason.CANCELLED


class TokenEvent(msgspec.Struct, frozen=True, tag=EventKind.TOKEN.value, tag_field="kind"):
    """One sampled token and the reply text it released.

    ``text`` may be empty (held back while it could still begin a stop
    sequence or a marker) or carry text of earlier tokens. ``token`` is
    ``None`` only for the text released when a request ends without a token.
    """

    text: str
    token: int | None = None
    logprob: TokenLogprob | None = None


class ThinkingEvent(msgspec.Struct, frozen=True, tag=EventKind.THINKING.value, tag_field="kind"):
    """Text between the thinking markers (the markers themselves excluded)."""

    text: str


class ToolCallEvent(msgspec.Struct, frozen=True, tag=EventKind.TOOL_CALL.value, tag_field="kind"):
    """One complete tool call: the text between the tool-call markers."""

    text: str


class DoneEvent(msgspec.Struct, frozen=True, tag=EventKind.DONE.value, tag_field="kind"):
    """The terminal event of a request that finished (cancelled included)."""

    result: Completion


class ErrorEvent(msgspec.Struct, frozen=True, tag=EventKind.ERROR.value, tag_field="kind"):
    """The terminal event of a request that failed: a typed error's wire form."""

    code: str
    message: str
    details: dict[str, Any] = msgspec.field(default_factory=dict)


Event = TokenEvent | ThinkingEvent | ToolCallEvent | DoneEvent | ErrorEvent
EVENT_DECODER: Final = msgspec.msgpack.Decoder(Event)


class WorkerPhase(StrEnum):
    IDLE = "idle"
    """No request admitted or queued."""
    PREFILLING = "prefilling"
    """At least one request is still feeding its prompt."""
    GENERATING = "generating"
    """Every admitted request is generating."""


class IdleEntry(msgspec.Struct, frozen=True, array_like=True):
    """The KV a finished request left in a sequence (SPEC M18), as status shows it.

    ``tokens``: positions it holds; ``cells``: KV cells clearing it would free
    (its own, not those it shares with other sequences); ``age_s``: seconds
    since its request ended; ``logits``: it keeps its prompt's last logits;
    ``saved``: a tier has published a row of exactly its KV, or its save is in
    flight (the next request that starts releases it, ``release_saved_idle``).
    """

    seq: int
    tokens: int
    cells: int
    age_s: float
    logits: bool = False
    saved: bool = False


class ReadBufferStats(msgspec.Struct, frozen=True):
    """The cache view's buffer for rows read by copy (``ram_file``, ``disk``):
    :mod:`llamad.model.read_buffer`."""

    capacity: int
    """Bytes of the buffer reads use now (0: none yet)."""
    largest_seen: int
    """The largest row (file bytes) the view has seen in a lookup or a save."""
    prepared: int
    """Buffers allocated ahead of the reads, off the loop."""
    grows_on_read: int
    """Reads that had to allocate (or grow) the buffer on their own path."""
    kind: str
    """``mmap`` (plain memory) or the host buffer type's name (``CUDA_Host``)."""


class WorkerStatus(msgspec.Struct, frozen=True):
    """A snapshot for SPEC M10: what routers read without waiting on the loop."""

    phase: WorkerPhase
    pending_len: int
    """Requests admitted to a sequence or queued for one."""
    queue_depth: int
    """Requests waiting for a sequence."""
    active_sequences: int
    free_sequences: int
    sessions: int
    kv_cells_used: int
    ticks: int
    last_cache_hit: CacheHitKind | None = None
    stored_logits_hits: int = 0
    """Requests since start whose first token was sampled from the logits
    their restored row or live KV keeps (SPEC M3's memoised primer): no
    prompt row was decoded before it."""
    idle_entries: tuple[IdleEntry, ...] = ()
    """Idle entries, least recently used first (SPEC M18), at most 64 of them."""
    idle_count: int = 0
    """Idle entries in all."""
    live_hits: int = 0
    """Requests since start that kept or shared live KV of another request."""
    idle_released: int = 0
    """Idle entries released since start because a tier holds their rows
    (``release_saved_idle``)."""
    idle_moved: int = 0
    """Idle entries moved since start from above freed cells down to the
    lowest free ones, their KV unchanged (``SequenceTable.compact_idle``)."""
    kv_cells_end: int = 0
    """One past the highest KV cell in use: the span every decode attends
    over (llama.cpp pads it to a multiple of 256). Above ``kv_cells_used``
    by the free cells below the highest one; ``-1`` when the backend cannot
    tell."""
    read_buffer: ReadBufferStats | None = None
    """The cache view's read buffer (``None``: no cache, or a stand-in)."""
    namespace: bytes | None = None
    """The 65-byte namespace header this worker's keys are made under, with no
    salt (``None``: unknown). A router hashes prompts under it
    (``llamad.kv_events.salted_header`` folds a tenant's salt in) to match
    the KV events (docs/internals/kv-events.md)."""
