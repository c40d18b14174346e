"""Which daemon serves a request, for a client of several (SPEC X3; no I/O).

A ``Client(endpoints=[...])`` holds one :class:`Router`. For each request it
asks :meth:`Router.order` for the daemons to try, best first, and tells the
router what happened (:meth:`Router.started`, :meth:`Router.ended`,
:meth:`Router.failed`, :meth:`Router.reached`); the clients do the waiting.
The policy, in order:

1. **sessions stay where they live**: a request naming a ``session_id`` the
   router has seen goes to that daemon only (its sequence and transcript are
   there; another daemon would answer ``no_session``);
2. **the longest cached prefix**: ``prefix`` gives, per daemon, how many of the
   prompt's leading blocks its KV events say it holds; the most wins;
3. **the least loaded**: the model's requests admitted or queued on the daemon
   (``pending_len`` of its last status read, :meth:`Router.loaded`) plus the
   requests this client started there since that read;
4. ties go to the configured order, rotated by the request's ``spread_key``
   (a stable hash of the prompt's start): distinct prompts spread over the
   daemons, and the same prompt start goes to the same daemon even before
   its blocks are announced.

A daemon that failed (:meth:`Router.failed`: unreachable, or it died under a
request) is *down*: it is left out until its backoff ends (``backoff_s``,
doubling per failure up to ``max_backoff_s``), then tried again; one that
answers is up again with its backoff reset. When every daemon is down they
are all tried anyway, soonest-back first: a request is never refused only
because the router gave up on everyone.

Thread-safe: one router serves every thread of a blocking client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

__all__ = ["LOAD_TTL_S", "SPREADS", "Router", "Spread", "spread"]

LOAD_TTL_S: Final = 0.5
"""How old a daemon's status read may be before a request reads it again."""
BACKOFF_S: Final = 0.5
MAX_BACKOFF_S: Final = 30.0


@dataclass(slots=True)
class _Daemon:
    endpoint: str
    rank: int
    """Its place in the configured order (ties)."""
    pending: dict[str, int] = field(default_factory=dict)
    """Model id -> requests admitted or queued, at the last status read."""
    read_at: float | None = None
    own: int = 0
    """Requests this client started here since the last status read and still running."""
    running: int = 0
    """Requests this client has running here."""
    down_until: float = 0.0
    backoff: float = 0.0
    failures: int = 0
    """Failures in a row (0 once it answers)."""


