"""The mover: copies of rows between tiers, made off cache-meta's loop (SPEC C12).

cache-meta decides every move (:mod:`llamad.cache.moves`) and changes the
index; the :class:`Mover` only does the file work, on threads in
cache-meta's process, and hands each :class:`~llamad.cache.moves.MoveResult`
back through a queue and an eventfd that cache-meta's loop polls. Why threads
in cache-meta, not the writer pool:

- The writer pool lives in the processes that own KV bytes (model
  workers); the cache must move its rows with no model loaded (C11), and a
  move's bytes are already in a file, which cache-meta's process can read
  as well as any.
- Everything slow releases the GIL (``link``, ``preadv``/``write``,
  ``fdatasync``, ``fsync``; CRC32C of a chunk is a hardware instruction
  loop); the loop's lookups pay a lock hand-off per 8 MiB chunk at most.
- A mover dies with cache-meta, and every state a move can leave is
  recovered by the next start's scan (below).

A move makes the destination file with the same crash-safe steps as a
publish (C5), and tells cache-meta only once they are done:

1. validate the source's header and TLV against its key (a damaged copy is
   deleted, counted once, never spread);
2. same filesystem: ``link(2)`` the source to the destination's final name,
   a hard link, no byte copied (``ram`` and the default ``ram_file``
   directory are both on ``/dev/shm``); otherwise write
   ``<key>.kvc.<writer>.tmp`` (``O_EXCL``, ``fallocate``, then the bytes
   through one reused buffer, the payload's CRC32C checked on the way, so a
   source damaged since it was written is found here and not copied;
   ``fdatasync``) and ``link(2)`` it to the final name;
3. an existing final file (a copy a killed cache-meta made but never
   indexed) is adopted when it parses as this key, else replaced by
   ``rename(2)``;
4. ``fsync`` the destination directory; report.

Killed at any point: before 2 there is nothing; after a tmp write, a
``*.tmp`` file the next scan deletes; after the link, a complete file the
next scan adopts as the row's copy in that tier. The source is never
touched: cache-meta deletes a demoted copy's file itself, after it has
indexed the destination.

Two lanes, one thread each, started on first use: links (instant) never
wait behind a copy of gigabytes to disk.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import threading
from collections import deque
from collections.abc import Callable, Mapping
from enum import IntEnum
from pathlib import Path
from typing import Final

import structlog

from llamad.cache.activity import CopyActivity
from llamad.cache.checksum import crc32c
from llamad.cache.counters import CounterAdd
from llamad.cache.errors import KvcCorrupt, TierError, TierFull
from llamad.cache.kvc import KvcMeta, read_meta
from llamad.cache.moves import MoveJob, MoveResult
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier, discard_damaged

__all__ = ["MoveStage", "Mover", "move_file"]

log = structlog.get_logger("llamad.cache.mover")

# Bytes per read and write: large enough that the per-call GIL round trip is
# noise, small enough that a stop is noticed within a few milliseconds.
_CHUNK: Final = 8 << 20


class MoveStage(IntEnum):
    """Points after which :func:`move_file` calls its hook (fault tests)."""

    VALIDATED = 1
    WRITTEN = 2
    """The tmp file is complete and fdatasync'ed (copies only)."""
    LINKED = 3
    """The final name exists (not yet synced, not yet reported)."""
    SYNCED = 4


MoveHook = Callable[[MoveStage, MoveJob], None]


class _Stopped(Exception):
    pass


def _nothing() -> None:
    pass


def _noop(stage: MoveStage, job: MoveJob) -> None:
    return None


