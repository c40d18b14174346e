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

__all__ = ["AUTO", "TIER_ORDER", "TierKind", "check_save_tier", "check_tier", "slower_tiers"]


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

AUTO: Final = "auto"
"""The save tier that is no tier: cache-meta puts the row in the fastest tier
with room when it reserves the save (a save tier of ``None`` inside llamad)."""


def slower_tiers(tier: TierKind) -> tuple[TierKind, ...]:
    """The tiers below ``tier``, fastest first (where a demotion from it may go)."""
    return TIER_ORDER[TIER_ORDER.index(tier) + 1 :]


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


def check_save_tier(value: object, field: str = "save_tier") -> TierKind | None:
    """A save tier: a :class:`TierKind`, or ``None`` for :data:`AUTO` (``"auto"`` or ``None``)."""
    if value is None or value == AUTO:
        return None
    return check_tier(value, field)
