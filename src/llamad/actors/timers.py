"""The deadlines of deferred replies: :class:`Timers`, one heap per actor.

A handler that defers with a timeout (``req.defer(timeout=...)``) puts its
handle here; the actor's loop sleeps no longer than the earliest deadline and
expires what is due after each poll (the handle answers with its
``on_timeout`` value or a ``timeout`` error, unless it was answered first).
Everything runs on the actor's thread.
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llamad.actors.handles import PendingReply

__all__ = ["Timers"]


class Timers:
    """Pending deferred-reply deadlines, earliest first.

    ``heap`` is the heap itself, ``(deadline, seq, handle)`` with
    ``time.monotonic()`` deadlines. The loop reads it directly (truthy while a
    timer is pending; ``heap[0][0]`` is the next deadline) because that check
    runs on every poll; it is never replaced, only emptied.
    """

    __slots__ = ("_seq", "heap")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int, PendingReply]] = []
        # Breaks ties between equal deadlines, so handles are never compared.
        self._seq = itertools.count()

    def add(self, delay: float, handle: PendingReply) -> None:
        """Expire ``handle`` ``delay`` seconds from now (at once if ``<= 0``)."""
        deadline = time.monotonic() + max(0.0, delay)
        heapq.heappush(self.heap, (deadline, next(self._seq), handle))

    def fire(self) -> None:
        """Expire every handle whose deadline has passed and is still open."""
        heap = self.heap
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            _, _, handle = heapq.heappop(heap)
            if not handle.done:
                handle._expire()

    def clear(self) -> None:
        self.heap.clear()
