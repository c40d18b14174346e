"""The daemon's claim on its places: one daemon per runtime directory and per tier.

A daemon's start acts on files that are only its own while no other daemon
uses them: it removes the front's table (``front.models``) of "the previous
run", purges the ``ram`` segments of its instance, and cache-meta then
attaches the counters, recreates the writer permits at *its*
``save_permits``, and scans, cleans and evicts in every tier. A second daemon
sharing any of those places (the same config started twice, the same
runtime directory under another instance, the same instance or tier folder
under another runtime directory) would damage the first before anything
refused it. So the root takes, first of all, an exclusive lock on each place
it will use, and a daemon that finds one held exits
:data:`~llamad.daemon.main.EXIT_IN_USE` naming every place held, having read,
written, truncated and deleted nothing there.

The places (:func:`daemon_places`):

- the **runtime directory**, and every directory holding the cache's own
  files (the counters and the writer permits; in a daemon they live in the
  runtime directory, beside the registry and the front's table);
- every configured **tier** (quota above 0): ``ram_file``'s and ``disk``'s
  root directory, and ``ram``'s segments in ``/dev/shm``, which every
  instance shares, so its lock carries the instance prefix like the segments
  (``llamad-ram.<instance>.daemon.lock``) and guards exactly those.

The state directory holds nothing of its own: only the ``disk`` tier's
default root (``<state_dir>/kvc``), which is locked as a tier.

Each lock is ``flock(LOCK_EX | LOCK_NB)`` on a file ``daemon.lock`` in the
place, held by the root for its whole life on a descriptor no child inherits
(``O_CLOEXEC``; children are started by fork+exec). ``flock`` belongs to the
open file description, and the kernel drops it when the last descriptor of
it closes: when the root exits, SIGKILL included, so a killed daemon never
blocks the next start. Nothing waits on a lock: taking it succeeds at once or
is refused. These are not cache-meta's tier locks
(:mod:`llamad.cache.tier_lock`: OFD locks on ``cache-meta.lock``), which stay:
they are taken by whichever process runs cache-meta (a restarted cache-meta
inside a running daemon takes them again while the root holds its own, on
other files, with another kind of lock that never conflicts with them), and
they guard a cache run without a daemon (``examples/cache_standalone.py``).

The file's contents (the holder's pid) are only for the refusal's message;
the lock alone decides. A release unlinks the file while still holding the
lock; a taker checks after locking that the path still names the file it
locked, and starts over if not, so removing the file never lets two daemons
in. A refused taker only opens the file (creating it if it was missing) and
reads it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Final

import structlog

from llamad.cache.tiers import Tier
from llamad.errors import ConfigError, DaemonInUse

if TYPE_CHECKING:
    from llamad.config import LlamadConfig

__all__ = ["LOCK_NAME", "DaemonClaim", "Place", "daemon_places"]

log = structlog.get_logger("llamad.daemon.claim")

LOCK_NAME: Final = "daemon.lock"
"""The lock file's name in each place (a ``ram`` tier's carries its prefix).
Never a row's or a tmp file's name, so the tiers' scans and purges leave it."""

# A taker starts over when the file it locked was unlinked (released) under
# it; only a release racing every attempt could exhaust these.
_ATTEMPTS: Final = 8
_HOLDER_BYTES: Final = 64


@dataclass(frozen=True, slots=True)
class Place:
    """One place a daemon owns: ``what`` it is (for messages), the config
    ``key`` that sets it, the ``directory`` it lives in (created 0700 if
    missing) and its lock file."""

    what: str
    key: str
    directory: Path
    lock: Path


def daemon_places(config: LlamadConfig) -> list[Place]:
    """Every place a daemon running ``config`` will read, write or delete in,
    in the order they are locked: runtime directory, then the tiers fastest first."""
    settings = config.cache_settings()
    places: list[Place] = []
    dirs = [config.runtime_dir, settings.counters_path.parent, settings.permits_file().parent]
    for d in dict.fromkeys(dirs):
        # The daemon keeps the cache's files in the runtime directory; a
        # directory of their own would be locked the same way.
        what = "runtime directory" if d == config.runtime_dir else "cache files directory"
        places.append(Place(f"{what} {d}", "daemon.runtime_dir", d, d / LOCK_NAME))
    for cfg in settings.tiers:
        tier = Tier(cfg)
        if tier.prefix:
            what, key = f"tier {tier.name.value} {tier.root}/{tier.prefix}*", "cache.instance"
        else:
            what, key = f"tier {tier.name.value} {tier.root}", f"cache.{tier.name.value}.root"
        places.append(Place(what, key, tier.root, tier.root / (tier.prefix + LOCK_NAME)))
    return places


