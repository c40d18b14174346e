"""cache-meta's background copies, as the model workers see them: :class:`CopyActivity`.

The mover (:mod:`llamad.cache.mover`) copies rows across filesystems (a row
saved to ``ram``, then copied to ``disk``), a core for 20-70 ms per
2,048-token row. A model worker decoding on every core beside such a copy
waits at each of ggml's barriers for the core the copy holds: one-row steps
went from 8 to 30-65 ms in the peers bench's P8 (p99 inter-token latency
with continued saves 47 ms against 13 without), and its thread governor
took them for collapses. The governor reads this board around each decode
step, as it reads the worker's own writer pool (``ThreadGovernor.own_work``):
a short step that starts during a copy takes half the threads, and a step a
copy overlapped is not judged.

One small file beside the writer permits (on the runtime tmpfs), mapped by
both sides. Layout (little-endian): ``magic "LLMDCOPY", u32 version,
u32 reserved, u64 epoch, f64 busy_until`` (seconds of CLOCK_MONOTONIC, one
clock for the whole machine). cache-meta's copy lane, one thread, is its
only writer: :meth:`CopyActivity.begin` and :meth:`CopyActivity.end` move
the epoch, and :meth:`CopyActivity.touch` (once per copied chunk) keeps
``busy_until`` :data:`LEASE_S` ahead, so a cache-meta killed mid-copy leaves
a mark that lapses on its own. Readers read 16 bytes of the mapping, no
syscall; a read torn by a concurrent write can misjudge one step at worst.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

__all__ = ["LEASE_S", "CopyActivity"]

LEASE_S: Final = 2.0
"""How long a copy counts as running after its last sign of life (a chunk is
8 MiB: milliseconds, even to a slow disk)."""

_MAGIC: Final = b"LLMDCOPY"
_VERSION: Final = 1
_HEADER: Final = struct.Struct("<8sII")
_STATE: Final = struct.Struct("<Qd")
_SIZE: Final = _HEADER.size + _STATE.size


def _is_board(raw: bytes) -> bool:
    """Whether a file's first bytes are a board of this version."""
    return len(raw) >= _SIZE and _HEADER.unpack_from(raw) == (_MAGIC, _VERSION, 0)


class CopyActivity:
    """The board of cache-meta's copies (module doc). :meth:`create` for the
    writer (cache-meta), :meth:`attach` for readers (model workers)."""

    def __init__(self, path: Path, fd: int, *, writable: bool, clock: Callable[[], float]) -> None:
        self.path = path
        self._fd = fd
        access = mmap.ACCESS_WRITE if writable else mmap.ACCESS_READ
        self._map = mmap.mmap(fd, _SIZE, access=access)
        self._clock = clock
        self._epoch = 0

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.monotonic
    ) -> CopyActivity:
        """Open (creating it if needed) the board to write; idle until :meth:`begin`.

        A file left by an earlier cache-meta is reused, its epoch carried on;
        one that is not a board (wrong magic, version or size) is rewritten.
        """
        where = Path(path)
        fd = os.open(where, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            if not _is_board(os.pread(fd, _SIZE, 0)):
                os.pwrite(fd, _HEADER.pack(_MAGIC, _VERSION, 0) + _STATE.pack(0, -math.inf), 0)
            board = cls(where, fd, writable=True, clock=clock)
        except BaseException:
            os.close(fd)
            raise
        epoch, _ = _STATE.unpack_from(board._map, _HEADER.size)
        board._epoch = epoch
        board._write(-math.inf)  # a copy the last writer left marked is over
        return board

    @classmethod
    def attach(
        cls, path: str | os.PathLike[str], *, clock: Callable[[], float] = time.monotonic
    ) -> CopyActivity | None:
        """The board cache-meta created, to read; None where there is none
        (or it is not one): the reader then sees no copy."""
        where = Path(path)
        try:
            fd = os.open(where, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            if not _is_board(os.pread(fd, _SIZE, 0)):
                os.close(fd)
                return None
            return cls(where, fd, writable=False, clock=clock)
        except BaseException:
            os.close(fd)
            raise

    # -- the writer (cache-meta's copy lane) ------------------------------------------

    def _write(self, busy_until: float) -> None:
        # A copy thread the mover's stop gave up waiting for may still end
        # its copy after cache-meta closed the board.
        if not self._map.closed:
            _STATE.pack_into(self._map, _HEADER.size, self._epoch, busy_until)

    def begin(self) -> None:
        """A copy starts."""
        self._epoch += 1
        self._write(self._clock() + LEASE_S)

    def touch(self) -> None:
        """The copy under way is alive (called once per chunk)."""
        self._write(self._clock() + LEASE_S)

    def end(self) -> None:
        """The copy is over (done, failed or stopped)."""
        self._epoch += 1
        self._write(-math.inf)

    # -- readers ------------------------------------------------------------------------

    def quiet_epoch(self) -> int | None:
        """None while a copy runs; otherwise the epoch, which moves as each
        copy begins and ends (as :meth:`llamad.cache.writer.WriterPool.quiet_epoch`)."""
        if self._map.closed:
            return 0
        epoch, busy_until = _STATE.unpack_from(self._map, _HEADER.size)
        return None if busy_until > self._clock() else int(epoch)

    def close(self) -> None:
        if not self._map.closed:
            self._map.close()
            os.close(self._fd)