class Router:
    """The policy of the module doc over ``endpoints`` (at least two)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        *,
        load_ttl_s: float = LOAD_TTL_S,
        backoff_s: float = BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if len(set(endpoints)) != len(endpoints) or not endpoints:
            raise ValueError(f"endpoints must be distinct and not empty, got {list(endpoints)}")
        self.endpoints = tuple(endpoints)
        self._daemons = {e: _Daemon(e, i) for i, e in enumerate(endpoints)}
        self._sessions: dict[str, str] = {}
        self._load_ttl = load_ttl_s
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._clock = clock
        self._lock = threading.Lock()

    # -- the choice ----------------------------------------------------------

    def order(
        self,
        model_id: str,
        *,
        prefix: Mapping[str, int] | None = None,
        session_id: str | None = None,
        spread_key: int = 0,
    ) -> list[str]:
        """The daemons to try for a request on ``model_id``, best first (the
        module doc's policy); only the session's daemon for a known session."""
        with self._lock:
            if session_id is not None and session_id in self._sessions:
                return [self._sessions[session_id]]
            now = self._clock()
            up = [d for d in self._daemons.values() if d.down_until <= now]
            if not up:
                # Everyone is down: try them all, soonest back first.
                return [
                    d.endpoint
                    for d in sorted(self._daemons.values(), key=lambda d: (d.down_until, d.rank))
                ]
            held = prefix or {}
            n = len(self._daemons)

            def score(d: _Daemon) -> tuple[int, int, int]:
                load = d.pending.get(model_id, 0) + d.own
                return (-held.get(d.endpoint, 0), load, (d.rank - spread_key) % n)

            return [d.endpoint for d in sorted(up, key=score)]

    def stale(self) -> list[str]:
        """The daemons (not down) whose status read is older than the TTL: a
        request reads them before :meth:`order`."""
        with self._lock:
            now = self._clock()
            return [
                d.endpoint
                for d in self._daemons.values()
                if d.down_until <= now and (d.read_at is None or now - d.read_at > self._load_ttl)
            ]

    def expire(self) -> None:
        """Forget every status read: the next request reads each daemon's load
        again (for a caller that knows the load just changed)."""
        with self._lock:
            for d in self._daemons.values():
                d.read_at = None

    # -- what happened ---------------------------------------------------------

    def loaded(self, endpoint: str, pending: Mapping[str, int]) -> None:
        """A status read of ``endpoint``: each model's requests admitted or queued."""
        with self._lock:
            d = self._daemons[endpoint]
            d.pending = dict(pending)
            d.read_at = self._clock()
            d.own = 0  # the read counts this client's running requests already
            self._up(d)

    def started(self, endpoint: str) -> None:
        """A request was sent to ``endpoint``."""
        with self._lock:
            d = self._daemons[endpoint]
            d.own += 1
            d.running += 1
            self._up(d)

    def ended(self, endpoint: str) -> None:
        """A request :meth:`started` on ``endpoint`` ended (any way)."""
        with self._lock:
            d = self._daemons[endpoint]
            d.running = max(0, d.running - 1)
            d.own = min(d.own, d.running)

    def reached(self, endpoint: str) -> None:
        """``endpoint`` answered: it is up."""
        with self._lock:
            self._up(self._daemons[endpoint])

    def failed(self, endpoint: str) -> None:
        """``endpoint`` was unreachable, or died under a request: down for its
        backoff (doubled at each failure in a row)."""
        with self._lock:
            d = self._daemons[endpoint]
            d.backoff = min(self._max_backoff, d.backoff * 2 if d.backoff else self._backoff)
            d.down_until = self._clock() + d.backoff
            d.read_at = None
            d.failures += 1

    def live(self) -> list[str]:
        """The daemons not down, in the configured order (all of them, soonest
        back first, when every one is down)."""
        with self._lock:
            now = self._clock()
            up = [d.endpoint for d in self._daemons.values() if d.down_until <= now]
            if up:
                return up
            return [
                d.endpoint
                for d in sorted(self._daemons.values(), key=lambda d: (d.down_until, d.rank))
            ]

    def running(self, endpoint: str) -> int:
        """Requests this client has running on ``endpoint``."""
        with self._lock:
            return self._daemons[endpoint].running

    def failures(self, endpoint: str) -> int:
        """How many times in a row ``endpoint`` failed (0: it answers)."""
        with self._lock:
            return self._daemons[endpoint].failures

    def is_down(self, endpoint: str) -> bool:
        with self._lock:
            return self._daemons[endpoint].down_until > self._clock()

    # -- sessions --------------------------------------------------------------

    def session(self, session_id: str) -> str | None:
        """The daemon holding ``session_id``, if this client has used it."""
        with self._lock:
            return self._sessions.get(session_id)

    def bind(self, session_id: str, endpoint: str) -> None:
        """``session_id`` lives on ``endpoint`` from now on."""
        with self._lock:
            self._sessions[session_id] = endpoint

    def unbind(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    @staticmethod
    def _up(d: _Daemon) -> None:
        d.down_until = 0.0
        d.backoff = 0.0
        d.failures = 0


# -- which daemons an op goes to ------------------------------------------------


class Spread(StrEnum):
    """Where a client of several daemons sends one op."""

    ANY = "any"
    """A request on a model: one daemon, by the policy (affinity, load), the
    next one when the first cannot take it."""
    ALL = "all"
    """A change of what the daemons serve (models, adapters, the cache): every
    daemon, so that any of them can take the next request."""
    FIRST = "first"
    """A read: the first daemon (configured order) that answers."""
    SESSION = "session"
    """A session op: the daemon holding the session."""
    REQUEST = "request"
    """``cancel``: the daemon running the request."""


SPREADS: Final[Mapping[str, Spread]] = {
    "load_model": Spread.ALL,
    "unload": Spread.ALL,
    "set_keep_alive": Spread.ALL,
    "evict_bytes": Spread.ALL,
    "gc": Spread.ALL,
    "load_adapter": Spread.ALL,
    "unload_adapter": Spread.ALL,
    "set_adapter_scale": Spread.ALL,
    "list_models": Spread.FIRST,
    "model_info": Spread.FIRST,
    "status": Spread.FIRST,
    "counters": Spread.FIRST,
    "metrics": Spread.FIRST,
    "list_adapters": Spread.FIRST,
    "end_session": Spread.SESSION,
    "reset_session": Spread.SESSION,
    "fork_session": Spread.SESSION,
    "cancel": Spread.REQUEST,
}
"""Every op that is not :attr:`Spread.ANY` (generations and text ops are)."""


def spread(op: str) -> Spread:
    return SPREADS.get(op, Spread.ANY)
