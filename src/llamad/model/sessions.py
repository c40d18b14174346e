"""The session table: sequences pinned to a caller across requests (SPEC M2, M12).

A session is named by the caller (``session_id``) and created by its first
request. Between requests it keeps its *transcript* (every token it stands
for: prompts, tails and replies) and, while it is *live*, the sequence whose
KV holds the first ``committed`` of them. States, enforced here::

                 first request                      request ends
    (none) ───────────────────────► BUSY ───────────────────────► IDLE
                                    ▲  ▲                            │
                     next request   │  └────────── claim ───────────┤
                     (restored or   │                               │ park (sequence needed
                      re-prefilled) │                               ▼  elsewhere; evict save)
                                    └────────── claim ───────── PARKED

    end_session:   IDLE | PARKED → (none)       (BUSY: sticky_busy)
    reset_session: IDLE | PARKED → same state, empty transcript
    fork_session:  IDLE | PARKED → new IDLE (sequence copied) or PARKED

A second request on a BUSY session (running or still queued) is refused
with ``sticky_busy``. A parked session has no sequence: its next request
takes one like any other, restores the row its last save wrote (or the
longest prefix the cache has) and prefills the rest of the transcript, so
parking never loses a session, it only costs a restore.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from llamad.cache.key import Namespace
from llamad.errors import BadRequest, LlamadError, NoSession, SessionExists, StickyBusy

__all__ = ["Session", "SessionState", "SessionTable"]


class SessionState(StrEnum):
    BUSY = "busy"
    IDLE = "idle"
    PARKED = "parked"


@dataclass(slots=True, eq=False)
class Session:
    session_id: str
    salt: bytes | None
    transcript: list[int] = field(default_factory=list)
    committed: int = 0
    """Leading transcript tokens decoded into the session's KV (the caller's
    ``committed_tokens``); the rest is decoded at the head of the next request."""
    seq: int | None = None
    busy: str | None = None
    """The request running or queued on the session."""
    saved_key: bytes | None = None
    """Key of the row last saved from this session's KV, if any."""
    saved_len: int = 0
    namespace: Namespace | None = None
    """The namespace the session's KV was computed under (its last request's)."""
    last_used: float = 0.0

    @property
    def state(self) -> SessionState:
        if self.busy is not None:
            return SessionState.BUSY
        return SessionState.IDLE if self.seq is not None else SessionState.PARKED


def _not_busy(session: Session, op: str) -> None:
    if session.busy is not None:
        raise StickyBusy(
            f"session {session.session_id!r} is in use by request {session.busy!r}; "
            f"cannot {op} it now",
            details={"session_id": session.session_id},
        )


class SessionTable:
    """Every session of one worker, by id."""

    def __init__(self) -> None:
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def get(self, session_id: str) -> Session | None:
        return self._sessions.get(session_id)

    def known(self, session_id: str) -> Session:
        """The session, or :class:`~llamad.errors.NoSession`."""
        session = self._sessions.get(session_id)
        if session is None:
            raise NoSession(
                f"no session {session_id!r} on this worker", details={"session_id": session_id}
            )
        return session

    def claim(self, session_id: str, request_id: str, salt: bytes | None, now: float) -> Session:
        """Mark the session BUSY for ``request_id``, creating it on first use."""
        session = self._sessions.get(session_id)
        if session is None:
            session = Session(session_id, salt, last_used=now)
            self._sessions[session_id] = session
        _not_busy(session, "start another request on")
        if session.salt != salt:
            # A session's KV was computed under its tenant's salt; reusing it for
            # another would leak state across the namespace split (SPEC M17).
            raise BadRequest(
                f"session {session_id!r} was opened with another cache_salt",
                details={"field": "cache_salt", "session_id": session_id},
            )
        session.busy = request_id
        session.last_used = now
        return session

    def unclaim_new(self, session_id: str, request_id: str) -> None:
        """Undo :meth:`claim` for a request refused before it ran; a session the
        refused request created (nothing committed) disappears with it."""
        session = self._sessions.get(session_id)
        if session is None or session.busy != request_id:
            return
        session.busy = None
        if session.seq is None and not session.transcript:
            del self._sessions[session_id]

    def settle(self, session: Session, transcript: list[int], committed: int, now: float) -> None:
        """The request on ``session`` ended: BUSY → IDLE (or PARKED without a sequence)."""
        if not 0 <= committed <= len(transcript):
            raise LlamadError(f"committed {committed} outside the transcript")
        session.busy = None
        session.transcript = transcript
        session.committed = committed
        session.last_used = now

    def bind(self, session: Session, seq: int) -> None:
        if session.seq is not None:
            raise LlamadError(f"session {session.session_id!r} already holds a sequence")
        session.seq = seq

    def park(self, session: Session) -> int:
        """IDLE → PARKED; returns the sequence it gave up."""
        if session.state is not SessionState.IDLE or session.seq is None:
            raise LlamadError(f"only an idle live session can be parked ({session.state})")
        seq, session.seq = session.seq, None
        return seq

    def saved(self, session: Session, key: bytes, n_tokens: int) -> None:
        """A row of the session's first ``n_tokens`` tokens was saved under ``key``."""
        session.saved_key = key
        session.saved_len = n_tokens

    def end(self, session_id: str) -> Session:
        """Forget the session (IDLE | PARKED); the caller frees its sequence."""
        session = self.known(session_id)
        _not_busy(session, "end")
        del self._sessions[session_id]
        return session

    def reset(self, session_id: str) -> Session:
        """Empty the session's transcript (IDLE | PARKED); the caller clears its KV."""
        session = self.known(session_id)
        _not_busy(session, "reset")
        session.transcript = []
        session.committed = 0
        session.saved_key = None
        session.saved_len = 0
        return session

    def fork(self, source_id: str, new_id: str, now: float) -> tuple[Session, Session]:
        """A new session with ``source_id``'s transcript, PARKED until the caller
        binds it a sequence (and copies the KV into it)."""
        source = self.known(source_id)
        _not_busy(source, "fork")
        if new_id in self._sessions:
            raise SessionExists(
                f"session {new_id!r} already exists", details={"session_id": new_id}
            )
        fork = Session(
            new_id,
            source.salt,
            transcript=list(source.transcript),
            committed=source.committed,
            saved_key=source.saved_key,
            saved_len=source.saved_len,
            namespace=source.namespace,
            last_used=now,
        )
        self._sessions[new_id] = fork
        return source, fork

    def lru_idle(self) -> Session | None:
        """The least recently used IDLE session (the first to park), if any."""
        idle = [s for s in self._sessions.values() if s.state is SessionState.IDLE]
        return min(idle, key=lambda s: s.last_used, default=None)

    def values(self) -> list[Session]:
        return list(self._sessions.values())
