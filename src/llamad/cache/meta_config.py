"""cache-meta's quotas and timings (:class:`MetaConfig`), apart from cache-meta itself.

Every process that builds a cache's settings (the root, the front, each
worker) needs this class; only cache-meta needs :mod:`llamad.cache.meta`,
whose index, eviction and move code is ~2 MB resident (SPEC P9).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.lookup import LookupPolicy
from llamad.cache.tier_kind import TierKind, check_tier

__all__ = ["MetaConfig"]


@dataclass(frozen=True, slots=True)
class MetaConfig:
    """Quotas and timings of cache-meta; invalid values raise naming the field.

    ``quotas`` maps tier → byte quota; a tier left out is not served, and a
    tier with quota 0 takes no save, demotion or copy. ``reservation_ttl_s``
    bounds how long a silent writer keeps a key reserved (each protocol step
    renews it). ``max_wait_s`` caps the wait a lookup may ask for.
    ``promote_hits``: a row served from a slower tier than the reader could
    read is copied into the faster one once its lifetime hit count reaches
    this (0: never). ``write_behind``: every row saved in a tier faster than
    ``disk`` gets a ``disk`` copy in the background.
    """

    quotas: Mapping[TierKind, int]
    reservation_ttl_s: float = 60.0
    max_wait_s: float = 60.0
    lookup: LookupPolicy = field(default_factory=LookupPolicy)
    promote_hits: int = 2
    write_behind: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.quotas, Mapping) or not self.quotas:
            raise InvalidCacheValue("quotas", "at least one tier needs a quota")
        quotas: dict[TierKind, int] = {}
        for tier, quota in self.quotas.items():
            if isinstance(quota, bool) or not isinstance(quota, int) or quota < 0:
                raise InvalidCacheValue("quotas", f"{tier}: {quota!r} is not a byte count >= 0")
            quotas[check_tier(tier)] = quota
        object.__setattr__(self, "quotas", quotas)
        for name in ("reservation_ttl_s", "max_wait_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InvalidCacheValue(name, f"{value!r} is not a positive number of seconds")
        if not isinstance(self.lookup, LookupPolicy):
            raise InvalidCacheValue("lookup", "expected a LookupPolicy")
        hits = self.promote_hits
        if isinstance(hits, bool) or not isinstance(hits, int) or not 0 <= hits < 2**32:
            raise InvalidCacheValue("promote_hits", f"{hits!r} is not a hit count >= 0")
        if not isinstance(self.write_behind, bool):
            raise InvalidCacheValue("write_behind", f"{self.write_behind!r} is not a boolean")
