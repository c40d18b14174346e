"""Resolution: where a request's sequence starts from (SPEC M3, C8, M16).

Each admitted request has a *target*: the tokens its sequence must hold
before it generates (the prompt; for ``continue``, the session's transcript
plus the tail). Resolution decides how much of the target the sequence
already holds, or can get from the cache, and so what is left to prefill:

- **fresh** (no session, a new or parked session): ask the cache. A row that
  covers the target's first ``use`` tokens is restored (and truncated to
  them, when it runs past the target or diverges from it): ``exact`` when it
  covers the whole target, ``partial`` otherwise; no row: ``cold``.
- **sticky** (a live session): the sequence already holds the session's
  committed tokens; the part the prompt shares with them is kept, the rest
  cut. Only when the cache offers more than that is a row restored instead.
- **continuation**: the caller asserts that the tail follows the session's
  transcript; the sequence keeps everything it holds, no prefix check, no
  lookup (a parked session restores first).

Whatever the path, when the request will generate, the target's last token
is never taken from the KV: it is decoded alone to give fresh logits, so a
restored prompt and a prefilled one produce the same first token. With one
exception: a restored row that covers the whole target and keeps the logits
of exactly its last position (the run that saved it decoded that position
alone and kept what it computed, :mod:`llamad.model.savepoints`) is kept
whole, and the first token is sampled from those logits
(:func:`with_stored_logits`): the same logits, so the same token, without
decoding the position again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llamad.cache.key import tokens_to_bytes
from llamad.cache.lookup import Lookup, RowRef
from llamad.cache.prefix import common_prefix_len
from llamad.model.results import CacheHitKind, CacheMiss

__all__ = [
    "Resolution",
    "common_prefix",
    "decide_continue",
    "decide_fresh",
    "decide_sticky",
    "explain_miss",
    "keeps_target_logits",
    "sticky_needs_lookup",
    "with_stored_logits",
]


@dataclass(frozen=True, slots=True)
class Resolution:
    """How a sequence gets to hold the target's first ``keep`` tokens.

    With ``restore``, the row is unpacked into the sequence and then truncated
    to ``keep``; without, the sequence's current KV is truncated to ``keep``.
    ``read``: target tokens the restored row covered (``cache_delta.read``).
    ``stored_logits``: the row keeps the logits of the target's last position;
    ``keep`` is the whole target and the first token is sampled from them.
    """

    kind: CacheHitKind
    keep: int
    restore: RowRef | None = None
    read: int = 0
    stored_logits: bool = False


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share (memcmp speed on long runs)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    return common_prefix_len(tokens_to_bytes(a[:n]), tokens_to_bytes(b[:n])) // 4


def _held_back(keep: int, target_len: int, wants_logits: bool) -> int:
    return min(keep, target_len - 1 if wants_logits else target_len)


def _usable(lookup: Lookup | None, target_len: int) -> int:
    if lookup is None or lookup.row is None:
        return 0
    return max(0, min(lookup.use_tokens, target_len))


def decide_fresh(target_len: int, lookup: Lookup | None, *, wants_logits: bool) -> Resolution:
    """A sequence that holds nothing useful: restore what the cache offers, or go cold."""
    use = _usable(lookup, target_len)
    if use == 0:
        return Resolution(CacheHitKind.COLD, 0)
    assert lookup is not None
    kind = CacheHitKind.EXACT if use == target_len else CacheHitKind.PARTIAL
    return Resolution(kind, _held_back(use, target_len, wants_logits), lookup.row, use)


def sticky_needs_lookup(live_common: int, target_len: int, *, wants_logits: bool) -> bool:
    """Whether a live session could gain from the cache (its KV lacks part of the target)."""
    return live_common < _held_back(target_len, target_len, wants_logits)


def decide_sticky(
    live_common: int, target_len: int, lookup: Lookup | None, *, wants_logits: bool
) -> Resolution:
    """A live session whose KV shares ``live_common`` tokens with the target.

    The live prefix wins ties: keeping cells costs nothing, a restore copies.
    """
    use = _usable(lookup, target_len)
    if use > live_common:
        return decide_fresh(target_len, lookup, wants_logits=wants_logits)
    if live_common == 0:
        return Resolution(CacheHitKind.COLD, 0)
    return Resolution(CacheHitKind.STICKY, _held_back(live_common, target_len, wants_logits))


def decide_continue(
    held: int, target_len: int, lookup: Lookup | None, *, wants_logits: bool
) -> Resolution:
    """``continue``: keep the ``held`` tokens the session's sequence has; a parked
    session (``held`` 0) restores what the cache has of its transcript first."""
    use = _usable(lookup, target_len)
    if lookup is not None and use > held:
        keep = _held_back(use, target_len, wants_logits)
        return Resolution(CacheHitKind.CONTINUATION, keep, lookup.row, use)
    return Resolution(CacheHitKind.CONTINUATION, _held_back(held, target_len, wants_logits))


def keeps_target_logits(res: Resolution, target_len: int, logits_position: int | None) -> bool:
    """Whether the row ``res`` restores keeps the target's own last logits: it
    covers the whole target and its logits are those of exactly the target's
    last position (``logits_position``; ``None`` when it keeps none). Logits of
    another position belong to another prefix of the row."""
    return (
        res.restore is not None
        and res.read == target_len
        and logits_position is not None
        and logits_position == target_len - 1
    )


def with_stored_logits(
    res: Resolution, target_len: int, logits_position: int | None, *, wants_logits: bool
) -> Resolution:
    """``res`` once its row was read: a row keeping the target's own last logits
    (:func:`keeps_target_logits`) is kept whole, nothing held back, and a
    request that generates samples its first token from those logits. Any
    other row keeps ``res`` as it was."""
    if not wants_logits or not keeps_target_logits(res, target_len, logits_position):
        return res
    return Resolution(res.kind, target_len, res.restore, res.read, stored_logits=True)


def _text(tokens: Sequence[int], piece: Callable[[int], bytes]) -> str:
    return b"".join(piece(t) for t in tokens).decode("utf-8", errors="replace")


def explain_miss(
    target: Sequence[int],
    lookup: Lookup | None,
    restored: int,
    *,
    window: int,
    piece: Callable[[int], bytes],
) -> CacheMiss:
    """Why the cache fell short of the whole target: the nearest saved row and
    where the target leaves it, with ``window`` tokens of text either side."""
    if lookup is None or lookup.common_key is None:
        diverged, nearest = restored, None
    else:
        diverged, nearest = max(lookup.common_tokens, restored), lookup.common_key
    diverged = min(diverged, len(target))
    return CacheMiss(
        prompt_tokens=len(target),
        diverged_at=diverged,
        restored_tokens=restored,
        nearest_key=nearest,
        before=_text(target[max(0, diverged - window) : diverged], piece),
        after=_text(target[diverged : diverged + window], piece),
    )
