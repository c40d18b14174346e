"""The writer pool (SPEC C6): saves off the caller's hot path, under a daemon-wide cap.

Threads, not processes, and they live in the process that owns the KV bytes
(the model worker, or any other saver). Why:

- The payload is already in that process's memory, packed by
  ``llama_state_seq_get_data`` into a buffer. A writer process would need the
  bytes copied into shared memory first: one more full copy of up to a
  gigabyte per save, on the same memory bus the decode loop needs.
- Everything slow in a save releases the GIL (``pwrite``, ``fdatasync``,
  CRC32C, ``link``), so a writer thread costs the decode loop little more
  than the memory bandwidth it uses, which a process would use too.
- A writer can only die with its process. cache-meta watches the owner of
  every reservation (its pid) and reaps them the moment the process is gone,
  so a writer's death is noticed without waiting for a reservation's TTL; a
  thread that fails with an exception cancels its own reservation.

The global cap is a :class:`PermitSet`: N byte-range OFD locks on one file in
the daemon's runtime directory, shared by every process. A save holds one
from submission until it is done, and the kernel releases it if the holder
dies, so a permit can never leak. An async save that finds no free permit
is dropped at once (``saves_dropped``) rather than queued: the caller keeps
decoding and a later save will cover the same prefix. Synchronous saves
(evict, shutdown) wait for a permit up to their timeout.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import structlog

from llamad.cache.client import CacheClient
from llamad.cache.counters import CounterAdd
from llamad.cache.errors import InvalidCacheValue, SaveRefused
from llamad.cache.kvc import KvcSpec
from llamad.cache.oslocks import try_lock_range, unlock_range
from llamad.cache.publish import PublishMeta, PublishOutcome, PublishResult, StageHook, publish
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier, build_tiers

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from llamad.cache.settings import CacheSettings

log = structlog.get_logger("llamad.cache.writer")

MAX_PERMITS: Final = 1024
_POLL_MIN_S: Final = 0.001
_POLL_MAX_S: Final = 0.02


class Permit:
    """One held save slot; release it exactly once (the kernel does if we die)."""

    def __init__(self, fd: int, slot: int) -> None:
        self._fd = fd
        self.slot = slot
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        with self._lock:
            if self._fd < 0:
                return
            fd, self._fd = self._fd, -1
        try:
            unlock_range(fd, self.slot, 1)
        finally:
            os.close(fd)

    def __enter__(self) -> Permit:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class PermitSet:
    """The daemon-wide cap on concurrent saves: ``n`` slots, one byte each, in one file."""

    def __init__(self, path: Path, n: int) -> None:
        self.path = path
        self.n = n

    @classmethod
    def create(cls, path: str | os.PathLike[str], n: int) -> PermitSet:
        """Create (or resize) the permit file; cache-meta does this whenever it starts.

        Idempotent: the file is never truncated to zero, and the permits live
        writers hold are locks on it, which survive a second ``create``.
        """
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PERMITS:
            raise InvalidCacheValue("permits", f"{n!r} is not in [1, {MAX_PERMITS}]")
        path = Path(path)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, n)
        finally:
            os.close(fd)
        return cls(path, n)

    @classmethod
    def attach(cls, path: str | os.PathLike[str]) -> PermitSet:
        """Use the permit file the daemon created."""
        path = Path(path)
        try:
            n = path.stat().st_size
        except FileNotFoundError:
            raise InvalidCacheValue("permits", f"no permit file at {path}") from None
        if not 1 <= n <= MAX_PERMITS:
            raise InvalidCacheValue("permits", f"{path} is not a permit file")
        return cls(path, n)

    def try_acquire(self) -> Permit | None:
        """A free permit, or None when all ``n`` are held (never blocks)."""
        # Each permit gets its own open file description: OFD locks taken
        # through different descriptions conflict even inside one process.
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        for slot in range(self.n):
            if try_lock_range(fd, slot, 1):
                return Permit(fd, slot)
        os.close(fd)
        return None

    def acquire(self, timeout_s: float) -> Permit | None:
        """Wait up to ``timeout_s`` for a permit; None on timeout."""
        deadline = time.monotonic() + timeout_s
        pause = _POLL_MIN_S
        while True:
            permit = self.try_acquire()
            if permit is not None:
                return permit
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # No kernel wait covers "any of n ranges"; a short backoff poll is
            # cheap next to the save it waits for.
            time.sleep(min(pause, left))
            pause = min(pause * 2, _POLL_MAX_S)

    def held(self) -> int:
        """How many permits are held right now, by anyone (for status and tests)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            held = 0
            for slot in range(self.n):
                if try_lock_range(fd, slot, 1):
                    unlock_range(fd, slot, 1)
                else:
                    held += 1
            return held
        finally:
            os.close(fd)


