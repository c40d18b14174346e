"""What a worker looks like from outside, without a tick (SPEC M10).

Read-only views of a :class:`~llamad.model.core.WorkerCore`: the
:class:`~llamad.model.results.WorkerStatus` snapshot the shell publishes for
routers (phase, pending_len, queue_depth, sequences, last cache hit), and the
two answers the shell's loop needs to decide how long it may block on its
socket (:func:`has_work`, :func:`next_wakeup`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad.errors import LlamadError
from llamad.model.active import Phase
from llamad.model.results import IdleEntry, WorkerPhase, WorkerStatus

if TYPE_CHECKING:
    from llamad.model.core import WorkerCore

__all__ = ["IDLE_SHOWN", "has_work", "next_wakeup", "status_of"]

IDLE_SHOWN = 64
"""Idle entries a snapshot lists (the least recently used first); the status
board's slot is 8 KiB, and a context may have thousands of sequences."""


def status_of(core: WorkerCore) -> WorkerStatus:
    requests = core.requests.values()
    running = [r for r in requests if r.phase is not Phase.QUEUED]
    if not core.requests:
        phase = WorkerPhase.IDLE
    elif running and all(r.generating for r in running):
        phase = WorkerPhase.GENERATING
    else:
        phase = WorkerPhase.PREFILLING
    now = core.clock()
    entries = core.seqs.idle_entries()
    idle = tuple(
        IdleEntry(
            seq=slot.seq,
            tokens=len(slot.kv),
            cells=core.seqs.cells_only_in(slot),
            age_s=round(max(0.0, now - slot.idle_since), 3),
            logits=slot.logits is not None,
            saved=slot.saved_key is not None and core.saver.holds_row(slot.saved_key),
        )
        for slot in entries[:IDLE_SHOWN]
    )
    return WorkerStatus(
        phase=phase,
        pending_len=len(core.requests),
        queue_depth=len(core.queue),
        active_sequences=len(running),
        free_sequences=len(core.pool),
        sessions=len(core.sessions),
        kv_cells_used=core.cells_used,
        kv_cells_end=_cells_end(core),
        ticks=core.ticks,
        last_cache_hit=core.last_cache_hit,
        stored_logits_hits=core.stored_logits_hits,
        idle_entries=idle,
        idle_count=len(entries),
        live_hits=core.live_hits,
        idle_released=core.seqs.released,
        idle_moved=core.seqs.compacted,
        read_buffer=core.cache.read_buffer(),
        namespace=_namespace_header(core),
    )


def _cells_end(core: WorkerCore) -> int:
    try:
        return core.backend.cell_end(-1)
    except LlamadError:
        return -1  # a closed context (the worker is stopping)


def _namespace_header(core: WorkerCore) -> bytes | None:
    try:
        return core.cache.namespace(None).header()
    except LlamadError:
        # A closed context (the worker is stopping) has no namespace to show.
        return None


def has_work(core: WorkerCore) -> bool:
    """Whether a step would do anything now (else the shell may block until a
    message arrives or :func:`next_wakeup`)."""
    if core.pending_events:
        return True
    if any(
        r.cancel_requested
        or r.phase in (Phase.ADMITTED, Phase.RUNNING)
        or r.following is not None
        # Waiting for a save in flight: the next step asks cache-meta again
        # (and, with nothing else running, waits there for it).
        or (r.phase is Phase.WAITING and r.inflight_until is not None)
        for r in core.requests.values()
    ):
        return True
    return bool(core.queue) and (len(core.pool) > 0 or core.sessions.lru_idle() is not None)


def next_wakeup(core: WorkerCore) -> float | None:
    """The earliest clock time a waiting request must be looked at again."""
    waits = [r.wait_until for r in core.requests.values() if r.wait_until is not None]
    return min(waits, default=None)
