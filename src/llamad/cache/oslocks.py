"""Open-file-description byte-range locks: cross-process claims the kernel frees on death.

Counters claim a row of a shared table and writers claim a save permit with
these locks. Unlike classic POSIX record locks (``lockf``) an OFD lock
belongs to one open file description, so closing an unrelated descriptor of
the same file in the same process does not drop it, and two descriptors in one
process do conflict. Unlike ``flock`` it covers a byte range, so one file holds
many independent slots. When the holder dies the kernel releases the lock:
nothing can leak, which is the whole point.
"""

from __future__ import annotations

import errno
import fcntl
import struct
from typing import Final

# struct flock on Linux (x86-64 and arm64): short type, short whence, off_t
# start, off_t len, pid_t pid, then padding to 32 bytes. l_pid must be 0 for
# OFD locks.
_FLOCK: Final = struct.Struct("@hhqqi4x")
_F_OFD_SETLK: Final[int] = getattr(fcntl, "F_OFD_SETLK", 37)
_F_OFD_GETLK: Final[int] = getattr(fcntl, "F_OFD_GETLK", 36)


def try_lock_range(fd: int, start: int, length: int) -> bool:
    """Take an exclusive OFD lock on ``[start, start + length)``; False if someone holds it."""
    request = _FLOCK.pack(fcntl.F_WRLCK, 0, start, length, 0)
    try:
        fcntl.fcntl(fd, _F_OFD_SETLK, request)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def unlock_range(fd: int, start: int, length: int) -> None:
    """Release a lock taken with :func:`try_lock_range` on the same descriptor."""
    fcntl.fcntl(fd, _F_OFD_SETLK, _FLOCK.pack(fcntl.F_UNLCK, 0, start, length, 0))


def range_locked(fd: int, start: int, length: int) -> bool:
    """Whether another open file description holds a lock overlapping
    ``[start, start + length)`` (``fd``'s own locks do not count); takes nothing."""
    request = _FLOCK.pack(fcntl.F_WRLCK, 0, start, length, 0)
    kind = _FLOCK.unpack(fcntl.fcntl(fd, _F_OFD_GETLK, request))[0]
    return bool(kind != fcntl.F_UNLCK)
