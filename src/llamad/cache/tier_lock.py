"""Which cache-meta owns a tier: a lock in the tier root, taken before anything else.

cache-meta is the sole writer of its tiers, and its start acts on that: the
startup scan deletes ``*.tmp`` files (a live writer's in-flight save looks
exactly like a dead one's leftover), deletes what it finds corrupt, drops
rows over *its* quotas, and the index it builds decides what is evicted
later. A second cache-meta over the same tiers (a daemon started twice, or
the same tier folders under another runtime directory) would do all of that
to the first one's files. So each tier root is owned by one cache-meta at a
time, and a second one refuses with :class:`~llamad.cache.errors.TierLocked`
before it has read or deleted a single file.

The lock is an OFD lock (:mod:`llamad.cache.oslocks`) on a file inside the
tier root, ``cache-meta.lock`` (:attr:`Tier.lock_path`). A ``ram`` tier's
root is ``/dev/shm``, shared by every instance on the host, so its lock
carries the instance prefix like its segments do
(``llamad-ram.<instance>.cache-meta.lock``): it guards exactly the segments
of that instance. The kernel frees the lock when its holder dies, SIGKILL
included, so a crashed owner never blocks its restart, and nothing ever
waits on it: taking it either succeeds at once or refuses.

The file's contents (the owner's pid) are only for the refusal's message;
the lock alone decides. A clean release unlinks the file while still
holding the lock; a taker checks after locking that the path still names
the file it locked (and starts over if not), so removing the file can never
let two owners in.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Final

import structlog

from llamad.cache.errors import TierError, TierLocked
from llamad.cache.oslocks import try_lock_range
from llamad.cache.tiers import Tier

__all__ = ["TierLock", "TierLocks"]

log = structlog.get_logger("llamad.cache.tier_lock")

# A taker starts over when the file it locked was unlinked (released) under
# it; only a release racing every attempt could exhaust these.
_ATTEMPTS: Final = 8
_HOLDER_BYTES: Final = 64


class TierLock:
    """This process's ownership of one tier; :meth:`take` it, :meth:`release` it."""

    def __init__(self, tier: Tier, path: Path, fd: int) -> None:
        self.tier = tier
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def take(cls, tier: Tier) -> TierLock:
        """Own ``tier`` or raise :class:`TierLocked`; reads and deletes nothing in it.

        Creates the tier directory if needed (the lock file lives there).
        """
        tier.prepare()
        path = tier.lock_path
        for _ in range(_ATTEMPTS):
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            except OSError as exc:
                raise TierError(f"cannot open {path}, tier {tier.name}'s lock: {exc}") from exc
            try:
                if not try_lock_range(fd, 0, 0):
                    raise _refusal(tier, path, fd)
                if _names(path, fd):
                    _write_holder(fd)
                    log.debug("cache.tier_locked", tier=tier.name, lock=str(path))
                    return cls(tier, path, fd)
            except BaseException:
                os.close(fd)
                raise
            # The owner released (and unlinked) the file between our open and
            # our lock: the lock we hold is on a file nobody else will open.
            os.close(fd)
        raise TierError(f"the lock file of tier {tier.name} ({path}) keeps being replaced")

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Give the tier up (idempotent): unlink the lock file, then drop the lock."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # Unlinked while still locked: a taker that opened the old file
            # sees that the path moved on and starts over (see take()).
            if _names(self.path, fd):
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            os.close(fd)


class TierLocks:
    """The tiers one cache-meta owns: all of them or none (a ``with`` block releases)."""

    def __init__(self, locks: list[TierLock]) -> None:
        self.locks = locks

    @classmethod
    def take(cls, tiers: Iterable[Tier]) -> TierLocks:
        """Own every tier, or raise (:class:`TierLocked` first of all) holding none."""
        taken: list[TierLock] = []
        try:
            for tier in tiers:
                taken.append(TierLock.take(tier))
        except BaseException:
            for lock in reversed(taken):
                lock.release()
            raise
        return cls(taken)

    def release(self) -> None:
        for lock in reversed(self.locks):
            lock.release()

    def __enter__(self) -> TierLocks:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _write_holder(fd: int) -> None:
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _refusal(tier: Tier, path: Path, fd: int) -> TierLocked:
    try:
        text = os.pread(fd, _HOLDER_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    holder = int(text) if text.isdigit() else None
    who = f"pid {holder}" if holder is not None else "a process that did not say"
    return TierLocked(
        f"tier {tier.name} ({tier.root}) is owned by another cache-meta ({who}); "
        f"refusing to start without touching it (lock {path})",
        details={"tier": tier.name.value, "lock": str(path), "holder_pid": holder},
    )
