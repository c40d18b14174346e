"""Moves: one row's copy made in another tier (SPEC C12), as cache-meta asks for them.

cache-meta decides every move on its loop and changes the index; the file
work runs on the mover's threads (:mod:`llamad.cache.mover`) and comes back
as a :class:`MoveResult`. A move always *adds* a copy: the destination file
appears (crash-safely, through ``link(2)``) beside the source, and only once
cache-meta has indexed the destination does it drop the source of a
demotion. So at every instant each row has at least one complete file, and a
cache-meta killed in the middle of a move leaves, at worst, a ``*.tmp`` file
(deleted by the next scan) or one copy more than it wanted (adopted by the
next scan, then trimmed by quota).

Three reasons to move, one enum:

- ``demote``: quota eviction from a tier (``ram`` → ``ram_file`` → ``disk``);
  the source copy leaves its tier's ledger at once (the quota sees the room)
  and stays readable until the destination lands.
- ``promote``: a hot row read from a slower tier gets a copy in a faster one
  the reader may restore from; the slower copy stays.
- ``write_behind``: a row saved in ``ram`` or ``ram_file`` gets a ``disk``
  copy in the background, so that it survives a reboot.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from enum import StrEnum

from llamad.cache.rows import Copy
from llamad.cache.tier_kind import TierKind

__all__ = ["MoveJob", "MoveKind", "MoveResult", "MoveTable"]


class MoveKind(StrEnum):
    """Why a copy is being made (see the module doc)."""

    DEMOTE = "demote"
    PROMOTE = "promote"
    WRITE_BEHIND = "write_behind"


@dataclass(frozen=True, slots=True)
class MoveJob:
    """Copy ``key``'s file at ``src_location`` (tier ``src_tier``) into ``dst_tier``.

    ``size`` is the source copy's size as cache-meta knows it, which it has
    reserved in the destination's ledger.
    """

    id: int
    kind: MoveKind
    key: bytes
    src_tier: TierKind
    src_location: str
    dst_tier: TierKind
    size: int


@dataclass(frozen=True, slots=True)
class MoveResult:
    """How a :class:`MoveJob` ended.

    ``location`` is the destination file, complete, linked under its final
    name and its directory synced (``None``: the move failed; ``error`` says
    why). ``linked``: the destination is a hard link of the source (same
    filesystem: no byte was copied). ``source_damaged``: the source failed
    validation, and the mover deleted it (counted once, like a loader).
    ``source_missing``: the source file was gone before it could be read.
    """

    job_id: int
    location: str | None
    size: int = 0
    linked: bool = False
    error: str | None = None
    source_damaged: bool = False
    source_missing: bool = False

    @property
    def ok(self) -> bool:
        return self.location is not None


class MoveTable:
    """The moves cache-meta asked for and the mover has not finished, plus the
    rows waiting for a write-behind copy.

    A move is known by its id and by ``(key, destination tier)``: at most one
    move per destination of a row at a time, so a copy is never made twice and
    a key with a move in flight is never reserved for a new save (the two
    would race for one final path). The source copy of each move is kept with
    it (its identity says whether the move is still about the same copy).
    """

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[MoveJob, Copy]] = {}
        self._by_key: dict[bytes, dict[TierKind, MoveJob]] = {}
        self._kinds: Counter[MoveKind] = Counter()
        self._new: list[MoveJob] = []
        # Keys of rows that want a disk copy, oldest first (an ordered set).
        self._behind: dict[bytes, None] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def add(self, job: MoveJob, source: Copy) -> None:
        self._by_id[job.id] = (job, source)
        self._by_key.setdefault(job.key, {})[job.dst_tier] = job
        self._kinds[job.kind] += 1
        self._new.append(job)

    def finish(self, job_id: int) -> tuple[MoveJob, Copy] | None:
        """Forget a move that ended; its job and source copy (None: not ours)."""
        entry = self._by_id.pop(job_id, None)
        if entry is None:
            return None
        job = entry[0]
        jobs = self._by_key[job.key]
        del jobs[job.dst_tier]
        if not jobs:
            del self._by_key[job.key]
        self._kinds[job.kind] -= 1
        return entry

    def to(self, key: bytes, tier: TierKind) -> bool:
        """Whether a copy of ``key`` is being made in ``tier``."""
        jobs = self._by_key.get(key)
        return jobs is not None and tier in jobs

    def elsewhere(self, key: bytes, tier: TierKind) -> MoveJob | None:
        """A move making a copy of ``key`` in a tier other than ``tier``, if any."""
        for dst, job in self._by_key.get(key, {}).items():
            if dst is not tier:
                return job
        return None

    def moving(self, key: bytes) -> bool:
        """Whether any move of ``key`` is in flight (its files are being read or written)."""
        return key in self._by_key

    def in_flight(self, kind: MoveKind | None = None) -> int:
        return len(self._by_id) if kind is None else self._kinds[kind]

    @property
    def has_new(self) -> bool:
        return bool(self._new)

    def take_new(self) -> list[MoveJob]:
        """The moves asked for since the last call (for the mover)."""
        jobs, self._new = self._new, []
        return jobs

    def jobs(self) -> list[MoveJob]:
        return [job for job, _ in self._by_id.values()]

    # -- write-behind -------------------------------------------------------

    def want_behind(self, key: bytes) -> None:
        """``key``'s row wants a disk copy (once there is a slot for it)."""
        self._behind[key] = None

    def next_behind(self) -> bytes | None:
        """The oldest key still wanting a disk copy, taken off the queue."""
        for key in self._behind:
            del self._behind[key]
            return key
        return None

    @property
    def behind(self) -> int:
        """Rows waiting for a write-behind copy."""
        return len(self._behind)
