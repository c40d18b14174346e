"""Where a model worker's KV rows go and come from: :class:`CacheViewConfig`.

A frozen, validated contract (like ``WorkerConfig``): a bad value raises
:class:`~llamad.errors.ConfigError` naming the field, when the worker starts,
never at the first save. :meth:`CacheViewConfig.check_against` then holds it
against the cache this worker actually talks to (a save tier the cache does
not have, or cannot hold a byte in, is a refusal to start).

The cache's own policies stay the cache's: cache-meta chooses the row to
restore (``LookupPolicy``: restore cost, common-prefix restores), the core
decides when to save (``CachePolicy``). This config only says which tiers
this model uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from llamad.cache.key import FINGERPRINT_LEN, FingerprintMode
from llamad.cache.tier_kind import AUTO, TierKind
from llamad.errors import ConfigError

__all__ = ["ALL_TIERS", "LOOKUP_TIMEOUT_S", "CacheViewConfig"]

ALL_TIERS: Final = frozenset(TierKind)

LOOKUP_TIMEOUT_S: Final = 0.3
"""A lookup's bound by default: a healthy cache-meta answers in a millisecond
or two, and a slower answer only costs one request its restore."""


def _bad(name: str, problem: str) -> ConfigError:
    return ConfigError(f"{name}: {problem}", details={"field": name})


def _tier(name: str, value: object) -> TierKind:
    try:
        return TierKind(value if isinstance(value, str) else "")
    except ValueError:
        known = ", ".join(t.value for t in TierKind)
        raise _bad(name, f"{value!r} is not a tier ({known})") from None


def _save_tier(value: object) -> TierKind | None:
    if value is None or value == AUTO:
        return None
    return _tier("save_tier", value)


def _seconds(name: str, value: object, *, zero_ok: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _bad(name, f"{value!r} is not a number of seconds")
    if value < 0 or (value == 0 and not zero_ok):
        raise _bad(name, f"{value!r} must be {'>= 0' if zero_ok else '> 0'}")
    return float(value)


@dataclass(frozen=True, slots=True)
class CacheViewConfig:
    """How one model worker uses the cache.

    ``save_tier``: the tier every save of this model is written to, or
    ``None`` (``"auto"``, the default) to let cache-meta put each row in the
    fastest of ``restore_tiers`` with room: ``ram`` while it has some (the
    next turn of a conversation restores from shared memory in place), its
    older rows demoting down the tiers. ``restore_tiers``: the tiers a
    restore may read (default: any); cache-meta answers a row's fastest copy
    among them, and a row with none there is a miss. ``fingerprint_mode`` /
    ``supplied_fingerprint``: how the model file is identified
    (:func:`llamad.model.identity.base_fingerprint`).
    ``lookup_timeout_s``: the most a lookup or forget may hold the
    loop beyond a parent-save wait (and the most cache-meta may stay silent
    during such a wait); a lookup that takes longer runs the request cold.
    Short by default (0.3 s) so that a request meeting a wedged cache-meta
    is still answered, cold, within half a second of its own compute.
    ``cooldown_s``: after such a timeout the cache is taken for down:
    lookups are skipped (cold at once) and sync saves not tried for at least
    this long (0 by default), and until cache-meta answers the view's probe,
    so a hung cache-meta costs the loop one timeout rather than one per
    request, and a slow but running one only the request that timed out. ``sync_save_timeout_s``:
    the bound of a synchronous save whose job carries no deadline.
    ``writer_threads``: threads of the writer pool.
    """

    save_tier: TierKind | None = None
    restore_tiers: frozenset[TierKind] = field(default=ALL_TIERS)
    fingerprint_mode: FingerprintMode = FingerprintMode.GGUF_CHUNKED
    supplied_fingerprint: bytes | None = None
    lookup_timeout_s: float = LOOKUP_TIMEOUT_S
    cooldown_s: float = 0.0
    sync_save_timeout_s: float = 30.0
    writer_threads: int = 2

    def __post_init__(self) -> None:
        object.__setattr__(self, "save_tier", _save_tier(self.save_tier))
        tiers = self.restore_tiers
        if isinstance(tiers, str | bytes) or not isinstance(tiers, Iterable):
            raise _bad("restore_tiers", f"{tiers!r} is not a collection of tiers")
        restore = frozenset(_tier("restore_tiers", t) for t in tiers)
        if not restore:
            raise _bad("restore_tiers", "at least one tier (or the worker could never restore)")
        object.__setattr__(self, "restore_tiers", restore)
        try:
            object.__setattr__(self, "fingerprint_mode", FingerprintMode(self.fingerprint_mode))
        except ValueError:
            raise _bad("fingerprint_mode", f"unknown mode {self.fingerprint_mode!r}") from None
        supplied = self.supplied_fingerprint
        if supplied is not None and (
            not isinstance(supplied, bytes) or len(supplied) != FINGERPRINT_LEN
        ):
            raise _bad("supplied_fingerprint", f"expected {FINGERPRINT_LEN} bytes")
        if self.fingerprint_mode is FingerprintMode.FAST_UNSAFE and supplied is None:
            raise _bad("supplied_fingerprint", "fast_unsafe trusts a supplied digest: give one")
        object.__setattr__(
            self, "lookup_timeout_s", _seconds("lookup_timeout_s", self.lookup_timeout_s)
        )
        object.__setattr__(
            self, "cooldown_s", _seconds("cooldown_s", self.cooldown_s, zero_ok=True)
        )
        object.__setattr__(
            self, "sync_save_timeout_s", _seconds("sync_save_timeout_s", self.sync_save_timeout_s)
        )
        n = self.writer_threads
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
            raise _bad("writer_threads", f"{n!r} is not in [1, 64]")

    def check_against(self, quotas: Mapping[TierKind, int]) -> frozenset[TierKind]:
        """Refuse a config the cache cannot serve; answer the tiers restores may read.

        ``quotas``: the byte quota of every tier this process can read and
        write (its client's and writer pool's). The save tier must be one of
        them and hold bytes (with ``auto``, one of the restore tiers must);
        restores read the configured tiers the cache has (at least one).
        """
        if self.save_tier is None:
            if not any(quotas.get(t, 0) > 0 for t in self.restore_tiers):
                raise _bad("save_tier", "auto: none of restore_tiers holds a byte in this cache")
        else:
            quota = quotas.get(self.save_tier)
            if quota is None:
                raise _bad("save_tier", f"the cache has no {self.save_tier.value} tier")
            if quota <= 0:
                raise _bad("save_tier", f"the {self.save_tier.value} tier holds 0 bytes")
        usable = self.restore_tiers & quotas.keys()
        if not usable:
            wanted = sorted(t.value for t in self.restore_tiers)
            raise _bad("restore_tiers", f"the cache has none of {wanted}")
        return frozenset(usable)
