"""Blocking work off the front's loop: lanes of jobs, answered through a mailbox.

The front's loop must never wait on a model load (seconds), a worker's
shutdown saves, or a supervisor busy restarting a child. Such calls run on a
:class:`Lane`: one thread that runs its jobs in order, with clients of its
own (ZeroMQ clients are not thread-safe, so each lane makes its own on its
thread). A job's outcome goes back through the :class:`Mailbox`, which wakes
the actor's poll; the loop then runs the job's continuation, on the loop's
thread, where every handle (deferred reply, stream) and the table live.

One lane per kind of work keeps them from queueing behind each other: a
model load does not hold up a ``gc``. Jobs of one lane are in order, which
``model_sup`` needs anyway (it does one thing at a time).
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import structlog

__all__ = ["Lane", "Mailbox", "Outcome"]

log = structlog.get_logger("llamad.front")

R = TypeVar("R")
T = TypeVar("T")


class Outcome(Generic[T]):
    """A job's value, or the exception it raised."""

    __slots__ = ("error", "value")

    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    def get(self) -> T:
        if self.error is not None:
            raise self.error
        return cast(T, self.value)


class Mailbox:
    """Continuations posted from other threads, run on the loop's thread."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self._items: deque[Callable[[], None]] = deque()
        self._wake = wake

    def post(self, fn: Callable[[], None]) -> None:
        self._items.append(fn)  # deque.append is atomic
        self._wake()

    def run(self) -> int:
        """Run what is posted (on the loop's thread); how many ran."""
        n = 0
        while self._items:
            fn = self._items.popleft()
            n += 1
            try:
                fn()
            except Exception:
                log.exception("front.continuation_failed")
        return n


class Lane(Generic[R]):
    """One thread running blocking jobs in order; ``resources()`` (called on the
    thread, once) makes what the jobs use, ``release`` closes it."""

    def __init__(
        self,
        name: str,
        mailbox: Mailbox,
        resources: Callable[[], R],
        release: Callable[[R], None] | None = None,
    ) -> None:
        self.name = name
        self._mailbox = mailbox
        self._resources = resources
        self._release = release
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[R], Any], Callable[[Outcome[Any]], None]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"front-{name}", daemon=True)
        self._thread.start()

    def submit(self, job: Callable[[R], T], done: Callable[[Outcome[T]], None]) -> None:
        """Run ``job(resources)`` on the lane; ``done(outcome)`` later on the loop."""
        self._jobs.put((job, done))

    def close(self, timeout: float = 5.0) -> None:
        """Finish the jobs queued so far, then stop (waits up to ``timeout``)."""
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        res: R | None = None
        try:
            while True:
                item = self._jobs.get()
                if item is None:
                    return
                job, done = item
                try:
                    if res is None:
                        res = self._resources()
                    outcome: Outcome[Any] = Outcome(job(res))
                except BaseException as exc:
                    outcome = Outcome(error=exc)
                self._mailbox.post(functools.partial(done, outcome))
        finally:
            if res is not None and self._release is not None:
                with contextlib.suppress(Exception):
                    self._release(res)
