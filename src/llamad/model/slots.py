"""The context's sequences: what each one's KV holds, and who holds it.

:class:`SequenceTable` is the one owner of the answer to "which sequence is
whose": the free pool, the sequences requests run on, the ones sessions pin,
and the **idle entries** (SPEC M18): a request that ends leaves its KV where
it is, with the tokens it holds, the namespace it was computed under and the
logits of its prompt's last position, so the next request that shares a
prefix with it reuses those cells instead of restoring or prefilling them.
An idle entry's sequence is free: the next request that needs a sequence
takes an empty one first, else the least recently used idle entry's, and
whatever the entry holds that the new request can use it keeps in place.

Every change to a sequence's KV goes through this table (:meth:`extend`,
:meth:`truncate`, :meth:`share`, :meth:`restored`, :meth:`clear`), which
carries it out on the backend and keeps ``Slot.kv`` (the tokens, position
by position) and ``Slot.cells`` (which KV cells, :mod:`llamad.model.cells`)
in step with it. With ``kv_unified`` every sequence draws cells from one
pool of ``n_ctx``; a shared prefix (``seq_cp``) is counted once.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

import structlog

from llamad.cache.key import Namespace
from llamad.cache.kvc import KvcLogits
from llamad.errors import LlamadError
from llamad.model.admission import SequencePool
from llamad.model.cells import CellRuns, cells_in_use, cells_only_in

if TYPE_CHECKING:
    from llamad.model.active import ActiveRequest
    from llamad.model.backend import Backend
    from llamad.model.saver import Saver
    from llamad.model.sessions import Session, SessionTable

__all__ = ["COMPACT_GAP_CELLS", "SequenceTable", "Slot", "cells_used"]

log = structlog.get_logger("llamad.model")

COMPACT_GAP_CELLS: Final = 256
"""Idle entries are moved down (:meth:`SequenceTable.compact_idle`) only
while the cells in use end at least this far above the count of cells in
use: llama.cpp pads the span a decode attends over to a multiple of 256
cells, so a smaller gap may cost nothing."""


@dataclass(eq=False)
class Slot:
    """Sequence ``seq``: ``kv`` is what its KV holds, position by position.

    ``owner`` is the request running on it; ``session`` the session pinning
    it (both may be set: a session's request runs on the session's sequence).
    With neither and some KV, the slot is an **idle entry**: what the last
    request on it left, reusable by the next.

    ``namespace``: the namespace the KV was computed under (``None`` when
    unknown: never reused). ``logits``: the logits after one of its
    positions (an idle entry's prompt's last), valid while ``kv`` keeps that
    position. ``idle_since``: when it became an idle entry (its LRU stamp).
    """

    seq: int
    kv: list[int] = field(default_factory=list)
    owner: ActiveRequest | None = None
    session: Session | None = None
    cells: CellRuns = field(default_factory=CellRuns)
    namespace: Namespace | None = None
    logits: KvcLogits | None = None
    idle_since: float = 0.0
    saved_key: bytes | None = None
    """Key of a row holding exactly ``kv`` (its finish save), if one was written."""

    @property
    def idle(self) -> bool:
        """An idle entry: KV that no request or session holds."""
        return self.owner is None and self.session is None and bool(self.kv)

    def logits_at(self, position: int) -> KvcLogits | None:
        """The kept logits if they are those after ``position``, else ``None``."""
        logits = self.logits
        if logits is None or logits.position != position or position >= len(self.kv):
            return None
        return logits


def cells_used(slots: Sequence[Slot]) -> int:
    """KV cells in use: a cell shared by several sequences counts once."""
    return cells_in_use(slot.cells for slot in slots)


class SequenceTable:
    """The sequences of one context, the free pool and the sessions pinning some."""

    def __init__(
        self,
        n_seq_max: int,
        backend: Backend,
        sessions: SessionTable,
        saver: Saver,
        *,
        keep_idle: bool = True,
    ) -> None:
        self.slots = [Slot(i) for i in range(n_seq_max)]
        self.pool = SequencePool(n_seq_max)
        self.backend = backend
        self.sessions = sessions
        self.saver = saver
        self.keep_idle = keep_idle
        """Whether a finished request's KV stays as an idle entry (SPEC M18)."""
        self.released = 0
        """Idle entries released because a tier holds their row (status)."""
        self.compacted = 0
        """Idle entries moved down to lower cells (:meth:`compact_idle`)."""

    def __getitem__(self, seq: int) -> Slot:
        return self.slots[seq]

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots)

    @property
    def cells_used(self) -> int:
        return cells_used(self.slots)

    def gapped(self) -> bool:
        """Whether the cells in use end :data:`COMPACT_GAP_CELLS` or more above
        their count (what :meth:`compact_idle` would lower)."""
        end = self.backend.cell_end(-1)
        return end >= 0 and end - self.cells_used >= COMPACT_GAP_CELLS

    def cells_only_in(self, slot: Slot) -> int:
        """Cells that clearing ``slot`` would free (those no other sequence shares)."""
        return cells_only_in(slot.cells, (s.cells for s in self.slots if s is not slot))

    def idle_entries(self) -> list[Slot]:
        """Idle entries, least recently used first."""
        return sorted((s for s in self.slots if s.idle), key=lambda s: (s.idle_since, s.seq))

    def newest_holder(self, running: Sequence[ActiveRequest]) -> ActiveRequest | None:
        """The most recently submitted of ``running`` that holds KV cells: the one
        to yield when the cells run out, so that older requests go on."""
        holders = [r for r in running if r.seq is not None and self.slots[r.seq].kv]
        return max(holders, key=lambda r: r.order, default=None)

    # -- KV operations: the backend and the table in step --------------------------------

    def extend(self, slot: Slot, tokens: Sequence[int]) -> None:
        """``tokens`` were decoded into ``slot``'s sequence at its next positions."""
        slot.kv.extend(tokens)
        slot.cells.extend(len(tokens))
        slot.saved_key = None  # the KV is longer than any row saved of it before

    def truncate(self, slot: Slot, keep: int) -> None:
        """Drop positions ``keep ..`` of the sequence (nothing when it holds no more)."""
        if len(slot.kv) <= keep:
            return
        self.backend.seq_truncate(slot.seq, keep)
        del slot.kv[keep:]
        slot.cells.truncate(keep)
        if slot.logits is not None and slot.logits.position >= keep:
            slot.logits = None
        slot.saved_key = None

    def clear(self, slot: Slot) -> None:
        """Empty the sequence's KV (its owner and session stay)."""
        if slot.kv:
            self.backend.seq_truncate(slot.seq, 0)
        slot.kv = []
        slot.cells = CellRuns()
        slot.logits = None
        slot.saved_key = None

    def forget(self, slot: Slot) -> None:
        """The sequence's KV is unknown (a failed decode or restore): drop it whole."""
        self.backend.seq_truncate(slot.seq, 0)
        slot.kv = []
        slot.cells = CellRuns()
        slot.logits = None
        slot.saved_key = None

    def share(self, src: Slot, dst: Slot, n: int) -> None:
        """``dst`` (emptied first) shares ``src``'s first ``n`` positions' cells:
        ``seq_cp``, which in a unified KV copies no bytes."""
        self.clear(dst)
        if n <= 0:
            return
        self.backend.seq_copy(src.seq, dst.seq, n)
        dst.kv = src.kv[:n]
        dst.cells = src.cells.shared(n)

    def restored(self, slot: Slot, tokens: Sequence[int]) -> None:
        """A row of ``tokens`` was unpacked into the sequence (fresh cells)."""
        slot.kv = list(tokens)
        slot.cells.replace(len(tokens))
        slot.logits = None
        slot.saved_key = None

    # -- binding and giving back ------------------------------------------------------------

    def acquire(self) -> int | None:
        """A free sequence for a new request: an empty one first (the lowest),
        else the least recently used idle entry's, whose KV stays in place for
        the request to keep what it can use. ``None`` when every sequence is held."""
        free = self.pool.free
        if not free:
            return None
        empty = [seq for seq in free if not self.slots[seq].kv]
        seq = min(empty) if empty else min(free, key=lambda s: (self.slots[s].idle_since, s))
        self.pool.take(seq)
        return seq

    def drop_idle(self, keep: Slot | None = None) -> bool:
        """Clear the least recently used idle entry (other than ``keep``), freeing
        its cells; False when there is none."""
        for slot in self.idle_entries():
            if slot is not keep:
                log.debug("model.idle_entry_dropped", seq=slot.seq, tokens=len(slot.kv))
                self.clear(slot)
                slot.namespace = None
                return True
        return False

    def any_saved_idle(self) -> bool:
        """Whether an idle entry's KV was saved as a row (what
        :meth:`release_saved` may release)."""
        return any(s.idle and s.saved_key is not None for s in self.slots)

    def release_saved(self, keep: Collection[Slot]) -> int:
        """Clear every idle entry (but those in ``keep``) whose KV is exactly a
        row a tier has published or is writing; returns how many.

        In a unified KV every decode attends over the cells up to the highest
        used one, an idle entry's included (~9 % slower beside 2,000 cells:
        docs/internals/model-worker.md, "What idle entries cost"). An entry
        whose row is published, or whose finish save is in flight (its copy
        packed already: the next lookup waits for it), costs the next request
        that wants it only a restore (~7 ms for 2,048 tokens from ``ram``), so
        it goes. Waiting for the save to land would keep the entry's cells
        for the whole of the starting request: the cells it places go above
        them, and freeing those below later does not lower the span every
        decode attends over. One never saved, or whose save failed, is the
        only copy of its KV and stays."""
        released = 0
        for slot in self.idle_entries():
            key = slot.saved_key
            if slot in keep or key is None or not self.saver.holds_row(key):
                continue
            log.debug("model.idle_entry_released", seq=slot.seq, tokens=len(slot.kv), key=key.hex())
            self.clear(slot)
            slot.namespace = None
            released += 1
        self.released += released
        return released

    def compact_idle(self, keep: Collection[Slot] = ()) -> None:
        """Move idle entries left above freed cells down to the lowest free
        ones (:attr:`compacted` counts them), but none of ``keep``.

        In a unified KV every decode attends over the cells up to the
        highest one in use, whichever sequences hold the cells below it. A
        short entry that was placed while a long one held the cells beneath
        (it ran beside it) stays up there once the long one is released or
        ends, and every later decode pays for the freed cells below it: a
        512-token prefill beside a 3,000-cell span ran at 427 tok/s against
        478 over its own cells (docs/internals/model-worker.md, "Moving idle
        entries down"). While the cells in use end :data:`COMPACT_GAP_CELLS`
        or more above their count, the entry holding the highest cell is
        packed, cleared and unpacked (llama.cpp gives an unpacked state the
        lowest free cells, in position order), with the idle entries that
        share its cells (a chat's earlier turns: each a prefix of it, shared
        by ``seq_cp``), which share them again from the moved copy. Nothing
        moves while a running request or a session holds the highest cell or
        shares the entry's cells, or while an entry sharing them holds cells
        of its own: moving would not lower the span, or would undo sharing.
        The KV's values and their order are the same before and after, and
        so is everything the table keeps of the entries. Entries that fail
        to come back are dropped: they were idle, never what a request holds.

        ``keep``: the entries starting requests are about to reuse. Nothing
        moves while one of them holds the highest cell or shares its cells: a
        move packs and unpacks the entry (about a restore's time), which would
        land in that request's first token, and once the request holds the
        entry it runs where it is (a back-to-back repeat of 1,024 tokens
        waited 4-9 ms for its own entry's move)."""
        backend = self.backend
        while self.gapped():
            end = backend.cell_end(-1)
            holders = [s for s in self.slots if s.kv and backend.cell_end(s.seq) == end]
            top = max(holders, key=lambda s: len(s.kv), default=None)
            group = None if top is None else self._sharers(top)
            if top is None or group is None or any(s in keep for s in (top, *group)):
                return
            if not self._relocate(top, group) or backend.cell_end(-1) >= end:
                return
            self.compacted += 1 + len(group)

    def _sharers(self, top: Slot) -> list[Slot] | None:
        """The other sequences sharing ``top``'s cells, if ``top`` and all of
        them are idle entries and each holds only cells of ``top``'s (its KV
        a prefix of ``top``'s); else None."""
        if not top.idle:
            return None
        ends = {id(block): end for block, end in top.cells.runs}
        group: list[Slot] = []
        for slot in self.slots:
            runs = slot.cells.runs
            if slot is top or not any(id(block) in ends for block, _ in runs):
                continue
            inside = all(end <= ends.get(id(block), -1) for block, end in runs)
            if not slot.idle or not inside or slot.kv != top.kv[: len(slot.kv)]:
                return None
            group.append(slot)
        return group

    def _relocate(self, top: Slot, group: Sequence[Slot]) -> bool:
        """Pack ``top``'s sequence, clear it and ``group``'s, unpack it, and
        let ``group`` share its prefixes again. False when that failed:
        nothing changed if the pack failed, else the entries are dropped."""
        backend = self.backend
        try:
            state = backend.pack(top.seq)
        except LlamadError as exc:
            log.warning("model.idle_entry_not_moved", seq=top.seq, error=repr(exc))
            return False
        payload = state.view()
        try:
            for slot in group:
                backend.seq_truncate(slot.seq, 0)
            backend.seq_truncate(top.seq, 0)
            backend.unpack(top.seq, payload)
            top.cells.replace(len(top.kv))
            for slot in group:
                backend.seq_copy(top.seq, slot.seq, len(slot.kv))
                slot.cells = top.cells.shared(len(slot.kv))
        except LlamadError as exc:
            log.warning("model.idle_entry_lost", seq=top.seq, error=repr(exc))
            for slot in (top, *group):
                self.forget(slot)
                slot.namespace = None
            return False
        finally:
            payload.release()
            state.release()
        log.debug("model.idle_entry_moved", seq=top.seq, tokens=len(top.kv), sharers=len(group))
        return True

    def bind(self, req: ActiveRequest, seq: int) -> None:
        """``req`` runs on ``seq`` (its session's, or one taken from the pool)."""
        slot = self.slots[seq]
        slot.owner = req
        req.seq = seq
        session = req.session
        # A live session's sequence holds its KV; any other sequence holds
        # nothing of the session's (at most an idle entry's KV).
        req.session_kv = session is not None and session.seq == seq
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
        slot.session = None
        slot.owner = None
        self.pool.release(self.sessions.park(session))
        log.info("model.session_parked", session_id=session.session_id, seq=slot.seq)
        return True

    def release_finished(self, req: ActiveRequest, now: float) -> int:
        """``req`` ended normally: settle its session, or leave its KV as an idle
        entry (or clear it) and free its sequence. Returns the committed token
        count its result reports."""
        slot = None if req.seq is None else self.slots[req.seq]
        committed = len(slot.kv) if slot is not None and req.resolution is not None else 0
        session = req.session
        if session is None:
            if slot is not None:
                slot.owner = None
                if req.resolution is None:
                    # It never ran (cancelled while queued for a leader or a
                    # save): whatever idle entry its sequence held is intact.
                    pass
                elif self.keep_idle and slot.kv:
                    slot.namespace = req.namespace
                    slot.logits = req.prompt_logits
                    slot.idle_since = now
                    if slot.logits is not None and slot.logits.position >= len(slot.kv):
                        slot.logits = None
                else:
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
            slot.namespace = session.namespace
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
            self.forget(slot)
            slot.owner = None
            slot.namespace = None
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
            slot = self.slots[session.seq]
            self.clear(slot)
            slot.session = None
            slot.namespace = None
            self.pool.release(session.seq)

    def reset_session(self, session_id: str) -> None:
        session = self.sessions.reset(session_id)
        if session.seq is not None:
            self.clear(self.slots[session.seq])

    def fork_session(self, source_id: str, new_id: str, now: float) -> bool:
        source, fork = self.sessions.fork(source_id, new_id, now)
        if source.seq is None or not self.slots[source.seq].kv:
            return False
        seq = self.acquire()
        if seq is None:
            return False
        src, slot = self.slots[source.seq], self.slots[seq]
        self.share(src, slot, len(src.kv))
        slot.session = fork
        slot.namespace = src.namespace
        self.sessions.bind(fork, seq)
        return True
