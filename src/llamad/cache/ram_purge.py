"""The ``ram`` tier's segments belong to one daemon run: :func:`purge_ram`.

The daemon calls :func:`purge_ram` when it starts and when it stops. A
cache-meta restart in between re-adopts the segments, so no published row
of any tier is lost to a cache-meta crash. A clean stop demotes them first
(cache-meta, to ``ram_file`` by a link when both are on ``/dev/shm``), and
the purge links into ``ram_file`` any valid segment a crashed run left
there (:func:`rescue_ram`), so no row is lost to the purge either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

from llamad.cache.mover import move_file
from llamad.cache.moves import MoveJob, MoveKind
from llamad.cache.tier_kind import TierKind, slower_tiers
from llamad.cache.tier_lock import TierLocks
from llamad.cache.tiers import Tier

if TYPE_CHECKING:
    from llamad.cache.settings import CacheSettings

__all__ = ["purge_ram", "rescue_ram"]

log = structlog.get_logger("llamad.cache.ram_purge")


def purge_ram(settings: CacheSettings) -> int:
    """Delete this daemon instance's ``ram`` segments (at daemon start and stop),
    after saving the rows they hold a tier down; returns the segments deleted.

    A clean stop has demoted its ``ram`` rows already; segments still here
    were left by a run that crashed (or ran out of its stop budget). Each
    one whose key has no file in a slower tier yet is first linked (one
    filesystem) or copied, crash-safely, into the fastest slower tier with a
    quota (:func:`rescue_ram`). Those files are judged by the next cache-meta
    start like any other: its scan validates them and its quota enforcement
    demotes what does not fit.

    Only while no cache-meta owns the tiers: with one running (this instance
    started twice), raises :class:`~llamad.cache.errors.TierLocked` and
    deletes nothing.
    """
    cfg = settings.tier(TierKind.RAM)
    if cfg is None:
        return 0
    ram = Tier(cfg)
    below = [
        Tier(c)
        for kind in slower_tiers(TierKind.RAM)
        if (c := settings.tier(kind)) is not None and c.quota > 0
    ]
    with TierLocks.take([ram, *below]):
        rescue_ram(ram, below)
        return ram.purge()


def rescue_ram(ram: Tier, below: Sequence[Tier]) -> Counter[str]:
    """Give every row segment of ``ram`` a file in the first of ``below`` (a link
    when possible), unless one of ``below`` has that key's file already.

    The caller holds the tiers' locks. Returns what happened, by outcome
    (``linked``, ``copied``, ``kept``: a file was there, ``failed``).
    """
    done: Counter[str] = Counter()
    if not below:
        return done
    target = below[0]
    for key in ram.row_keys():
        if any(t.path_for(key).exists() for t in below):
            done["kept"] += 1
            continue
        job = MoveJob(0, MoveKind.DEMOTE, key, ram.name, ram.location_for(key), target.name, 0)
        result = move_file(ram, target, job)
        if result.ok:
            done["linked" if result.linked else "copied"] += 1
        else:
            done["failed"] += 1
            log.warning("cache.ram_rescue_failed", key=key.hex(), error=result.error)
    if done:
        log.info("cache.ram_rescued", tier=target.name, **done)
    return done
