"""The cache's tiers by name, and its checks at the boundary (SPEC C3).

Tier configs, cache-meta's quotas and ledgers, reservations, row references,
the wire and the pressure scheduler all say :class:`~llamad.tiers.TierKind`
(defined on the ground floor, :mod:`llamad.tiers`, so the front's wire and
the client name tiers the same way without loading the cache; re-exported
here). :func:`check_tier` turns a plain value into the member at the cache's
boundary, or refuses it with the cache's own error.
"""

from __future__ import annotations

from typing import Final

from llamad.cache.errors import InvalidCacheValue
from llamad.tiers import TIER_ORDER, TierKind

__all__ = ["AUTO", "TIER_ORDER", "TierKind", "check_save_tier", "check_tier", "slower_tiers"]


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
