"""Admission: the sequence pool and the bounded FIFO queue in front of it (SPEC M2).

A request needs a sequence of the context to run. :class:`SequencePool`
hands out the free ones (lowest id first, so a lone request always runs on
sequence 0 and tests can predict ids). Requests that find none wait in
:class:`AdmissionQueue`, strictly first in first out, up to ``max_queue`` of
them; one more is refused with :class:`~llamad.errors.Overloaded` at once,
so a client learns of overload from a fast error rather than a timeout.

A session's sequence is not in the pool while the session holds it (see
:mod:`llamad.model.sessions`): requests on a live session skip the queue,
the sequence being theirs already. A sequence that holds an idle entry (the
KV a finished request left, SPEC M18) is free: which free sequence a request
takes is :meth:`llamad.model.slots.SequenceTable.acquire`'s choice.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

from llamad.errors import LlamadError, Overloaded

__all__ = ["AdmissionQueue", "SequencePool"]

T = TypeVar("T")


class SequencePool:
    """The sequences of one context not held by a request or a session."""

    def __init__(self, n_seq_max: int) -> None:
        self.n_seq_max = n_seq_max
        self._free = set(range(n_seq_max))

    def __len__(self) -> int:
        return len(self._free)

    @property
    def free(self) -> frozenset[int]:
        return frozenset(self._free)

    def acquire(self) -> int | None:
        """The lowest free sequence, now taken; ``None`` when all are taken."""
        if not self._free:
            return None
        seq = min(self._free)
        self._free.remove(seq)
        return seq

    def take(self, seq: int) -> None:
        """Take the free sequence ``seq`` (the caller chose which)."""
        if seq not in self._free:
            raise LlamadError(f"sequence {seq} is not free")
        self._free.remove(seq)

    def release(self, seq: int) -> None:
        if not 0 <= seq < self.n_seq_max or seq in self._free:
            # Double release would let two requests share one KV sequence.
            raise LlamadError(f"sequence {seq} released twice or out of range")
        self._free.add(seq)


class AdmissionQueue(Generic[T]):
    """Requests waiting for a sequence, by request id, oldest first."""

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._waiting: OrderedDict[str, T] = OrderedDict()

    def __len__(self) -> int:
        return len(self._waiting)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._waiting

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._waiting.values()))

    def push(self, request_id: str, item: T) -> int:
        """Queue ``item`` last; returns its position (0 is next). Refuses when full."""
        if len(self._waiting) >= self.max_queue:
            raise Overloaded(
                f"all sequences are busy and {len(self._waiting)} requests are queued",
                details={"queue_depth": len(self._waiting), "max_queue": self.max_queue},
            )
        self._waiting[request_id] = item
        return len(self._waiting) - 1

    def peek(self) -> T | None:
        for item in self._waiting.values():
            return item
        return None

    def pop(self) -> T:
        """The oldest waiting item (IndexError when none)."""
        if not self._waiting:
            raise IndexError("admission queue is empty")
        return self._waiting.popitem(last=False)[1]

    def remove(self, request_id: str) -> T | None:
        """Take a waiting item out (cancelled), or ``None`` if it is not waiting."""
        return self._waiting.pop(request_id, None)
