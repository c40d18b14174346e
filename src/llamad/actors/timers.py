"""The actor's deadlines: :class:`Timers`, one heap per actor.

A handler that defers with a timeout (``req.defer(timeout=...)``) puts its
handle here; the actor's loop sleeps no longer than the earliest deadline and
expires what is due after each poll (the handle answers with its
``on_timeout`` value or a ``timeout`` error, unless it was answered first).
The runtime's own periodic work (the peer table's idle check) is a callback
on the same heap (:meth:`Timers.call_later`), so the loop has one deadline to
sleep towards and nothing to check on a poll while the heap is empty.
Everything runs on the actor's thread.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Timers"]


class _Due(Protocol):
    """What the heap holds: a deferred reply's handle, or a :class:`_Call`."""

    @property
    def done(self) -> bool: ...

    def _expire(self) -> None: ...


class _Call:
    """A callback on the heap (runs once, at its deadline)."""

    __slots__ = ("done", "fn")

    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn = fn
        self.done = False

    def _expire(self) -> None:
        self.done = True
        self.fn()


class Timers:
    """Pending deadlines, earliest first.

    ``heap`` is the heap itself, ``(deadline, seq, due)`` with deadlines on
    ``clock`` (``time.monotonic`` unless a test gives its own). The loop
    reads it directly (truthy while a timer is pending; ``heap[0][0]`` is the
    next deadline) because that check runs on every poll; it is never
    replaced, only emptied.
    """

    __slots__ = ("_seq", "clock", "heap")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.heap: list[tuple[float, int, _Due]] = []
        # Breaks ties between equal deadlines, so entries are never compared.
        self._seq = itertools.count()

    def add(self, delay: float, handle: _Due) -> None:
        """Expire ``handle`` ``delay`` seconds from now (at once if ``<= 0``)."""
        deadline = self.clock() + max(0.0, delay)
        heapq.heappush(self.heap, (deadline, next(self._seq), handle))

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn()`` from the loop ``delay`` seconds from now."""
        self.add(delay, _Call(fn))

    def fire(self) -> None:
        """Expire every entry whose deadline has passed and is still open."""
        heap = self.heap
        now = self.clock()
        while heap and heap[0][0] <= now:
            _, _, due = heapq.heappop(heap)
            if not due.done:
                due._expire()

    def clear(self) -> None:
        self.heap.clear()
