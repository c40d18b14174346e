"""Waiters (SPEC C8): lookups parked on an in-flight save until it lands or their time is up.

``lookup_exact_or_wait`` and a ``resolve`` with a ``parent_key`` may find
their key still being saved. Instead of a miss, cache-meta parks a
:class:`Waiter`: a deferred reply (the process layer's handle) plus a
``finish`` function that computes the answer once the outcome is known. The
:class:`WaiterTable` finishes waiters when the save publishes
(``published=True``), when it is abandoned or their deadline passes
(``False``), and forgets those whose owner died; finished answers queue up
for the process layer to send (:meth:`WaiterTable.take_ready`).

The table only keeps waiters; what an answer is (a pinned row, a prefix
lookup) is decided by the ``finish`` functions :class:`~llamad.cache.meta.CacheMeta`
gives it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from llamad.cache.reservation import Owner

__all__ = ["WAIT", "Deferred", "Waiter", "WaiterTable"]


class Deferred:
    """The type of :data:`WAIT` (a singleton)."""

    _instance: Deferred | None = None

    def __new__(cls) -> Deferred:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "WAIT"


WAIT: Final = Deferred()
"""Returned by a lookup that parked a waiter; its answer comes via ``take_ready``."""


@dataclass(slots=True)
class Waiter:
    """One parked lookup."""

    handle: object
    key: bytes
    owner: Owner
    deadline: float
    # Called with True once the awaited key is published, False when it is
    # abandoned or the deadline passes; returns the deferred answer.
    finish: Callable[[bool], object]


class WaiterTable:
    """Waiters by the key they wait for, and the answers ready to send."""

    def __init__(self) -> None:
        self._by_key: dict[bytes, list[Waiter]] = {}
        self._ready: list[tuple[object, object]] = []

    def __len__(self) -> int:
        return sum(len(w) for w in self._by_key.values())

    def park(self, waiter: Waiter) -> None:
        self._by_key.setdefault(waiter.key, []).append(waiter)

    def release(self, key: bytes, published: bool) -> None:
        """The save of ``key`` published or was abandoned: answer everyone waiting for it."""
        for waiter in self._by_key.pop(key, ()):
            self._ready.append((waiter.handle, waiter.finish(published)))

    def expire(self, now: float) -> None:
        """Answer (as not published) every waiter whose deadline is ``now`` or earlier."""
        for key in list(self._by_key):
            due = [w for w in self._by_key[key] if w.deadline <= now]
            if not due:
                continue
            self._keep(key, [w for w in self._by_key[key] if w.deadline > now])
            for waiter in due:
                self._ready.append((waiter.handle, waiter.finish(False)))

    def drop_owner(self, owner: Owner) -> None:
        """Forget ``owner``'s waiters unanswered (nobody is left to answer)."""
        for key in list(self._by_key):
            self._keep(key, [w for w in self._by_key[key] if w.owner != owner])

    def _keep(self, key: bytes, kept: list[Waiter]) -> None:
        if kept:
            self._by_key[key] = kept
        else:
            del self._by_key[key]

    def next_deadline(self) -> float | None:
        return min((w.deadline for waiters in self._by_key.values() for w in waiters), default=None)

    def owners(self) -> set[Owner]:
        return {w.owner for waiters in self._by_key.values() for w in waiters}

    def take_ready(self) -> list[tuple[object, object]]:
        """Answers that became ready: ``(handle, answer)`` pairs, oldest first."""
        ready, self._ready = self._ready, []
        return ready
