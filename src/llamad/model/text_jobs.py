"""Long text work (tokenizing, rendering a chat) on one thread beside the worker's loop.

Tokenizing is the one part of a request whose cost grows with what a client
sends: a 16 Mi-character text takes seconds. On the loop, every other
request to the model waited that long, the heartbeat stopped and a new
client's handshake timed out. A :class:`TextJobs` runs such work on its own
thread instead, and hands each outcome back to the loop through a readable
fd (:meth:`Actor.add_reader <llamad.actors.Actor.add_reader>`), where the
request goes on as if it had been tokenized at once.

llama.cpp releases nothing to guard: ``llama_tokenize`` only reads the
vocabulary and cffi drops the GIL for the call, so the loop decodes while
the thread tokenizes (see :mod:`llamad.model.tokenizer`).

One thread, first come first served: a second long text waits behind the
first instead of splitting the cores further. At most :data:`MAX_WAITING`
jobs are held; past that a request is ``overloaded``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Final, Generic, TypeVar

import structlog

from llamad.errors import Overloaded

__all__ = ["MAX_WAITING", "Outcome", "TextJobs"]

log = structlog.get_logger("llamad.model")

T = TypeVar("T")

MAX_WAITING: Final = 16
"""Jobs held at once (running or queued); each holds its request's text."""


class Outcome(Generic[T]):
    """What a job came to: :meth:`get` returns its value or raises its error."""

    __slots__ = ("_error", "_value")

    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        self._value = value
        self._error = error

    def get(self) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]  # set whenever no error is


class _Job(Generic[T]):
    __slots__ = ("outcome", "then", "work")

    def __init__(self, work: Callable[[], T], then: Callable[[Outcome[T]], None]) -> None:
        self.work = work
        self.then = then
        self.outcome: Outcome[T] | None = None


class TextJobs:
    """One thread for text work; outcomes are run on the loop by :meth:`drain`.

    Loop side: :meth:`submit`, :meth:`drain` (when :meth:`fileno` is
    readable), :attr:`waiting`, :meth:`close`. The thread starts on the
    first job.
    """

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._todo: queue.SimpleQueue[_Job[object] | None] = queue.SimpleQueue()
        self._finished: deque[_Job[object]] = deque()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.waiting = 0
        """Jobs submitted whose outcome the loop has not taken yet."""

    def fileno(self) -> int:
        """Readable while finished jobs wait for :meth:`drain`."""
        return self._r

    def submit(self, work: Callable[[], T], then: Callable[[Outcome[T]], None]) -> None:
        """Run ``work()`` on the text thread, then ``then(outcome)`` on the loop
        (from :meth:`drain`); ``overloaded`` when :data:`MAX_WAITING` jobs wait."""
        if self._closed:
            raise RuntimeError("the text thread is closed")
        if self.waiting >= MAX_WAITING:
            raise Overloaded(
                f"{self.waiting} long texts are already waiting to be tokenized",
                details={"waiting": self.waiting},
            )
        if self._thread is None:
            # A daemon thread: a stopping worker does not wait for a long
            # tokenize (the model's lease keeps its vocabulary alive meanwhile).
            self._thread = threading.Thread(target=self._run, name="llamad-text", daemon=True)
            self._thread.start()
        self.waiting += 1
        self._todo.put(_Job(work, then))  # type: ignore[arg-type]  # T is erased in the queue

    def drain(self) -> None:
        """On the loop: run the ``then`` of every finished job."""
        with contextlib.suppress(BlockingIOError):
            while os.read(self._r, 4096):
                pass
        while True:
            with self._lock:
                if not self._finished:
                    return
                job = self._finished.popleft()
            self.waiting -= 1
            assert job.outcome is not None
            try:
                job.then(job.outcome)
            except Exception:
                log.exception("model.text_job_then_failed")

    def close(self) -> None:
        """Stop taking jobs; the thread ends after the one it runs (not waited for)."""
        if self._closed:
            return
        with self._lock:  # the thread writes to the pipe under it
            self._closed = True
            os.close(self._r)
            os.close(self._w)
        self._todo.put(None)

    def _run(self) -> None:
        while (job := self._todo.get()) is not None:
            try:
                job.outcome = Outcome(job.work())
            except BaseException as exc:  # handed to the loop, which answers with it
                job.outcome = Outcome(error=exc)
            with self._lock:
                if self._closed:
                    return
                self._finished.append(job)
                with contextlib.suppress(OSError):
                    # A full pipe already means the loop will wake.
                    os.write(self._w, b"\0")