def _unlink_quietly(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def move_file(
    src: Tier,
    dst: Tier,
    job: MoveJob,
    *,
    counters: CounterAdd | None = None,
    hook: MoveHook | None = None,
    stopping: Callable[[], bool] = lambda: False,
    on_chunk: Callable[[], None] = _nothing,
) -> MoveResult:
    """Make ``job``'s copy in ``dst`` (see the module doc); never raises for I/O.
    ``on_chunk`` is called before each chunk a copy reads (the copy is alive)."""
    hook = hook or _noop
    try:
        return _move(
            src, dst, job, counters=counters, hook=hook, stopping=stopping, on_chunk=on_chunk
        )
    except _Stopped:
        return MoveResult(job.id, None, error="stopped")
    except (OSError, TierError) as exc:
        return MoveResult(job.id, None, error=f"{type(exc).__name__}: {exc}")


def _move(
    src: Tier,
    dst: Tier,
    job: MoveJob,
    *,
    counters: CounterAdd | None,
    hook: MoveHook,
    stopping: Callable[[], bool],
    on_chunk: Callable[[], None],
) -> MoveResult:
    if src.key_of(job.src_location) != job.key:
        return MoveResult(job.id, None, error="the source is not this key's file")
    source = Path(job.src_location)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return MoveResult(job.id, None, error="source missing", source_missing=True)
    try:
        try:
            meta = read_meta(fd, expected_key=job.key)
        except KvcCorrupt as exc:
            log.warning("cache.corrupt_file", tier=src.name, path=str(source), reason=exc.reason)
            discard_damaged(src, source, counters)
            return MoveResult(
                job.id, None, error=f"source damaged: {exc.reason}", source_damaged=True
            )
        hook(MoveStage.VALIDATED, job)
        final = dst.path_for(job.key)
        linked = False
        if _same_filesystem(source, dst.root):
            linked = _link_final(source, final, dst, job)
        if not linked:
            try:
                tmp = _write_tmp(fd, dst, job, meta, stopping=stopping, on_chunk=on_chunk)
            except KvcCorrupt as exc:
                log.warning(
                    "cache.corrupt_file", tier=src.name, path=str(source), reason=exc.reason
                )
                discard_damaged(src, source, counters)
                return MoveResult(
                    job.id, None, error=f"source damaged: {exc.reason}", source_damaged=True
                )
            hook(MoveStage.WRITTEN, job)
            try:
                _link_final(tmp, final, dst, job, replace_with=tmp)
            finally:
                _unlink_quietly(tmp)
    finally:
        os.close(fd)
    hook(MoveStage.LINKED, job)
    dst.sync_dir()
    hook(MoveStage.SYNCED, job)
    return MoveResult(job.id, str(final), size=meta.file_size, linked=linked)


def _same_filesystem(path: Path, root: Path) -> bool:
    try:
        return os.stat(path).st_dev == os.stat(root).st_dev
    except FileNotFoundError:
        return False


def _link_final(
    source: Path, final: Path, dst: Tier, job: MoveJob, *, replace_with: Path | None = None
) -> bool:
    """``link(2)`` ``source`` to ``final``; whether the final name now holds the row.

    An existing final file of this key (a copy made before a crash and never
    indexed) is kept when it parses as this key; anything else there is
    replaced atomically. Without ``replace_with`` (a direct link of the
    source), a filesystem boundary answers False: the caller copies.
    """
    try:
        os.link(source, final)
        return True
    except FileExistsError:
        pass
    except OSError as exc:
        if replace_with is None and exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            return False
        raise
    try:
        dst.read_meta(final)
        log.info("cache.move_adopted", key=job.key.hex(), tier=dst.name)
        return True
    except Exception as exc:  # junk or damaged: replaced below
        log.info("cache.move_replaced", key=job.key.hex(), tier=dst.name, why=str(exc))
    if replace_with is None:
        # A direct link: put a second name on the source beside the final one,
        # then swap it in (readers see the old file or ours, never none).
        replace_with = dst.tmp_path_for(job.key, f"mv-{os.getpid()}-{job.id}")
        try:
            os.link(source, replace_with)
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                return False
            raise
    os.rename(replace_with, final)
    return True


def _write_tmp(
    fd: int,
    dst: Tier,
    job: MoveJob,
    meta: KvcMeta,
    *,
    stopping: Callable[[], bool],
    on_chunk: Callable[[], None],
) -> Path:
    """The copy as ``<key>.kvc.<writer>.tmp`` in ``dst``: whole, fdatasync'ed.

    Raises :class:`KvcCorrupt` (the tmp file removed) when the payload read
    does not match its checksum, or the file ends early.
    """
    size = meta.file_size
    tmp, out = dst.create_tmp(job.key, f"mv-{os.getpid()}-{job.id}", size)
    try:
        buffer = bytearray(min(_CHUNK, size))
        view = memoryview(buffer)
        crc = 0
        done = 0
        while done < size:
            if stopping():
                raise _Stopped
            on_chunk()
            n = os.preadv(fd, [view[: min(_CHUNK, size - done)]], done)
            if n <= 0:
                raise KvcCorrupt("truncated", f"{job.src_location} ended at {done} of {size}")
            chunk = view[:n]
            if done + n > meta.payload_offset:
                crc = crc32c(chunk[max(0, meta.payload_offset - done) :], crc)
            written = 0
            while written < n:
                written += os.write(out, chunk[written:])
            done += n
        if crc != meta.payload_crc32c:
            raise KvcCorrupt("payload_crc", "payload checksum mismatch")
        os.fdatasync(out)
    except BaseException as exc:
        os.close(out)
        _unlink_quietly(tmp)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise TierFull(f"{dst.name} has no room for {size} bytes") from exc
        raise
    os.close(out)
    return tmp


class Mover:
    """Runs :class:`~llamad.cache.moves.MoveJob` s on two threads (see the module doc).

    :meth:`submit` never blocks; finished moves are collected with
    :meth:`drain` once :meth:`fileno` is readable. ``hook`` is called after
    each :class:`MoveStage` (fault tests stop or kill the process there).
    """

    def __init__(
        self,
        tiers: Mapping[TierKind, Tier],
        *,
        counters: CounterAdd | None = None,
        hook: MoveHook | None = None,
        activity: CopyActivity | None = None,
    ) -> None:
        self.tiers = dict(tiers)
        self.counters = counters
        self.hook = hook
        self.activity = activity
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._lock = threading.Lock()
        self._queues: dict[bool, deque[MoveJob]] = {True: deque(), False: deque()}
        self._wake = {True: threading.Condition(self._lock), False: threading.Condition(self._lock)}
        self._threads: dict[bool, threading.Thread] = {}
        self._done: deque[MoveResult] = deque()
        self._stop = threading.Event()
        self._devices: dict[TierKind, int | None] = {}

    def fileno(self) -> int:
        """Readable when moves have finished (poll it, then :meth:`drain`)."""
        return self._fd

    def _device(self, tier: TierKind) -> int | None:
        if tier not in self._devices:
            try:
                self._devices[tier] = os.stat(self.tiers[tier].root).st_dev
            except (KeyError, OSError):
                return None
        return self._devices[tier]

    def submit(self, job: MoveJob) -> None:
        """Queue a move; its result comes back through :meth:`drain`."""
        src, dst = self._device(job.src_tier), self._device(job.dst_tier)
        # A move between tiers on one filesystem is a link: its own lane, so it
        # never waits behind a copy.
        lane = src is not None and src == dst
        with self._lock:
            if self._stop.is_set():
                self._finish(MoveResult(job.id, None, error="stopped"))
                return
            self._queues[lane].append(job)
            if lane not in self._threads:
                thread = threading.Thread(
                    target=self._run,
                    args=(lane,),
                    name="kvc-mover-link" if lane else "kvc-mover-copy",
                    daemon=True,
                )
                self._threads[lane] = thread
                thread.start()
            self._wake[lane].notify()

    def _run(self, lane: bool) -> None:
        queue, wake = self._queues[lane], self._wake[lane]
        while True:
            with self._lock:
                while not queue and not self._stop.is_set():
                    wake.wait()
                if self._stop.is_set():
                    return
                job = queue.popleft()
            # Copies (not links) are marked on the activity board: a model
            # worker decoding on every core halves its short steps meanwhile.
            activity = None if lane else self.activity
            if activity is not None:
                activity.begin()
            try:
                result = move_file(
                    self.tiers[job.src_tier],
                    self.tiers[job.dst_tier],
                    job,
                    counters=self.counters,
                    hook=self.hook,
                    stopping=self._stop.is_set,
                    on_chunk=_nothing if activity is None else activity.touch,
                )
            except Exception as exc:  # a bug must not lose the job: report it failed
                log.exception("cache.mover_failed", key=job.key.hex())
                result = MoveResult(job.id, None, error=repr(exc))
            finally:
                if activity is not None:
                    activity.end()
            with self._lock:
                self._finish(result)

    def _finish(self, result: MoveResult) -> None:
        # Under the lock: close() may not retire the fd (whose number the
        # process may reuse at once) between the check and the write.
        self._done.append(result)
        if self._fd >= 0:
            with contextlib.suppress(BlockingIOError):
                os.eventfd_write(self._fd, 1)

    def drain(self) -> list[MoveResult]:
        """The moves finished since the last call."""
        with self._lock:
            if self._fd >= 0:
                with contextlib.suppress(BlockingIOError):
                    os.eventfd_read(self._fd)
            done = list(self._done)
            self._done.clear()
        return done

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a finished move; whether one is there."""
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        return bool(ready)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop: queued moves are dropped, a copy in progress ends at its next
        chunk (its tmp file removed); waits up to ``timeout`` for the threads."""
        with self._lock:
            self._stop.set()
            for lane, queue in self._queues.items():
                queue.clear()
                self._wake[lane].notify_all()
        for thread in list(self._threads.values()):
            if thread is not threading.current_thread():
                thread.join(timeout)

    def close(self) -> None:
        """:meth:`stop`, then close the eventfd (the loop must have let go of it)."""
        self.stop()
        with self._lock:
            fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)
