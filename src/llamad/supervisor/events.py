"""What a supervisor decided and did, as typed events a subscriber can read.

Every decision the supervisor carries out (a child started, exited with a
reason, was restarted or not, hung; the supervisor escalated, shut down) is
one :data:`SupervisorEvent`. The runtime both logs it (the log event name is
the event's ``kind``, its fields the event's fields: one vocabulary) and
publishes it on the supervisor's :class:`EventFeed`, so the daemon's
``status`` and tests read decisions without parsing logs:

- in process: ``supervisor.events.since(seq)`` / ``.wait(seq, timeout)``;
- from other processes: the ``events`` stream op of
  :class:`~llamad.supervisor.service.SupervisorService`
  (``SupervisorClient.subscribe(since=...)``).

Events are msgspec structs tagged by ``kind`` (``"child.exited"``, ...), so
they cross the actor runtime as maps and decode back into the same classes.
``seq`` numbers one supervisor's events from 1 without gaps: a subscriber
that sees a jump lost events that fell out of the feed's window.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import ClassVar, TypeVar

import msgspec

from llamad.supervisor.exits import ExitReason

__all__ = [
    "ChildExited",
    "ChildHung",
    "ChildNotRestarted",
    "ChildRestartFailed",
    "ChildRestarted",
    "ChildShutdownTimeout",
    "ChildStartFailed",
    "ChildStarted",
    "ChildStopped",
    "EventFeed",
    "SupAutoShutdown",
    "SupCrashed",
    "SupEscalated",
    "SupRestarting",
    "SupShuttingDown",
    "SupStarted",
    "SupStopped",
    "SupervisorEvent",
    "event_kind",
    "log_fields",
]


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Fields every event has; :class:`EventFeed` fills them when it publishes."""

    #: 1, 2, 3, ... per supervisor, in publication order.
    seq: int = 0
    #: Wall-clock seconds (``time.time()``) when it happened.
    at: float = 0.0
    #: The supervisor's name.
    sup: str = ""

    #: How the runtime logs it (a structlog method name).
    LEVEL: ClassVar[str] = "info"

    def log_level(self) -> str:
        return self.LEVEL


class SupStarted(_Event, frozen=True, tag="sup.started"):
    """Every initial child started; the supervisor is supervising."""

    strategy: str
    children: int
    pid: int


class ChildStarted(_Event, frozen=True, tag="child.started"):
    """A child reported ready: initial start, ``start_child`` or ``restart_child``."""

    child: str
    pid: int
    dynamic: bool = False


class ChildStartFailed(_Event, frozen=True, tag="child.start_failed"):
    """A start (initial, ``start_child``, ``restart_child``) failed.

    ``reason``: ``exit`` (died before ready), ``start_timeout``, ``spawn``
    (could not exec, e.g. a missing ``cwd``), ``interrupted``.
    """

    LEVEL: ClassVar[str] = "error"

    child: str
    reason: str
    exit: str | None = None
    pid: int | None = None
    error: str | None = None


class ChildExited(_Event, frozen=True, tag="child.exited"):
    """A child's process ended without the supervisor stopping it."""

    child: str
    pid: int
    reason: ExitReason
    #: The wait status in words: ``"exit 3"``, ``"signal SIGKILL"``.
    exit: str
    #: Why the supervisor killed it, if it did (``hung``).
    cause: str | None = None
    restarts_in_window: int = 0

    def log_level(self) -> str:
        return "warning" if self.reason is ExitReason.ABNORMAL else "info"


class ChildNotRestarted(_Event, frozen=True, tag="child.not_restarted"):
    """The supervisor gives up on a child: its restart type says not to restart it.

    ``removed``: its spec was forgotten too (temporary or dynamic child).
    """

    child: str
    removed: bool


class SupRestarting(_Event, frozen=True, tag="sup.restarting"):
    """A restart plan: stop ``stop`` in order, then start ``start`` in order."""

    trigger: str
    strategy: str
    stop: tuple[str, ...]
    start: tuple[str, ...]
    restarts_in_window: int


class ChildRestarted(_Event, frozen=True, tag="child.restarted"):
    """A restart plan started the child again; ``restarts`` is its count so far."""

    child: str
    pid: int
    restarts: int
    restarts_in_window: int


class ChildRestartFailed(_Event, frozen=True, tag="child.restart_failed"):
    """Restarting the child failed; it waits ``restarting`` for the retry."""

    LEVEL: ClassVar[str] = "error"

    child: str
    reason: str
    exit: str | None = None
    pid: int | None = None
    error: str | None = None


class ChildHung(_Event, frozen=True, tag="child.hung"):
    """Silent past its ``liveness_timeout``: the supervisor SIGKILLs it."""

    LEVEL: ClassVar[str] = "warning"

    child: str
    pid: int
    silent_for: float
    liveness_timeout: float


class ChildShutdownTimeout(_Event, frozen=True, tag="child.shutdown_timeout"):
    """The child outlived its ``shutdown`` after SIGTERM and was SIGKILLed."""

    LEVEL: ClassVar[str] = "warning"

    child: str
    pid: int
    shutdown: float | str


