"""The cache's tiers by name: the one vocabulary every floor speaks (SPEC C3).

The cache keys its tiers by :class:`TierKind`; the front's wire, the client
and the ``llamad`` command name them the same way, and they sit above the
cache while a client must not load it (``tests/unit/client/test_client_imports.py``),
so the enum lives on the ground floor. On the wire a member travels as its
value (``"ram"``, ...) and msgspec refuses any other string, so a peer can
never name a tier this process does not know. Being a ``StrEnum``, a member
also equals and hashes like its value: a plain ``"ram"`` from a config file
or a command line finds the same dictionary entry. The cache's checks at its
boundary (:func:`llamad.cache.tier_kind.check_tier`) are its own.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final

__all__ = ["LOCAL_TIERS", "TIER_ORDER", "TierKind"]


class TierKind(StrEnum):
    """The tiers, fastest first (also the order that wins between duplicate rows).

    ``remote`` (issue 20) is a Redis server several daemons share: cache-meta
    neither indexes nor owns it (it has no quota among cache-meta's tiers);
    the model workers read and write it (:mod:`llamad.cache.remote_store`),
    and a row found there is copied into a local tier.
    """

    RAM = "ram"
    RAM_FILE = "ram_file"
    DISK = "disk"
    REMOTE = "remote"

    def faster_than(self, other: TierKind) -> bool:
        """Whether a row in this tier is restored faster than one in ``other``."""
        return TIER_ORDER.index(self) < TIER_ORDER.index(other)


TIER_ORDER: Final[tuple[TierKind, ...]] = tuple(TierKind)
"""Every tier, fastest first."""

LOCAL_TIERS: Final[tuple[TierKind, ...]] = tuple(t for t in TIER_ORDER if t is not TierKind.REMOTE)
"""The tiers a daemon owns (cache-meta's: each has a lock, a quota and a ledger), fastest first."""