DoneCallback = Callable[["Future[PublishResult]"], None]


class WriterPool:
    """Async and sync saves for one process, sharing the daemon-wide permits.

    ``connect`` makes the cache-meta connection a writer thread uses (called
    once per thread: ``lambda: CacheClient.from_settings(settings)``). With
    ``warm``, a row saved to ``ram`` is mapped into this process right after
    it is published (see :class:`~llamad.cache.tiers.SegmentMaps`). The
    caller hands over a payload buffer and must leave it untouched until the
    returned future is done (``on_done`` is the place to recycle it).
    """

    def __init__(
        self,
        connect: Callable[[], PublishMeta],
        tiers: Mapping[TierKind, Tier],
        permits: PermitSet,
        *,
        counters: CounterAdd | None = None,
        threads: int = 2,
        on_stage: StageHook | None = None,
        warm: bool = True,
    ) -> None:
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
            raise InvalidCacheValue("threads", f"{threads!r} is not in [1, 64]")
        self._connect = connect
        self.tiers = dict(tiers)
        self.permits = permits
        self.counters = counters
        self._on_stage = on_stage
        self.warm = warm
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kvc-writer")
        self._lock = threading.Lock()
        self._in_flight = 0
        # Saves accepted and not ended yet (their mapping after the publish
        # included), and a count bumped as each is accepted and as it ends:
        # quiet_epoch's two readings.
        self._running = 0
        self._epoch = 0
        self._closed = False
        self._local = threading.local()
        self._metas: list[PublishMeta] = []

    @classmethod
    def from_settings(
        cls, settings: CacheSettings, *, client_name: str = "cache-writer", **kwargs: Any
    ) -> WriterPool:
        """A pool for the cache ``settings`` describe: its tiers, its cache-meta, and the
        daemon-wide permits cache-meta created at start (``kwargs`` as for the constructor).
        """
        return cls(
            lambda: CacheClient.from_settings(settings, client_name=client_name),
            build_tiers(list(settings.tiers)),
            settings.attach_permits(),
            **kwargs,
        )

    def _meta(self) -> PublishMeta:
        # A CacheClient is one connection and not thread-safe: each writer
        # thread (and each thread calling save_sync) gets its own.
        meta: PublishMeta | None = getattr(self._local, "meta", None)
        if meta is None:
            meta = self._connect()
            self._local.meta = meta
            with self._lock:
                self._metas.append(meta)
        return meta

    def _tier(
        self, kind: TierKind | None, tiers: Collection[TierKind] | None = None
    ) -> Tier | dict[TierKind, Tier]:
        """The tier to write, or (``kind`` None) those cache-meta may choose from."""
        if kind is None:
            allowed = {k: t for k, t in self.tiers.items() if tiers is None or k in tiers}
            if not allowed:
                raise InvalidCacheValue("tiers", "none of them is configured")
            return allowed
        try:
            return self.tiers[kind]
        except KeyError:
            raise InvalidCacheValue("tier", f"tier {kind!r} is not configured") from None

    def _dropped(self, spec: KvcSpec, tier: TierKind | None, why: str) -> None:
        if self.counters is not None:
            self.counters.add("saves_dropped")
        log.info("cache.save_dropped", key=spec.key.hex(), tier=tier, why=why)

    def in_flight(self) -> int:
        """Saves accepted by this pool and not finished yet."""
        with self._lock:
            return self._in_flight

    def quiet_epoch(self) -> int | None:
        """None from a save's acceptance until it has ended (its CRC, copy
        and the mapping after it); otherwise a count that moves each time one
        is accepted or ends. Two equal readings mean no save ran between them.

        The thread governor reads it around each decode step: a save's
        threads take the very cores the step's threads wait for at every
        barrier, so a step beside one reads slow (a 23-row step at 3x its
        median during a 2,048-token row's save) while nothing outside the
        worker is busy. Such a step is no sign of the machine's load.
        """
        with self._lock:
            return None if self._running else self._epoch

    def _began(self) -> None:
        # Under self._lock.
        self._running += 1
        self._epoch += 1

    def _ended(self) -> None:
        with self._lock:
            self._running -= 1
            self._epoch += 1

    def save_async(
        self,
        spec: KvcSpec,
        tier: TierKind | None,
        payload: Buffer,
        *,
        on_done: DoneCallback | None = None,
        tiers: Collection[TierKind] | None = None,
    ) -> Future[PublishResult] | None:
        """Start a save in the background; None when it was dropped under back-pressure.

        ``tier`` None lets cache-meta choose the tier (among ``tiers`` when
        given). Returns at once either way: the caller's loop never waits for I/O.
        """
        target = self._tier(tier, tiers)
        with self._lock:
            if self._closed:
                self._dropped(spec, tier, "closed")
                return None
            permit = self.permits.try_acquire()
            if permit is None:
                self._dropped(spec, tier, "no_permit")
                return None
            self._in_flight += 1
            self._began()
        try:
            future = self._executor.submit(self._run, permit, target, spec, payload)
        except BaseException:
            permit.release()
            with self._lock:
                self._in_flight -= 1
            self._ended()
            raise
        future.add_done_callback(lambda f: self._never_ran(f, permit))
        if on_done is not None:
            future.add_done_callback(on_done)
        return future

    def _never_ran(self, future: Future[PublishResult], permit: Permit) -> None:
        # A save cancelled by close(wait=False) never reaches _run's cleanup.
        if future.cancelled():
            permit.release()
            with self._lock:
                self._in_flight -= 1
            self._ended()

    def save_sync(
        self,
        spec: KvcSpec,
        tier: TierKind | None,
        payload: Buffer,
        *,
        timeout_s: float,
        tiers: Collection[TierKind] | None = None,
    ) -> PublishResult:
        """Save in the calling thread (evict, shutdown), waiting up to ``timeout_s`` for a permit.

        ``tier`` and ``tiers`` as for :meth:`save_async`. Raises
        :class:`SaveRefused` (after counting ``saves_dropped``) when no permit
        frees up in time.
        """
        target = self._tier(tier, tiers)
        permit = self.permits.acquire(timeout_s)
        if permit is None:
            self._dropped(spec, tier, "permit_timeout")
            raise SaveRefused(
                f"no save permit within {timeout_s:.3f}s", details={"key": spec.key.hex()}
            )
        with self._lock:
            self._in_flight += 1
            self._began()
        return self._run(permit, target, spec, payload)

    def _run(
        self,
        permit: Permit,
        tier: Tier | dict[TierKind, Tier],
        spec: KvcSpec,
        payload: Buffer,
    ) -> PublishResult:
        try:
            try:
                result = publish(self._meta(), tier, spec, payload, on_stage=self._on_stage)
            except BaseException as exc:
                self._dropped(spec, _name(tier), f"{type(exc).__name__}: {exc}")
                raise
            finally:
                permit.release()
                with self._lock:
                    self._in_flight -= 1
            if result.outcome is PublishOutcome.PUBLISHED:
                log.debug("cache.saved", key=spec.key.hex(), tier=result.tier, size=result.size)
            written = None if result.tier is None else self.tiers.get(result.tier)
            if self.warm and result.stored and result.location is not None and written is not None:
                # The saving process is the likeliest to restore this row next
                # (the next turn of the same conversation): map it now, here,
                # rather than on the restore's critical path.
                written.warm(result.location)
            return result
        finally:
            self._ended()

    def close(self, *, wait: bool = True) -> None:
        """Refuse new saves; with ``wait``, let the accepted ones finish.

        Connections the pool opened are closed once no save can use them.
        """
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=wait, cancel_futures=not wait)
        if wait:
            with self._lock:
                metas, self._metas = self._metas, []
            seen: set[int] = set()
            for meta in metas:
                close = getattr(meta, "close", None)
                if close is not None and id(meta) not in seen:
                    seen.add(id(meta))
                    close()


def _name(tier: Tier | Mapping[TierKind, Tier]) -> TierKind | None:
    return tier.name if isinstance(tier, Tier) else None