class ChildStopped(_Event, frozen=True, tag="child.stopped"):
    """The supervisor stopped the child (a restart plan, ``terminate_child``, shutdown)."""

    child: str
    pid: int
    reason: ExitReason = ExitReason.SHUTDOWN
    exit: str | None = None


class SupEscalated(_Event, frozen=True, tag="sup.escalated"):
    """More than ``intensity`` restarts in ``period``: the supervisor stops
    every child and exits abnormally, for its own supervisor to act on."""

    LEVEL: ClassVar[str] = "error"

    trigger: str
    restarts_in_window: int
    intensity: int
    period: float


class SupAutoShutdown(_Event, frozen=True, tag="sup.auto_shutdown"):
    """A significant child's exit ends the supervisor (``auto_shutdown``)."""

    trigger: str


class SupShuttingDown(_Event, frozen=True, tag="sup.shutting_down"):
    """The supervisor stops its children: ``requested``, ``escalated``,
    ``auto_shutdown`` or ``start_failed``."""

    reason: str
    children: int


class SupStopped(_Event, frozen=True, tag="sup.stopped"):
    """The supervisor's last event: it ended with ``exit_code``."""

    reason: str
    exit_code: int


class SupCrashed(_Event, frozen=True, tag="sup.crashed"):
    """The supervisor's own loop failed (a bug); its children are killed."""

    LEVEL: ClassVar[str] = "error"

    error: str


SupervisorEvent = (
    SupStarted
    | ChildStarted
    | ChildStartFailed
    | ChildExited
    | ChildNotRestarted
    | SupRestarting
    | ChildRestarted
    | ChildRestartFailed
    | ChildHung
    | ChildShutdownTimeout
    | ChildStopped
    | SupEscalated
    | SupAutoShutdown
    | SupShuttingDown
    | SupStopped
    | SupCrashed
)

_E = TypeVar("_E", bound=_Event)

#: Fields that are not the event's own story: the log line has them already.
_STAMP = frozenset({"at", "sup"})


def event_kind(event: _Event) -> str:
    """The event's tag, e.g. ``"child.exited"`` (also its log event name)."""
    return str(type(event).__struct_config__.tag)


def log_fields(event: _Event) -> dict[str, object]:
    """The event's fields as log key/values: ``sup`` is bound to the logger and
    ``at`` is the line's timestamp; unset optional fields are left out."""
    return {
        k: v for k, v in msgspec.structs.asdict(event).items() if k not in _STAMP and v is not None
    }


class EventFeed:
    """One supervisor's recent events, numbered, for readers on any thread.

    Keeps the last ``capacity`` events. Readers ask for everything after a
    ``seq`` they have seen (:meth:`since`, :meth:`wait`); :meth:`subscribe`
    registers a callback told after each publication (it runs on the
    publishing thread, the supervisor's loop, so it must not block: the
    service's callback only wakes its actor).
    """

    def __init__(
        self, sup: str, *, capacity: int = 1024, clock: Callable[[], float] = time.time
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.sup = sup
        self._clock = clock
        self._events: deque[SupervisorEvent] = deque(maxlen=capacity)
        self._seq = 0
        self._cond = threading.Condition()
        self._wakers: list[Callable[[], None]] = []

    @property
    def last_seq(self) -> int:
        """The ``seq`` of the newest event (0 before the first)."""
        return self._seq

    def publish(self, event: _E, *, at: float | None = None) -> _E:
        """Number and stamp ``event`` (``at`` defaults to the clock), keep it,
        wake readers; return the stamped event."""
        with self._cond:
            self._seq += 1
            stamped = msgspec.structs.replace(
                event, seq=self._seq, at=self._clock() if at is None else at, sup=self.sup
            )
            self._events.append(stamped)  # type: ignore[arg-type]
            self._cond.notify_all()
            # Under the lock, so an unsubscribed waker is never called after
            # its owner closed whatever it writes to.
            for wake in self._wakers:
                wake()
        return stamped

    def since(self, seq: int) -> list[SupervisorEvent]:
        """Kept events with a ``seq`` above ``seq``, oldest first."""
        with self._cond:
            return self._after(seq)

    def wait(self, seq: int, timeout: float | None = None) -> list[SupervisorEvent]:
        """Like :meth:`since`, but block up to ``timeout`` for at least one."""
        with self._cond:
            self._cond.wait_for(lambda: self._seq > seq, timeout)
            return self._after(seq)

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake()`` after every publication; return the unsubscribe function."""
        with self._cond:
            self._wakers.append(wake)

        def unsubscribe() -> None:
            with self._cond:
                if wake in self._wakers:
                    self._wakers.remove(wake)

        return unsubscribe

    def _after(self, seq: int) -> list[SupervisorEvent]:
        if not self._events or seq >= self._seq:
            return []
        first = self._events[0].seq
        skip = max(0, seq + 1 - first)
        return [e for i, e in enumerate(self._events) if i >= skip]
