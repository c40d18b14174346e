"""The writer's side of the crash-safe publish protocol (SPEC C5).

One save, from payload in memory to a row readers can find::

    1 reserve_save        cache-meta claims the key for this writer (token), in the
                          tier asked for or, with none, the fastest that can take it
    2 write tmp           <key>.kvc.<writer>.tmp, O_EXCL, whole file, fdatasync
    3 check_reservation   still ours? (else delete the tmp and abandon)
    4 link(2)             tmp -> <key>.kvc; EEXIST: adopt the existing file when it
                          parses as this key and size, else replace it; then
                          mark_published and unlink the tmp name
    5 fsync(dir)          the link and unlink are durable
      announce_saved      cache-meta indexes the row and wakes waiters

A writer may die anywhere; every state it can leave is recoverable: before 4
there is only a tmp file (deleted by the next scan) and a reservation that
cache-meta drops when it sees the owner die or the TTL pass; from 3 on the
final file may exist, and cache-meta's reaper adopts it if it parses, or
unlinks it. The final name only ever appears through ``link(2)``/``rename(2)``
of a complete, fdatasync'ed file, so a reader can never see a partial row.

:func:`publish` talks to cache-meta through :class:`PublishMeta`, so it runs
against the real ``CacheClient`` in production and against a
:class:`LocalMeta` around an in-process ``CacheMeta`` in unit tests; stage
hooks let fault tests stop (or SIGKILL) the writer after any stage.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import TYPE_CHECKING, Protocol

import structlog

from llamad.cache.errors import AlreadyCached, CacheFull, PublishAbandoned, SaveInFlight
from llamad.cache.kvc import KvcSpec, write_kvc
from llamad.cache.reservation import Grant, Owner, SaveIntent
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import RowMissing, Tier

if TYPE_CHECKING:
    from typing_extensions import Buffer

    from llamad.cache.meta import CacheMeta

log = structlog.get_logger("llamad.cache.publish")


class PublishMeta(Protocol):
    """The cache-meta operations a writer needs (``CacheClient`` provides them)."""

    def reserve(self, intent: SaveIntent, *, tiers: Collection[TierKind] | None = None) -> Grant:
        """Stage 1: the token and the tier to write (``intent.tier``, or cache-meta's
        choice among ``tiers``); raises ``AlreadyCached``, ``SaveInFlight`` or
        ``CacheFull``."""
        ...

    def check_reservation(self, key: bytes, token: int) -> None:
        """Stage 3; raises ``PublishAbandoned`` when the token is no longer live."""
        ...

    def mark_published(self, key: bytes, token: int, location: str) -> None:
        """Stage 4 done: the final file exists at ``location``."""
        ...

    def announce_saved(
        self, key: bytes, token: int, *, location: str | None = None, size: int | None = None
    ) -> object:
        """Stage 5: the row is durable; index it and wake its waiters."""
        ...

    def cancel_reservation(self, key: bytes, token: int) -> bool:
        """The writer gave up before linking."""
        ...


class LocalMeta:
    """:class:`PublishMeta` over an in-process ``CacheMeta`` with a fixed owner."""

    def __init__(self, meta: CacheMeta, owner: Owner | None = None) -> None:
        self.meta = meta
        self.owner = os.getpid() if owner is None else owner
        self._lock = threading.Lock()  # CacheMeta is single-caller; writer threads are not

    def reserve(self, intent: SaveIntent, *, tiers: Collection[TierKind] | None = None) -> Grant:
        with self._lock:
            return self.meta.reserve(
                intent, self.owner, tiers=None if tiers is None else frozenset(tiers)
            )

    def reserve_save(self, intent: SaveIntent) -> int:
        return self.reserve(intent).token

    def check_reservation(self, key: bytes, token: int) -> None:
        with self._lock:
            self.meta.check_reservation(key, token)

    def mark_published(self, key: bytes, token: int, location: str) -> None:
        with self._lock:
            self.meta.mark_published(key, token, location)

    def announce_saved(
        self, key: bytes, token: int, *, location: str | None = None, size: int | None = None
    ) -> object:
        with self._lock:
            return self.meta.announce_saved(key, token, location=location, size=size)

    def cancel_reservation(self, key: bytes, token: int) -> bool:
        with self._lock:
            return self.meta.cancel_reservation(key, token)


class PublishStage(IntEnum):
    """Points after which :func:`publish` calls its ``on_stage`` hook."""

    RESERVED = 1
    WRITTEN = 2
    CHECKED = 3
    LINKED = 4
    SYNCED = 5
    ANNOUNCED = 6


StageHook = Callable[[PublishStage, bytes], None]


class PublishOutcome(StrEnum):
    PUBLISHED = "published"
    """Our file is the row (linked, or replaced a junk or foreign file)."""
    ADOPTED = "adopted"
    """A valid file of this key was already there (an unannounced orphan); it is the row."""
    DUPLICATE = "duplicate"
    """The key is cached or being saved by someone else; nothing was written."""
    REFUSED = "refused"
    """cache-meta had no room (``CacheFull``); nothing was written."""
    ABANDONED = "abandoned"
    """Our reservation was superseded or expired; our tmp file was removed."""


@dataclass(frozen=True, slots=True)
class PublishResult:
    """What a save came to; ``tier`` is where it went (None: refused before
    cache-meta chose one)."""

    outcome: PublishOutcome
    key: bytes
    tier: TierKind | None
    size: int
    location: str | None = None

    @property
    def stored(self) -> bool:
        """True when the key is now a row (ours or an adopted one)."""
        return self.outcome in (PublishOutcome.PUBLISHED, PublishOutcome.ADOPTED)


_writer_seq = itertools.count(1)


def new_writer_id() -> str:
    """A name for one save attempt, unique across processes and threads (``pid-tid-n``)."""
    return f"{os.getpid()}-{threading.get_ident():x}-{next(_writer_seq)}"


def _noop(stage: PublishStage, key: bytes) -> None:
    return None


def _unlink_quietly(path: os.PathLike[str] | str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _write_tmp(tier: Tier, spec: KvcSpec, payload: Buffer, writer: str, size: int) -> str:
    path, fd = tier.create_tmp(spec.key, writer, size)
    try:
        written = write_kvc(fd, spec, payload)
        if written != size:  # pragma: no cover - file_size and write_kvc agree
            raise AssertionError(f"wrote {written} bytes, expected {size}")
        os.fdatasync(fd)
    except BaseException:
        os.close(fd)
        _unlink_quietly(path)
        raise
    os.close(fd)
    return str(path)


def _link(tier: Tier, key: bytes, tmp: str, size: int) -> PublishOutcome:
    """Stage 4's file work: link, or adopt / replace what holds the name."""
    final = tier.path_for(key)
    try:
        os.link(tmp, final)
    except FileExistsError:
        try:
            existing = tier.read_meta(key)
        except RowMissing:
            existing = None
        except Exception as exc:  # junk or damaged: replaced below
            log.info("cache.eexist_replaced", key=key.hex(), tier=tier.name, why=str(exc))
            existing = None
        if existing is not None and existing.file_size == size:
            _unlink_quietly(tmp)
            log.info("cache.eexist_adopted", key=key.hex(), tier=tier.name)
            return PublishOutcome.ADOPTED
        # rename(2) swaps the name to our complete file atomically: readers
        # see the old file or ours, never a missing or partial one.
        os.rename(tmp, final)
        return PublishOutcome.PUBLISHED
    _unlink_quietly(tmp)
    return PublishOutcome.PUBLISHED


