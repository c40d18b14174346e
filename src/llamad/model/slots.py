"""The context's sequences: what each one's KV holds, and who holds it.

:class:`SequenceTable` is the one owner of the answer to "which sequence is
whose": the free pool, the sequences requests run on, the ones sessions pin.
It binds a request to a sequence, gives sequences back when requests end,
parks idle sessions when a sequence is needed elsewhere, and carries out the
session operations that touch KV (end, reset, fork).

With ``kv_unified`` every sequence draws its KV cells from one pool of
``n_ctx``; the table counts a cell per token a sequence holds (a forked
sequence shares its prefix's cells in llama.cpp, so the count errs high,
never low).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from llamad.model.admission import SequencePool

if TYPE_CHECKING:
    from llamad.model.active import ActiveRequest
    from llamad.model.backend import Backend
    from llamad.model.saver import Saver
    from llamad.model.sessions import Session, SessionTable

__all__ = ["SequenceTable", "Slot", "cells_used"]

log = structlog.get_logger("llamad.model")


@dataclass(eq=False)
class Slot:
    """Sequence ``seq``: ``kv`` is what its KV holds, position by position.

    ``owner`` is the request running on it; ``session`` the session pinning
    it (both may be set: a session's request runs on the session's sequence).
    """

    seq: int
    kv: list[int] = field(default_factory=list)
    owner: ActiveRequest | None = None
    session: Session | None = None


def cells_used(slots: Sequence[Slot]) -> int:
    return sum(len(slot.kv) for slot in slots)


class SequenceTable:
    """The sequences of one context, the free pool and the sessions pinning some."""

    def __init__(
        self, n_seq_max: int, backend: Backend, sessions: SessionTable, saver: Saver
    ) -> None:
        self.slots = [Slot(i) for i in range(n_seq_max)]
        self.pool = SequencePool(n_seq_max)
        self.backend = backend
        self.sessions = sessions
        self.saver = saver

    def __getitem__(self, seq: int) -> Slot:
        return self.slots[seq]

    @property
    def cells_used(self) -> int:
        return cells_used(self.slots)

    def newest_holder(self, running: Sequence[ActiveRequest]) -> ActiveRequest | None:
        """The most recently submitted of ``running`` that holds KV cells: the one
        to yield when the cells run out, so that older requests go on."""
        holders = [r for r in running if r.seq is not None and self.slots[r.seq].kv]
        return max(holders, key=lambda r: r.order, default=None)

    def clear(self, slot: Slot) -> None:
        """Empty the sequence and detach it from everyone."""
        if slot.kv:
            self.backend.seq_truncate(slot.seq, 0)
        slot.kv = []
        slot.session = None
        slot.owner = None

    def bind(self, req: ActiveRequest, seq: int) -> None:
        """``req`` runs on ``seq`` (its session's, or one taken from the pool)."""
        slot = self.slots[seq]
        slot.owner = req
        req.seq = seq
        session = req.session
        if session is not None and session.seq is None:
            self.sessions.bind(session, seq)
            slot.session = session

    def park_idle_session(self, evict_deadline: float) -> bool:
        """Give the least recently used idle session's sequence back to the pool,
        after an evict save of its KV; False when no session is idle."""
        session = self.sessions.lru_idle()
        if session is None or session.seq is None:
            return False
        slot = self.slots[session.seq]
        self.saver.evict(slot, evict_deadline)
        self.clear(slot)
        self.pool.release(self.sessions.park(session))
        log.info("model.session_parked", session_id=session.session_id, seq=slot.seq)
        return True

    def release_finished(self, req: ActiveRequest, now: float) -> int:
        """``req`` ended normally: settle its session or free its sequence.
        Returns the committed token count its result reports."""
        slot = None if req.seq is None else self.slots[req.seq]
        committed = len(slot.kv) if slot is not None and req.resolution is not None else 0
        session = req.session
        if session is None:
            if slot is not None:
                self.clear(slot)
                self.pool.release(slot.seq)
            return committed
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
        return committed

    def release_failed(self, req: ActiveRequest, now: float) -> None:
        """``req`` failed: its KV is dropped (a failed decode may have left it
        anywhere); a session keeps its transcript and is parked."""
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

    # -- session operations (SPEC M12) ----------------------------------------------------

    def end_session(self, session_id: str) -> None:
        session = self.sessions.end(session_id)
        if session.seq is not None:
            self.clear(self.slots[session.seq])
            self.pool.release(session.seq)

    def reset_session(self, session_id: str) -> None:
        session = self.sessions.reset(session_id)
        if session.seq is not None:
            slot = self.slots[session.seq]
            if slot.kv:
                self.backend.seq_truncate(slot.seq, 0)
            slot.kv = []

    def fork_session(self, source_id: str, new_id: str, now: float) -> bool:
        source, fork = self.sessions.fork(source_id, new_id, now)
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
