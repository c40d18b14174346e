"""Taking the saves the schedule calls for: pack, hand to the cache, remember (SPEC M5).

:mod:`llamad.model.savepoints` decides *when*; :class:`Saver` carries a save
out between ticks: it packs the sequence (a copy into a pre-faulted buffer,
the only part that holds up other sequences), builds the
:class:`~llamad.model.savepoints.SaveJob` and gives both to the
:class:`~llamad.model.cache_view_protocol.CacheView`, which writes synchronously
(evict, shutdown) or through the writer pool. It keeps the keys of finish
saves not yet reported published, so a next turn naming one as its
``parent_key`` waits for it instead of missing it, and the keys of rows
reported published, so an idle entry holding exactly one of them (or a row
whose finish save is in flight) may be released (:meth:`SequenceTable.release_saved
<llamad.model.slots.SequenceTable.release_saved>`). A save by a request that
kept its target's last logits (:attr:`ActiveRequest.prompt_logits`) carries
them when its tokens reach that position.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Final

import structlog

from llamad.cache.key import Namespace
from llamad.cache.kvc import SaveReason
from llamad.errors import LlamadError
from llamad.model.active import ActiveRequest
from llamad.model.backend import Backend
from llamad.model.cache_view_protocol import CacheView
from llamad.model.savepoints import SaveJob
from llamad.model.sessions import SessionTable
from llamad.model.slots import Slot

__all__ = ["Saver"]

log = structlog.get_logger("llamad.model")

RECENT_KEYS: Final = 4096
"""Keys of rows this worker wrote (or has a write of in flight) that it
remembers, so the same KV is not packed again for the same row."""
RECENT_S: Final = 60.0
"""How long a row counts as just written. Past it, the row may have been
evicted since: the same KV is saved again (a duplicate is only refused)."""


def _holds_saved_row(slot: Slot, namespace: Namespace) -> bool:
    """Whether the session's last save is exactly the slot's KV (the same length
    is not enough: a later request may have rewritten the tail)."""
    session = slot.session
    if session is None or session.saved_key is None or session.saved_len != len(slot.kv):
        return False
    return session.saved_key == namespace.key(slot.kv)


class Saver:
    """Executes save points for one core."""

    def __init__(
        self,
        backend: Backend,
        cache: CacheView,
        sessions: SessionTable,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.clock = clock
        self.backend = backend
        self.cache = cache
        self.sessions = sessions
        self.jobs: list[SaveJob] = []
        """Jobs handed to the cache since the core last reported them."""
        self.inflight_finish: dict[bytes, int] = {}
        """Finish saves handed to the writer and not yet reported: key → tokens."""
        self.recent: OrderedDict[bytes, float] = OrderedDict()
        """Rows this worker saved, or has a save of in flight (key → when),
        the most recent last."""
        self.published: OrderedDict[bytes, None] = OrderedDict()
        """Rows reported published (the most recent last): an idle entry
        holding exactly one of them can be restored from its tier instead."""
        self.skipped = 0
        """Saves not taken because the row was just written (status, tests)."""

    def save(
        self,
        slot: Slot,
        reason: SaveReason,
        namespace: Namespace,
        req: ActiveRequest | None,
        *,
        deadline: float | None = None,
    ) -> bool:
        """Save ``slot`` whole; True when written (sync) or accepted (async)."""
        tokens = tuple(slot.kv)
        session = slot.session
        logits = None if req is None else req.prompt_logits
        if logits is not None and logits.position >= len(tokens):
            logits = None
        key = namespace.key(tokens)
        if self._just_written(key):
            # This very row was written a moment ago (or its write is in
            # flight): live reuse hands a request KV whose finish row another
            # request just saved, and an exact repeat would pack the same
            # 47 MB again, on the loop, before its first token goes out.
            self.recent.move_to_end(key)
            self.skipped += 1
            self._saved(slot, req, key, len(tokens))
            return True
        job = SaveJob(
            reason=reason,
            key=key,
            namespace=namespace,
            tokens=tokens,
            seq=slot.seq,
            request_id=None if req is None else req.request_id,
            session_id=None if session is None else session.session_id,
            deadline=deadline,
            logits=logits,
        )
        try:
            state = self.backend.pack(slot.seq)
        except LlamadError as exc:
            log.warning("model.pack_failed", seq=slot.seq, reason=reason.name, error=repr(exc))
            return False
        try:
            ok = self.cache.save(job, state)
        except (LlamadError, OSError) as exc:
            # The cache owns the state once called; a failed save only costs a row.
            log.warning("model.save_failed", seq=slot.seq, reason=reason.name, error=repr(exc))
            ok = False
        self.jobs.append(job)
        if not ok:
            return False
        self._saved(slot, req, job.key, job.n_tokens)
        self.recent[job.key] = self.clock()
        self.recent.move_to_end(job.key)
        if len(self.recent) > RECENT_KEYS:
            self.recent.popitem(last=False)
        if reason is SaveReason.FINISH:
            self.inflight_finish[job.key] = job.n_tokens
        if job.sync:
            self._published(job.key)  # a synchronous save answered "published"
        return True

    def _just_written(self, key: bytes) -> bool:
        written = self.recent.get(key)
        if written is None:
            return False
        if key in self.inflight_finish or self.clock() - written < RECENT_S:
            return True
        del self.recent[key]
        return False

    def forget_written(self, key: bytes) -> None:
        """``key``'s row turned out missing or damaged: save it again next time."""
        self.recent.pop(key, None)
        self.published.pop(key, None)

    def row_read(self, key: bytes) -> None:
        """``key``'s row was just restored: the cache has it published, whoever
        wrote it (an idle entry left holding exactly it may be released)."""
        self._published(key)

    def holds_row(self, key: bytes) -> bool:
        """Whether ``key``'s row was reported published or its finish save is in
        flight: the KV it holds can be read back from its tier. A save in flight
        has packed its copy already, and a lookup that matches it waits for it
        rather than run cold (SPEC M18); only a save that fails afterwards
        (quota, disk) costs that prompt's next request its reuse."""
        return key in self.published or key in self.inflight_finish

    def _published(self, key: bytes) -> None:
        self.published[key] = None
        self.published.move_to_end(key)
        if len(self.published) > RECENT_KEYS:
            self.published.popitem(last=False)

    def _saved(self, slot: Slot, req: ActiveRequest | None, key: bytes, n_tokens: int) -> None:
        """The row of ``slot``'s first ``n_tokens`` tokens exists (or is being written)."""
        if req is not None:
            req.saved_max = max(req.saved_max, n_tokens)
            if req.schedule is not None:
                req.schedule.record(n_tokens)
        if slot.session is not None:
            self.sessions.saved(slot.session, key, n_tokens)

    def save_due(self, req: ActiveRequest, slot: Slot) -> None:
        """The cold or continued save the schedule calls for at the slot's length."""
        if req.schedule is None:
            return
        reason = req.schedule.due(len(slot.kv))
        if reason is not None:
            self.save(slot, reason, req.namespace, req)

    def finish(self, req: ActiveRequest, slot: Slot, *, allowed: bool) -> None:
        """The finish save of ``req`` (``allowed=False`` at shutdown, which saved
        synchronously already); sets ``req.finish_key`` when the row exists."""
        n = len(slot.kv)
        if n == 0 or req.schedule is None:
            return
        key = req.namespace.key(slot.kv)
        if n in req.schedule.saved_at or (
            allowed
            and req.schedule.finish_due(n, prefill_only=req.params.prefill_only)
            and self.save(slot, SaveReason.FINISH, req.namespace, req)
        ):
            req.finish_key = key
            slot.saved_key = key

    def evict(self, slot: Slot, deadline: float) -> None:
        """Save an idle session's sequence before it is taken (skipped when the
        session's last save already holds exactly its KV)."""
        session = slot.session
        if session is None or session.namespace is None or not slot.kv:
            return
        if _holds_saved_row(slot, session.namespace):
            return
        self.save(slot, SaveReason.EVICT, session.namespace, None, deadline=deadline)

    def shutdown(self, slots: Sequence[Slot], deadline: float, clock: Callable[[], float]) -> None:
        """Save every live sequence synchronously, all by ``deadline``."""
        for slot in slots:
            owner, session = slot.owner, slot.session
            if owner is not None and owner.resolution is not None:
                namespace: Namespace | None = owner.namespace
            else:
                namespace = None if session is None else session.namespace
            if not slot.kv or namespace is None or _holds_saved_row(slot, namespace):
                continue
            if clock() >= deadline:
                log.warning("model.shutdown_save_skipped", seq=slot.seq, tokens=len(slot.kv))
                continue
            self.save(slot, SaveReason.SHUTDOWN, namespace, owner, deadline=deadline)

    def done(self, key: bytes, published: bool) -> None:
        """An asynchronous save ended; a failed one no longer counts as a session's row."""
        self.inflight_finish.pop(key, None)
        if published:
            self._published(key)
        else:
            self.recent.pop(key, None)
            self.published.pop(key, None)
            for session in self.sessions.values():
                if session.saved_key == key:
                    session.saved_key, session.saved_len = None, 0

    def take_jobs(self) -> list[SaveJob]:
        jobs, self.jobs = self.jobs, []
        return jobs
