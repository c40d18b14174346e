"""The cache view's reusable buffer for rows read by copy (issue 21, SPEC P1).

A ``ram`` row is restored in place from its shared mapping; a ``ram_file``
or ``disk`` row is ``pread`` into a buffer first. Allocating and faulting in
that buffer on the restore's path cost ~12 ms for a 2,048-token row (47 MB)
the first time a row that large was read after a start. So the buffer is
sized *ahead* of the reads: every row the view sees (a lookup's answer, in
any tier, since a ``ram`` row may be demoted and read by copy later; a save
it makes) is :meth:`ReadBuffer.note`\\ d, and once the worker has been idle
a moment (:meth:`ReadBuffer.prepare`, from the shell's loop through
``CacheView.idle``) a buffer for the largest
row seen is allocated and pre-faulted on a helper thread, off the loop. A
read swaps the prepared buffer in (a pointer swap) and finds it large enough;
only a row larger than any seen, or one read before the worker was idle
since it was seen, grows the buffer on the read path, and
:attr:`ReadBuffer.grows_on_read` counts it.

Not at the note itself: a lookup notes the row the restore right after it
reads, and on two cores the helper's 60 MB of page faults ran beside that
restore's checksum and unpack. After a restart (no buffer yet, rows the new
worker had never seen), the first restore of a 2,048-token ``ram`` row took
~25 ms with the buffer prepared beside it and ~9 ms without
(``bench/restart_probe.py``: SIGTERM, start, the repeat; SPEC P2). A buffer
prepared that early never served the read that followed anyway: that read
came first.

Memory, bounded: one buffer of the largest row seen, rounded up to a quarter
power of two (:func:`~llamad.model.state_pool.size_class`), and never more
than ``max_bytes`` ahead of a read (1 GiB by default; a larger row is read
into a buffer grown for it then). A row is at most the state of a full
sequence, ~23 KB per token for the default model: ~60 MB after a 2,048-token
row, ~100 MB at n_ctx 4,096. While a larger buffer is prepared the smaller
one lives on until the swap. Nothing is allocated before a row is seen, so
an idle, fresh worker holds none.

The memory comes from the model's device's host buffer type where it has
one (pinned on CUDA: the device copies from it at full speed), and is plain
anonymous memory otherwise, the CPU's case (see
:mod:`llamad.llama_ffi.state`).
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Final

import structlog

from llamad.llama_ffi.state import HostBufferType, StateBuffer
from llamad.model.results import ReadBufferStats
from llamad.model.state_pool import size_class

__all__ = ["DEFAULT_MAX_AHEAD", "ReadBuffer", "ReadBufferStats"]

log = structlog.get_logger("llamad.model")

DEFAULT_MAX_AHEAD: Final = 1 << 30


class ReadBuffer:
    """See the module doc. :meth:`take` runs on the loop thread only; :meth:`note`
    on any thread."""

    def __init__(
        self, *, host: HostBufferType | None = None, max_ahead: int = DEFAULT_MAX_AHEAD
    ) -> None:
        self._host = host
        self._max_ahead = max_ahead
        self._buffer: StateBuffer | None = None
        self._lock = threading.Lock()
        self._largest = 0
        self._target = 0  # capacity the buffer in use or the one being prepared has
        self._pending: list[Future[StateBuffer]] = []  # oldest first
        self._prepared = 0
        self._grows_on_read = 0
        self._helper: ThreadPoolExecutor | None = None
        self._closed = False

    def note(self, size: int) -> None:
        """A row of ``size`` file bytes exists: have a buffer for it ready ahead
        of its read, prepared at the next :meth:`prepare`."""
        with self._lock:
            if not self._closed:
                self._largest = max(self._largest, size)

    def prepare(self) -> bool:
        """Start preparing a buffer for the largest row seen, unless one that
        large is in use or on its way, or it is past ``max_ahead`` (the loop
        thread, when the worker is idle); whether one was started."""
        with self._lock:
            want = size_class(self._largest) if self._largest else 0
            if self._closed or want <= self._target or want > self._max_ahead:
                return False
            self._target = want
            if self._helper is None:
                self._helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvc-readbuf")
            # A later, larger one queues behind this one; the loop swaps in
            # the largest one done and frees the others.
            self._pending.append(self._helper.submit(self._allocate, want))
            return True

    def _allocate(self, capacity: int) -> StateBuffer:
        return StateBuffer(capacity, host=self._host)

    def take(self, size: int) -> StateBuffer:
        """The buffer for a read of ``size`` bytes (loop thread): the prepared
        one if it is ready, grown here only if nothing large enough is."""
        self._swap_in()
        buffer = self._buffer
        if buffer is not None and buffer.capacity >= size:
            return buffer
        want = size_class(size)
        with self._lock:
            self._largest = max(self._largest, size)
            self._target = max(self._target, want)
        self._grows_on_read += 1
        fresh = StateBuffer(want, host=self._host)
        self._replace(fresh)
        return fresh

    def _swap_in(self) -> None:
        with self._lock:
            done = [f for f in self._pending if f.done()]
            self._pending = [f for f in self._pending if not f.done()]
        for ready in done:
            try:
                prepared = ready.result()
            except Exception as exc:  # an allocation refused: reads grow as before
                log.warning("model.read_buffer_prepare_failed", error=repr(exc))
                continue
            self._prepared += 1
            current = self._buffer
            if current is not None and current.capacity >= prepared.capacity:
                self._retire(prepared)
            else:
                self._replace(prepared)

    def _replace(self, new: StateBuffer) -> None:
        old, self._buffer = self._buffer, new
        if old is not None:
            self._retire(old)

    def _retire(self, old: StateBuffer) -> None:
        # Freeing a 47 MB buffer costs about what filling it does: on the
        # helper, not on the read that swapped. Every view of it was released
        # when the read that used it ended.
        helper = self._helper
        if helper is None or self._closed:
            old.close()
            return
        helper.submit(old.close)

    def stats(self) -> ReadBufferStats:
        """What the buffer is now (loop thread: a buffer prepared since is swapped in first)."""
        self._swap_in()
        buffer = self._buffer
        return ReadBufferStats(
            capacity=0 if buffer is None else buffer.capacity,
            largest_seen=self._largest,
            prepared=self._prepared,
            grows_on_read=self._grows_on_read,
            kind="mmap" if self._host is None else self._host.name,
        )

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Whether every buffer asked for ahead (prepared now if it was not
        yet) is allocated and swapped in within ``timeout`` (loop thread;
        tests and benches)."""
        self.prepare()
        with self._lock:
            pending = list(self._pending)
        for ready in pending:
            try:
                ready.result(timeout)
            except Exception:
                return False
        self._swap_in()
        return not self._pending

    def close(self) -> None:
        with self._lock:
            self._closed = True
            helper, self._helper = self._helper, None
            pending, self._pending = self._pending, []
        if helper is not None:
            helper.shutdown(wait=True)
        for ready in pending:
            if ready.done() and ready.exception() is None:
                ready.result().close()
        if self._buffer is not None:
            self._buffer.close()
            self._buffer = None
