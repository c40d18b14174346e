"""cache-meta's index entries: a row and its copies, one per tier (SPEC C3, C12).

A **row** is what a key names: a namespace and token ids, published once.
Its bytes live in one file per tier that holds it, a **copy**: a row saved in
``ram`` gets a ``disk`` copy behind it (write-behind), a demoted row gets a
copy one tier down, a hot row one tier up. Tiers account copies, not rows:
each tier's ledger holds the copies in it (bytes, LRU, pins), and evicting a
copy that has another one elsewhere only drops that copy.

A lookup serves a row's fastest copy among the tiers the caller may read, and
pins that copy. The hit count and last use belong to the row (they are
written into every copy's header).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

from llamad.cache.kvc import SaveReason
from llamad.cache.lookup import RowRef
from llamad.cache.tier_kind import TIER_ORDER, TierKind

__all__ = ["Copy", "Row"]


@dataclass(slots=True, eq=False)
class Copy:
    """One tier's file of a row. Identity matters: pins refer to this object."""

    row: Row
    tier: TierKind
    location: str
    size: int
    pins: int = 0
    lru_seq: int = 0
    leaving: bool = False
    """Evicted from its tier while a copy of its row is being made elsewhere
    (its own demotion, or a write-behind or promotion already in flight): out
    of its tier's ledger (the quota already counts its bytes as free), still
    served, and dropped when that move (``waits_for``) ends. So a row never
    goes without a complete file while one is being made for it."""
    waits_for: int = 0
    """The id of the move a leaving copy waits for."""
    doomed: bool = False
    """Out of the index, but pinned: its file is deleted at the last checkin."""

    @property
    def key(self) -> bytes:
        return self.row.key

    @property
    def last_used_ns(self) -> int:
        return self.row.last_used_ns

    def ref(self, pin: int | None = None) -> RowRef:
        return RowRef(self.row.key, self.tier, self.location, self.size, self.row.n_tokens, pin)

    def describe(self) -> dict[str, Any]:
        return {
            "tier": self.tier,
            "location": self.location,
            "size": self.size,
            "pins": self.pins,
            "leaving": self.leaving,
        }


@dataclass(slots=True, eq=False)
class Row:
    """A published row in the index. Its tokens live in the prefix index too."""

    key: bytes
    namespace: bytes
    n_tokens: int
    reason: SaveReason
    created_ns: int
    last_used_ns: int
    # The row's token ids (u32 LE): the very object the prefix index holds.
    tokens: bytes = b""
    hits: int = 0
    stats_dirty: bool = False
    copies: dict[TierKind, Copy] = field(default_factory=dict)

    def fastest(self, tiers: Container[TierKind] | None = None) -> Copy | None:
        """The fastest copy in ``tiers`` (default: any tier), if there is one."""
        copies = self.copies
        for tier in TIER_ORDER:
            copy = copies.get(tier)
            if copy is not None and (tiers is None or tier in tiers):
                return copy
        return None

    @property
    def pins(self) -> int:
        """Pins held on any copy."""
        return sum(c.pins for c in self.copies.values())

    @property
    def tier(self) -> TierKind:
        """The tier of the fastest copy."""
        copy = self.fastest()
        assert copy is not None, "an indexed row has a copy"
        return copy.tier

    @property
    def size(self) -> int:
        """The size of the fastest copy's file."""
        copy = self.fastest()
        assert copy is not None, "an indexed row has a copy"
        return copy.size

    def ref(self, pin: int | None = None) -> RowRef:
        """The fastest copy's reference."""
        copy = self.fastest()
        assert copy is not None, "an indexed row has a copy"
        return copy.ref(pin)

    def describe(self) -> dict[str, Any]:
        fastest = self.fastest()
        assert fastest is not None, "an indexed row has a copy"
        return {
            "key": self.key.hex(),
            "tier": fastest.tier,
            "size": fastest.size,
            "n_tokens": self.n_tokens,
            "location": fastest.location,
            "reason": self.reason.name.lower(),
            "created_ns": self.created_ns,
            "last_used_ns": self.last_used_ns,
            "hits": self.hits,
            "pins": self.pins,
            "copies": [self.copies[t].describe() for t in TIER_ORDER if t in self.copies],
            "status": "available",
        }
