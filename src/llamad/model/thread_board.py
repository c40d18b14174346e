"""The daemon-wide thread budget's shared state (SPEC M14): :class:`ThreadBoard`.

One small file (in the daemon's runtime directory, on tmpfs) holds a slot per
model worker. A worker claims a free slot with an OFD lock (see
:mod:`llamad.cache.oslocks`) and, before each decode, writes into it the
CLOCK_MONOTONIC time until which it counts as busy. Every worker reads all
slots (one memory read of a mapped page, no syscall) to learn how many workers
are busy now; :class:`~llamad.model.threads.ThreadGovernor` then caps its
threads at ``cores // busy_workers``.

Nothing can leak: a worker that dies loses its lock with its last descriptor,
and a busy mark whose slot is no longer locked is ignored, so a crash in the
middle of a long step frees its share at once. Marks expire on their own,
so a worker that stops decoding (idle, hung, stopped) gives its share back
after its linger without having to say so.

Layout (little-endian): header ``magic "LLMDTHRD", u32 version, u32 slots``,
then ``slots`` float64 busy-until times in seconds of CLOCK_MONOTONIC.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Final

import structlog

from llamad.cache.oslocks import range_locked, try_lock_range, unlock_range
from llamad.errors import ConfigError

__all__ = ["DEFAULT_SLOTS", "MAX_SLOTS", "ThreadBoard"]

log = structlog.get_logger("llamad.model.thread_board")

DEFAULT_SLOTS: Final = 64
MAX_SLOTS: Final = 4096
_MAGIC: Final = b"LLMDTHRD"
_VERSION: Final = 1
_HEADER: Final = struct.Struct("<8sII")
_SLOT: Final = struct.Struct("<d")


def _bad(path: Path, message: str) -> ConfigError:
    return ConfigError(f"thread board {path}: {message}", details={"field": "threads.board"})


class ThreadBoard:
    """A :class:`~llamad.model.threads.BusyBoard` shared by every worker on one file.

    ``ThreadBoard(path)`` creates the file if it is missing (any worker may be
    first) and claims a slot. Close it when the worker stops (the kernel does
    if it dies). With every slot taken the worker still runs, counting only
    itself among the unregistered (a warning is logged).
    """

    def __init__(self, path: str | os.PathLike[str], slots: int = DEFAULT_SLOTS) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= MAX_SLOTS:
            raise ConfigError(
                f"threads.board_slots: {slots!r} is not in [1, {MAX_SLOTS}]",
                details={"field": "threads.board_slots"},
            )
        self.path = Path(path)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            self.slots = self._init(fd, slots)
            self._times = struct.Struct(f"<{self.slots}d")
            size = _HEADER.size + self.slots * _SLOT.size
            self._map = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._lock = threading.Lock()
        self._until = -math.inf
        self.slot: int | None = None
        for i in range(self.slots):
            if try_lock_range(fd, self._offset(i), _SLOT.size):
                self.slot = i
                self._write(-math.inf)  # whatever the last holder left is not ours
                break
        else:
            log.warning("thread_board.full", path=str(self.path), slots=self.slots)

    def _init(self, fd: int, slots: int) -> int:
        # Only a new, empty file is initialised. The header goes in before the
        # file grows (one write: nobody sees part of it), so a racing opener
        # that sees a size also sees the header; two creators write the same.
        if os.fstat(fd).st_size == 0:
            os.pwrite(fd, _HEADER.pack(_MAGIC, _VERSION, slots), 0)
        raw = os.pread(fd, _HEADER.size, 0)
        if len(raw) < _HEADER.size:
            raise _bad(self.path, "is truncated")
        magic, version, n = _HEADER.unpack(raw)
        if magic != _MAGIC or version != _VERSION or not 1 <= n <= MAX_SLOTS:
            raise _bad(self.path, "is not a thread board (wrong magic, version or size)")
        size = _HEADER.size + n * _SLOT.size
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)  # only ever grows: a live mapping never loses its pages
        return int(n)

    @staticmethod
    def _offset(slot: int) -> int:
        return _HEADER.size + slot * _SLOT.size

    def _write(self, until: float) -> None:
        if self.slot is not None:
            _SLOT.pack_into(self._map, self._offset(self.slot), until)

    # -- BusyBoard -------------------------------------------------------------------

    def mark_busy(self, until: float) -> None:
        with self._lock:
            if self._map.closed:
                return
            self._until = until
            self._write(until)

    def busy_workers(self, now: float) -> int:
        with self._lock:
            mine = 1 if self._until >= now else 0
            if self._map.closed:
                return mine
            times = self._times.unpack_from(self._map, _HEADER.size)
            # Asked before every decode step: the marks still standing first
            # (one pass in C over the slots), the lock test only for those.
            standing = [i for i, until in enumerate(times) if until >= now]
            others = 0
            for i in standing:
                # A mark left by a worker that died mid-step is stale at once:
                # nobody holds its slot any more.
                if i != self.slot and range_locked(self._fd, self._offset(i), _SLOT.size):
                    others += 1
            return mine + others

    # -- lifetime ------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._map.closed

    def close(self) -> None:
        """Give the slot back (idle first, so nobody counts this worker)."""
        with self._lock:
            if self._map.closed:
                return
            # Unlocking is enough: a mark in an unlocked slot is never counted.
            self._until = -math.inf
            self._map.close()
            if self.slot is not None:
                unlock_range(self._fd, self._offset(self.slot), _SLOT.size)
            os.close(self._fd)

    def __enter__(self) -> ThreadBoard:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
