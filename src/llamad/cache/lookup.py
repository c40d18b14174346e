"""What a cache lookup answers, and how a prefix match becomes a restore plan (SPEC C8).

A lookup is one round trip to cache-meta. Its answer names at most one row,
already **pinned** for the caller (so it cannot be evicted while the loader
reads it), where the row lives, and how many of the prompt's tokens the
restored state covers. The model worker then reads the row's bytes straight
from shared memory or a file, hands them to ``llama_state_seq_set_data``,
truncates the sequence to ``use_tokens`` when the row runs past the prompt,
prefills the rest, and checks the pin back in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

import msgspec

from llamad.cache.prefix import PrefixMatch
from llamad.cache.tier_kind import TierKind
from llamad.errors import BadRequest

__all__ = [
    "HitKind",
    "Lookup",
    "LookupPolicy",
    "RowRef",
    "choose_restore",
]


class HitKind(StrEnum):
    """How the returned row relates to the prompt."""

    EXACT = "exact"
    """The row holds exactly the prompt's tokens."""
    PREFIX = "prefix"
    """The row's tokens are a proper prefix of the prompt: restore, prefill the rest."""
    COMMON = "common"
    """The row shares ``use_tokens`` leading tokens with the prompt and then diverges
    (or goes on past the prompt's end): restore it, truncate the sequence to
    ``use_tokens``, prefill the rest. With ``use_tokens`` equal to the prompt's
    length (the prompt's earlier turn saved with its reply) nothing is left
    to prefill: cache-meta counts that an exact hit."""


class RowRef(msgspec.Struct, frozen=True, array_like=True):
    """Where a published row lives, handed to the loader.

    ``pin`` is the pin id to check back in (``None`` when the row was not
    pinned). ``location`` is the row's absolute path in its tier (for ``ram``,
    the segment's path under ``/dev/shm``; ``Tier.segment_name`` gives its
    ``shm_open`` name). ``file_size`` is the size of the whole ``.kvc`` file,
    not of the payload: the payload is that minus the header and TLV, which
    only the file says, so a buffer of ``file_size`` bytes always holds it.

    On the wire a row is a msgpack array in field order (a lookup is on
    the hot path, and an array decodes straight into this type, every field
    type-checked, with no per-field Python code).
    """

    key: bytes
    tier: TierKind
    location: str
    file_size: int
    n_tokens: int
    pin: int | None = None


class Lookup(msgspec.Struct, frozen=True, array_like=True):
    """The answer to a prefix lookup (and to the worker's combined resolve).

    ``row`` is ``None`` on a miss. ``use_tokens`` is how many prompt tokens the
    restored row covers. ``common_tokens``/``common_key`` report the longest
    common prefix between the prompt and *any* saved row of the namespace,
    even when that row was not chosen (or on a miss), so callers can see what
    a restore-and-truncate could have saved. ``resumed`` says the answer waited
    for an in-flight save to publish. ``probes`` counts index comparisons.
    ``inflight_key`` / ``inflight_tokens``: a save still being written that
    would cover more of the prompt (that many tokens) than the answered row;
    the caller may wait for it and ask again (SPEC M18).

    On the wire: a msgpack array in field order, ``kind`` as its string
    value and ``row`` as :class:`RowRef`'s array.
    """

    kind: HitKind | None
    row: RowRef | None
    use_tokens: int
    common_tokens: int
    common_key: bytes | None
    resumed: bool = False
    probes: int = 0
    inflight_key: bytes | None = None
    inflight_tokens: int = 0

    @property
    def hit(self) -> bool:
        return self.row is not None


# Enum members bound once: class attribute access to them is slow in 3.11.
_EXACT = HitKind.EXACT
_PREFIX = HitKind.PREFIX
_COMMON = HitKind.COMMON


@dataclass(frozen=True, slots=True)
class LookupPolicy:
    """When restoring a diverging row and truncating it beats a shorter prefix row.

    ``restore_cost`` is the cost of restoring one token relative to prefilling
    one (restoring 2048 tokens of the default model costs ~5 ms, prefilling
    them seconds, so the true ratio is far below the default 0.05, which errs
    towards not reading big rows for a small gain). A diverging row is used
    only when it covers at least ``common_min_tokens`` prompt tokens, unless
    it covers the whole prompt (a short prompt repeated exactly, found in
    the row that saved it with its reply).
    """

    common_min_tokens: int = 256
    restore_cost: float = 0.05
    allow_common: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.common_min_tokens, bool) or not isinstance(self.common_min_tokens, int):
            raise BadRequest(
                "common_min_tokens must be an int", details={"field": "common_min_tokens"}
            )
        if self.common_min_tokens < 1:
            raise BadRequest(
                "common_min_tokens must be >= 1", details={"field": "common_min_tokens"}
            )
        cost = self.restore_cost
        if isinstance(cost, bool) or not isinstance(cost, int | float) or not math.isfinite(cost):
            raise BadRequest(
                "restore_cost must be a finite number", details={"field": "restore_cost"}
            )
        if not 0 <= cost <= 1:
            raise BadRequest("restore_cost must lie in [0, 1]", details={"field": "restore_cost"})


class RestorePlan(NamedTuple):
    """The row a prefix match picked: its key, kind and prompt tokens covered."""

    key: bytes
    kind: HitKind
    use_tokens: int


def choose_restore(
    match: PrefixMatch, prompt_tokens: int, policy: LookupPolicy
) -> RestorePlan | None:
    """Pick the row to restore from a prefix match (pure; no pins, no counters).

    The score of a candidate is the prefill it saves minus the cost of reading
    the whole row: ``use - restore_cost * row_tokens``. A row that is a prefix
    of the prompt needs no truncation and wins ties. ``common_min_tokens``
    does not apply to a row that starts with the whole prompt: it leaves
    nothing to prefill, whatever the prompt's length.
    """
    prefix_key, prefix_tokens, common_key, common_tokens, common_row_tokens, _ = match
    best: RestorePlan | None = None
    best_score = -math.inf
    if prefix_key is not None and prefix_tokens > 0:
        kind = _EXACT if prefix_tokens == prompt_tokens else _PREFIX
        best = RestorePlan(prefix_key, kind, prefix_tokens)
        best_score = prefix_tokens * (1.0 - policy.restore_cost)
    if (
        common_key is not None
        and common_key != prefix_key
        and policy.allow_common
        and (common_tokens >= policy.common_min_tokens or common_tokens == prompt_tokens)
    ):
        score = common_tokens - policy.restore_cost * common_row_tokens
        if score > best_score and score > 0:
            best = RestorePlan(common_key, _COMMON, common_tokens)
    return best
