"""Per-tier byte ledgers and LRU victim selection (SPEC C9).

Each tier has a byte quota and its own least-recently-used order. cache-meta
keeps one :class:`TierLedger` per tier and asks it (or
:func:`plan_across_tiers`) which rows to drop; the ledgers never delete
anything themselves, so a plan can be checked before it is carried out (a
reservation that cannot be satisfied evicts nothing).

Pinned rows (``pins > 0``) are never victims: a loader holding a pin is
reading the bytes right now.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from llamad.cache.tier_kind import TierKind
from llamad.errors import BadRequest

__all__ = ["Evictable", "TierLedger", "plan_across_tiers"]


class Evictable(Protocol):
    """What eviction needs to know about an index row."""

    @property
    def key(self) -> bytes: ...

    @property
    def size(self) -> int: ...

    @property
    def pins(self) -> int: ...

    @property
    def lru_seq(self) -> int:
        """Monotonic use stamp; smaller is older (comparable across tiers)."""
        ...


R = TypeVar("R", bound=Evictable)


class TierLedger(Generic[R]):
    """Bytes in use, bytes promised to in-flight saves and moves, and the LRU of one tier.

    It accounts *copies* (:class:`llamad.cache.rows.Copy`): a row with a copy
    in two tiers is in two ledgers.
    """

    __slots__ = ("_lru", "leaving", "name", "quota", "reserved", "used")

    def __init__(self, name: TierKind, quota: int) -> None:
        if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
            raise BadRequest(
                f"quota of tier {name!r} must be a byte count >= 0", details={"field": "quota"}
            )
        self.name = name
        self.quota = quota
        self.used = 0
        self.reserved = 0
        # Bytes of copies demoted out of this tier whose files are still there
        # (readable until their destination lands): out of ``used``, so the
        # quota already counts them free. Only for status and the gauge.
        self.leaving = 0
        # Insertion order is use order: the first entry is the least recently used.
        self._lru: OrderedDict[bytes, R] = OrderedDict()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    def add(self, row: R) -> None:
        """Account a published row as the most recently used."""
        if row.key in self._lru:
            raise BadRequest("row already accounted in this tier", details={"field": "key"})
        self._lru[row.key] = row
        self.used += row.size

    def remove(self, row: R) -> None:
        if self._lru.pop(row.key, None) is not None:
            self.used -= row.size

    def touch(self, row: R) -> None:
        """Mark a row as just used."""
        self._lru.move_to_end(row.key)

    def rows(self) -> Iterator[R]:
        """Rows from least to most recently used."""
        return iter(self._lru.values())

    def unpinned(self) -> Iterator[R]:
        return (row for row in self._lru.values() if row.pins == 0)

    def headroom(self) -> int:
        """Bytes a new save may take without evicting (negative when over quota)."""
        return self.quota - self.used - self.reserved

    def plan(self, need: int) -> tuple[list[R], int]:
        """Oldest unpinned rows freeing at least ``need`` bytes (or all there are).

        Returns the victims and the bytes they free; the caller decides whether
        a partial plan is worth carrying out.
        """
        victims: list[R] = []
        freed = 0
        if need <= 0:
            return victims, freed
        for row in self.unpinned():
            victims.append(row)
            freed += row.size
            if freed >= need:
                break
        return victims, freed


def plan_across_tiers(ledgers: Sequence[TierLedger[R]], need: int) -> tuple[list[R], int]:
    """Globally oldest unpinned rows over several tiers until ``need`` bytes are freed.

    Each ledger is already in use order, so a k-way merge on ``lru_seq`` gives
    the global order without sorting every row.
    """
    victims: list[R] = []
    freed = 0
    if need <= 0:
        return victims, freed
    streams: list[Iterable[tuple[int, int, R]]] = [
        ((row.lru_seq, i, row) for row in ledger.unpinned()) for i, ledger in enumerate(ledgers)
    ]
    for _, _, row in heapq.merge(*streams, key=lambda item: (item[0], item[1])):
        victims.append(row)
        freed += row.size
        if freed >= need:
            break
    return victims, freed