class _Held:
    def __init__(self, place: Place, fd: int) -> None:
        self.place = place
        self.fd: int | None = fd

    def release(self) -> None:
        fd, self.fd = self.fd, None
        if fd is None:
            return
        try:
            # Unlinked while still locked: a taker that opened the old file
            # sees that the path moved on and starts over (see _take).
            if _names(self.place.lock, fd):
                with contextlib.suppress(FileNotFoundError):
                    self.place.lock.unlink()
        finally:
            os.close(fd)


class DaemonClaim:
    """The places one daemon holds: all of them or none (a ``with`` block releases)."""

    def __init__(self, held: list[_Held]) -> None:
        self._held = held

    @property
    def places(self) -> list[Place]:
        return [h.place for h in self._held if h.fd is not None]

    @classmethod
    def take(cls, places: Sequence[Place]) -> DaemonClaim:
        """Lock every place, or raise :class:`~llamad.errors.DaemonInUse` naming
        every one held by another process (and its pid), holding none.

        Each place is tried even after a refusal, so the message names all
        that collide. Creates a missing place's directory (0700, parents too);
        in a held place it only opens and reads the lock file. A place that
        cannot be used at all (no permission, a read-only filesystem) raises
        :class:`~llamad.errors.ConfigError` naming its config key.
        """
        taken: list[_Held] = []
        refused: list[tuple[Place, int | None]] = []
        try:
            for place in places:
                fd, holder = _take(place)
                if fd is None:
                    refused.append((place, holder))
                else:
                    taken.append(_Held(place, fd))
        except BaseException:
            for h in reversed(taken):
                h.release()
            raise
        if refused:
            for h in reversed(taken):
                h.release()
            raise _refusal(refused)
        for h in taken:
            log.debug("daemon.place_locked", place=h.place.what, lock=str(h.place.lock))
        return cls(taken)

    def release(self) -> None:
        """Give every place up (idempotent): each lock file is unlinked, then unlocked."""
        for h in reversed(self._held):
            h.release()

    def __enter__(self) -> DaemonClaim:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _prepare(directory: Path) -> None:
    # Missing parents 0700 too (mkdir(parents=True) would use the umask), as
    # the tiers make their own roots.
    missing = [d for d in (directory, *directory.parents) if not d.exists()]
    for d in reversed(missing):
        d.mkdir(mode=0o700, exist_ok=True)


def _take(place: Place) -> tuple[int | None, int | None]:
    """``(fd, None)`` holding ``place``, or ``(None, holder_pid)`` when another holds it."""
    try:
        _prepare(place.directory)
    except OSError as exc:
        raise _unusable(place, f"cannot create {place.directory}: {exc}") from exc
    for _ in range(_ATTEMPTS):
        try:
            fd = os.open(place.lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise _unusable(place, f"cannot open its lock file {place.lock}: {exc}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                    raise
                holder = _holder(fd)
                os.close(fd)
                return None, holder
            if _names(place.lock, fd):
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return fd, None
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise
        # The holder released (and unlinked) the file between our open and
        # our lock: the lock we hold is on a file nobody else will open.
        os.close(fd)
    raise DaemonInUse(
        f"the lock file of {place.what} ({place.lock}) keeps being replaced",
        details={"place": place.what, "lock": str(place.lock)},
    )


def _unusable(place: Place, problem: str) -> ConfigError:
    # Not a collision: the place cannot be used at all (permissions, a
    # read-only filesystem, a path through a file), which only the
    # configuration can change.
    return ConfigError(
        f"{place.key}: {place.what} is unusable: {problem}", details={"field": place.key}
    )


def _names(path: Path, fd: int) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, _HOLDER_BYTES, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _refusal(refused: Iterable[tuple[Place, int | None]]) -> DaemonInUse:
    refused = list(refused)
    parts = [
        f"{place.what} (pid {pid})" if pid is not None else f"{place.what} (pid unknown)"
        for place, pid in refused
    ]
    return DaemonInUse(
        "another llamad daemon holds "
        + ", ".join(parts)
        + "; refusing to start, nothing there was changed",
        details={
            "held": [
                {"place": place.what, "lock": str(place.lock), "holder_pid": pid}
                for place, pid in refused
            ]
        },
    )