def publish(
    meta: PublishMeta,
    tier: Tier | Mapping[TierKind, Tier],
    spec: KvcSpec,
    payload: Buffer,
    *,
    writer: str | None = None,
    on_stage: StageHook | None = None,
) -> PublishResult:
    """Save ``payload`` as the row ``spec`` describes, crash-safely.

    ``tier``: the tier to save to, or the tiers cache-meta may choose from
    (it picks the fastest that can take the row, and says which).

    Returns what happened; refusals (duplicate, no room, superseded) are
    outcomes, not exceptions, because a writer's job is then simply done.
    I/O failures before the link raise (``TierFull``, ``TierError``,
    ``OSError``) after removing the tmp file and cancelling the reservation.
    Failures talking to cache-meta after the link raise and leave the valid
    final file for the reaper or the next startup scan to adopt.
    """
    hook = on_stage or _noop
    writer = writer or new_writer_id()
    key = spec.key
    size = spec.file_size(memoryview(payload).nbytes)
    choices = None if isinstance(tier, Tier) else dict(tier)
    asked = tier.name if isinstance(tier, Tier) else None
    intent = SaveIntent(
        key=key,
        namespace=spec.namespace.header(),
        tokens=spec.tokens,
        tier=asked,
        size=size,
        reason=spec.reason,
    )
    try:
        token, chosen = meta.reserve(intent, tiers=None if choices is None else list(choices))
    except (AlreadyCached, SaveInFlight):
        return PublishResult(PublishOutcome.DUPLICATE, key, asked, size)
    except CacheFull as exc:
        log.info("cache.save_refused", key=key.hex(), tier=asked or "auto", why=exc.message)
        return PublishResult(PublishOutcome.REFUSED, key, asked, size)
    if choices is not None:
        if chosen not in choices:  # pragma: no cover - cache-meta chooses among them
            _cancel(meta, key, token)
            raise PublishAbandoned(f"cache-meta chose {chosen}, which this writer lacks")
        tier = choices[chosen]
    assert isinstance(tier, Tier)
    hook(PublishStage.RESERVED, key)

    try:
        tmp = _write_tmp(tier, spec, payload, writer, size)
    except BaseException:
        _cancel(meta, key, token)
        raise
    hook(PublishStage.WRITTEN, key)

    try:
        meta.check_reservation(key, token)
    except PublishAbandoned:
        _unlink_quietly(tmp)
        log.info("cache.publish_abandoned", key=key.hex(), tier=tier.name, stage="check")
        return PublishResult(PublishOutcome.ABANDONED, key, tier.name, size)
    except BaseException:
        _unlink_quietly(tmp)
        _cancel(meta, key, token)
        raise
    hook(PublishStage.CHECKED, key)

    try:
        outcome = _link(tier, key, tmp, size)
    except BaseException:
        _unlink_quietly(tmp)
        _cancel(meta, key, token)
        raise
    location = tier.location_for(key)
    try:
        meta.mark_published(key, token, location)
    except PublishAbandoned:
        # The reaper took our reservation between check and now; it adopts or
        # unlinks the final file itself, so leave the file to it.
        log.info("cache.publish_abandoned", key=key.hex(), tier=tier.name, stage="linked")
        return PublishResult(PublishOutcome.ABANDONED, key, tier.name, size, location)
    hook(PublishStage.LINKED, key)

    tier.sync_dir()
    hook(PublishStage.SYNCED, key)

    try:
        meta.announce_saved(key, token, location=location, size=size)
    except PublishAbandoned:
        log.info("cache.publish_abandoned", key=key.hex(), tier=tier.name, stage="announce")
        return PublishResult(PublishOutcome.ABANDONED, key, tier.name, size, location)
    hook(PublishStage.ANNOUNCED, key)
    return PublishResult(outcome, key, tier.name, size, location)


def _cancel(meta: PublishMeta, key: bytes, token: int) -> None:
    try:
        meta.cancel_reservation(key, token)
    except Exception as exc:  # the owner-death path or the TTL cleans up instead
        log.warning("cache.cancel_failed", key=key.hex(), error=str(exc))
