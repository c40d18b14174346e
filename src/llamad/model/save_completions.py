"""Save completions: how a writer thread's "done" reaches the worker's loop thread.

The core is not thread-safe and no thread but the loop ever calls it (nor
the backend that owns the packed states). A writer thread that finishes an
asynchronous save therefore only :meth:`SaveCompletions.post`\\ s it: the
entry goes on a queue and an eventfd is bumped. The loop registers
:meth:`~SaveCompletions.fileno` in its poll (``Actor.add_reader``), and
when it is readable calls :meth:`~SaveCompletions.drain`, which releases
the packed states of the finished saves (on the loop thread, where the
backend's buffer pool lives) and answers ``(key, published)`` pairs, in the
order the saves finished, for :meth:`llamad.model.core.WorkerCore.save_done`.

Some entries only release a state and report nothing: a synchronous save
that outlived its deadline (the core was told ``False`` already) finishes
its write later and must still give its buffer back.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

__all__ = ["Completed", "SaveCompletions"]

log = structlog.get_logger("llamad.model")


@dataclass(frozen=True, slots=True)
class Completed:
    """One finished save: ``release`` gives its packed state back; ``report``
    says whether the core is waiting to hear ``(key, published)``."""

    key: bytes
    published: bool
    release: Callable[[], None]
    report: bool = True


class SaveCompletions:
    """A thread-safe queue of finished saves with an fd that is readable while it is not empty."""

    def __init__(self) -> None:
        # Non-blocking: drain() reads it without knowing whether a post came.
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._done: deque[Completed] = deque()
        self._closed = False

    def fileno(self) -> int:
        """The eventfd to poll for reading (valid until :meth:`close`)."""
        return self._fd

    def post(self, done: Completed) -> None:
        """Queue ``done`` and wake the loop (any thread)."""
        with self._lock:
            self._done.append(done)
            if self._closed:
                return  # close() releases whatever is left
            os.eventfd_write(self._fd, 1)

    def pending(self) -> int:
        """Entries posted and not drained yet."""
        with self._lock:
            return len(self._done)

    def drain(self) -> list[tuple[bytes, bool]]:
        """Release every finished save's state; the ``(key, published)`` pairs
        the core must hear, in the order the saves finished (loop thread only)."""
        with self._lock:
            if not self._closed:
                # Reset the counter before taking the queue: a post racing
                # this drain either lands in this batch or wakes the next poll.
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._fd)
            batch = list(self._done)
            self._done.clear()
        reported: list[tuple[bytes, bool]] = []
        for done in batch:
            try:
                done.release()
            except Exception as exc:  # a failed release must not hide the others
                log.warning("model.state_release_failed", key=done.key.hex(), error=repr(exc))
            if done.report:
                reported.append((done.key, done.published))
        return reported

    def close(self) -> list[tuple[bytes, bool]]:
        """Drain what is left and close the fd; later posts are queued only
        (a last :meth:`drain` still releases them)."""
        left = self.drain()
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._fd)
        return left
