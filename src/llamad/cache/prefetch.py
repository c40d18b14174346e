"""Warming the page cache with the newest ``disk`` rows when cache-meta starts.

A ``disk`` row is read with plain ``pread`` (:mod:`llamad.cache.tiers`), so a
restore costs what the page cache makes it cost. After a reboot, or once
memory pressure or a VM's balloon has reclaimed the page cache, the first
restore of each row reads it from the device instead. On the benchmark VM a
2048-token row (45 MB) came from the page cache in 7 ms and from the device
in 23 ms when the host had the blocks cached, 86-91 ms when it had not (the
first read of a row since it was written): P2's budget is 40 ms. So
cache-meta reads the most recently used ``disk`` rows once, in the
background, right after its startup scan, up to a byte budget
(``cache.disk.prefetch``, 0 turns it off): the first hits after a start then
pay a copy, not the device.

What is read, and why so:

- **Whole rows, newest first** (the index's ``last_used_ns``, persisted in
  the file headers), while they fit the budget; a row that does not fit is
  skipped and smaller older ones may still be taken. A half-read row saves
  little: the restore waits for its slowest chunk.
- **Plain sequential reads** into one small reused buffer, with
  ``POSIX_FADV_SEQUENTIAL``: when a read returns, those pages are resident,
  so "done" (:meth:`Prefetcher.status`) means resident, which ``WILLNEED``
  (asynchronous, unbounded in time) cannot say. A benchmark that drops pages
  to measure the device waits for ``done`` first, or the prefetch would
  warm them again behind its back.
- **Once per cache-meta start**, on one daemon thread that a stop ends
  between chunks. The rows are planned from the index as rebuilt; a row
  evicted meanwhile is skipped (its file is gone).
- ``ram_file`` rows live on tmpfs (always resident) and ``ram`` segments in
  shared memory: only ``disk`` rows are read.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, Protocol

import structlog

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.kvc import IO_CHUNK
from llamad.cache.tier_kind import TierKind

__all__ = ["DEFAULT_PREFETCH_BYTES", "PrefetchItem", "Prefetcher", "check_budget", "plan"]

log = structlog.get_logger("llamad.cache.prefetch")

DEFAULT_PREFETCH_BYTES: Final = 256 << 20
"""The default budget: a few of the newest 2048-token rows of a small model."""


class _IndexedRow(Protocol):
    """What the plan needs of the copy a row is restored from (its fastest,
    :class:`llamad.cache.rows.Copy`)."""

    @property
    def tier(self) -> TierKind: ...
    @property
    def size(self) -> int: ...
    @property
    def location(self) -> str: ...
    @property
    def last_used_ns(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PrefetchItem:
    """One file to read: its path and the bytes the index says it holds."""

    location: str
    size: int


def check_budget(value: object, field: str = "prefetch_bytes") -> int:
    """``value`` as a byte budget (an int >= 0; 0 turns the prefetch off)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidCacheValue(field, f"{value!r} is not a byte count >= 0")
    return value


def plan(rows: Iterable[_IndexedRow], budget: int) -> list[PrefetchItem]:
    """The ``disk`` rows to read: most recently used first, whole rows whose
    sizes sum to at most ``budget`` (one that does not fit is skipped).

    ``rows``: the copy each row is restored from, its fastest; a row that
    also has a faster copy than its ``disk`` one is not read from disk."""
    budget = check_budget(budget)
    disk = sorted(
        (r for r in rows if r.tier is TierKind.DISK), key=lambda r: r.last_used_ns, reverse=True
    )
    items: list[PrefetchItem] = []
    left = budget
    for row in disk:
        if 0 < row.size <= left:
            items.append(PrefetchItem(row.location, row.size))
            left -= row.size
    return items


class Prefetcher:
    """Reads :func:`plan`'s files once, on a thread of its own (see the module doc).

    ``status()`` is safe from any thread: ``state`` is ``off`` (nothing to
    read, or a budget of 0), ``running``, ``done`` or ``stopped``, with the
    rows and bytes planned and read so far.
    """

    def __init__(
        self, items: Iterable[PrefetchItem], *, budget: int, chunk: int = IO_CHUNK
    ) -> None:
        self.items = list(items)
        self.planned_bytes = sum(item.size for item in self.items)
        self.budget = check_budget(budget, "budget")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise InvalidCacheValue("chunk", f"{chunk!r} is not a positive byte count")
        self.chunk = chunk
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._state = "off" if not self.items else "planned"
        self._rows_read = 0
        self._bytes_read = 0
        self._seconds = 0.0

    def start(self) -> None:
        """Read in the background (a daemon thread); nothing happens when off."""
        if self._begin():
            self._thread = threading.Thread(target=self._run, name="kvc-prefetch", daemon=True)
            self._thread.start()

    def run(self) -> None:
        """Read every planned file now, on this thread (tests, tools)."""
        if self._begin():
            self._run()

    def _begin(self) -> bool:
        """Planned becomes running, once; whether this call did it."""
        with self._lock:
            if self._state != "planned":
                return False
            self._state = "running"
            return True

    def stop(self, timeout: float = 1.0) -> None:
        """Stop between two chunks and wait up to ``timeout`` for the thread."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the background read to end; whether it has."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return self._state != "running"

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "state": self._state,
                "budget": self.budget,
                "rows": len(self.items),
                "bytes": self.planned_bytes,
                "rows_read": self._rows_read,
                "bytes_read": self._bytes_read,
                "seconds": round(self._seconds, 3),
            }

    def _run(self) -> None:
        started = time.monotonic()
        buffer = bytearray(self.chunk)
        try:
            for item in self.items:
                if self._stop.is_set():
                    break
                n = self._read(item, buffer)
                with self._lock:
                    self._rows_read += n > 0
                    self._bytes_read += n
                    self._seconds = time.monotonic() - started
        except Exception as exc:  # a prefetch only ever saves time: never let it cost more
            log.warning("cache.prefetch_failed", error=repr(exc))
        with self._lock:
            self._state = "stopped" if self._stop.is_set() else "done"
            self._seconds = time.monotonic() - started
        log.info("cache.prefetch_" + self._state, **self.status())

    def _read(self, item: PrefetchItem, buffer: bytearray) -> int:
        """Read ``item``'s file through the page cache; the bytes read (0: gone)."""
        try:
            fd = os.open(item.location, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            # Evicted since the plan, or unreadable: not the prefetch's to judge.
            log.debug("cache.prefetch_skipped", path=item.location, error=str(exc))
            return 0
        done = 0
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            view = memoryview(buffer)
            while not self._stop.is_set():
                n = os.preadv(fd, [view], done)
                if n <= 0:
                    break
                done += n
        except OSError as exc:
            log.debug("cache.prefetch_skipped", path=item.location, error=str(exc))
        finally:
            os.close(fd)
        return done
