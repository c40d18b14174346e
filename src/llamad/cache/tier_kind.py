"""The cache's tiers by name: one enum wherever a tier is named (SPEC C3).

Tier configs, cache-meta's quotas and ledgers, reservations, row references,
the wire and the pressure scheduler all say :class:`TierKind`. On the wire a
member travels as its value (``"ram"``, ...) and msgspec refuses any other
string, so a peer can never name a tier this process does not know. Being a
``StrEnum``, a member also equals and hashes like its value: a plain ``"ram"``
from a config file or a command line finds the same dictionary entry, and
:func:`check_tier` turns it into the member at the boundary.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

from llamad.cache.errors import InvalidCacheValue

__all__ = ["TIER_ORDER", "TierKind", "check_tier"]


class TierKind(StrEnum):
    """The three tiers, fastest first (also the order that wins between duplicate rows)."""

    RAM = "ram"
    RAM_FILE = "ram_file"
    DISK = "disk"

    def faster_than(self, other: TierKind) -> bool:
        """Whether a row in this tier is restored faster than one in ``other``."""
        return TIER_ORDER.index(self) < TIER_ORDER.index(other)


TIER_ORDER: Final[tuple[TierKind, ...]] = tuple(TierKind)
"""Every tier, fastest first."""


def check_tier(value: object, field: str = "tier") -> TierKind:
    """``value`` as a :class:`TierKind` (a member or its value), else :class:`InvalidCacheValue`."""
    if isinstance(value, TierKind):
        return value
    if isinstance(value, str):
        try:
            return TierKind(value)
        except ValueError:
            pass
    raise InvalidCacheValue(field, f"{value!r} is not one of {', '.join(TIER_ORDER)}")
