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

Live KV comes first (SPEC M18). Before any tier, a fresh request looks at
the context's own sequences: the idle entry its sequence may hold (kept in
place), and every other sequence of its namespace, idle or running, whose
KV starts with part of the target (shared into its sequence with
``seq_cp``, which in a unified KV copies no bytes). The cache is asked only
when the live KV falls short of the target, and its row is restored only
when it covers clearly more (:func:`restore_beats_live`).

Whatever the path, when the request will generate, the target's last token
is never taken from the KV: it is decoded alone to give fresh logits, so a
restored prompt and a prefilled one produce the same first token. With one
exception: KV that covers the whole target and comes with the logits of
exactly its last position (the run that computed it decoded that position
alone and kept what it computed, :mod:`llamad.model.savepoints`; a saved row
keeps them in its file, an idle entry in memory) is kept whole, and the
first token is sampled from those logits (:func:`with_stored_logits`): the
same logits, so the same token, without decoding the position again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llamad.cache.key import TOKEN_BYTES, tokens_to_bytes
from llamad.cache.lookup import Lookup, RowRef
from llamad.cache.prefix import common_prefix_len
from llamad.model.results import CacheHitKind, CacheMiss

__all__ = [
    "RESTORE_OVER_LIVE",
    "LiveSource",
    "Resolution",
    "common_prefix",
    "decide_continue",
    "decide_fresh",
    "decide_sticky",
    "explain_miss",
    "keeps_target_logits",
    "restore_beats_live",
    "sticky_needs_lookup",
    "with_stored_logits",
]


RESTORE_OVER_LIVE = 0.01
"""A row is restored over live KV only when it covers more than the live KV by
this share of its own length. Restoring a token costs ~6 µs here (47 MB per
2,048 tokens through lookup, CRC and unpack), prefilling one ~3 ms: the true
ratio is ~0.002, and this errs towards keeping cells that cost nothing."""


@dataclass(frozen=True, slots=True)
class LiveSource:
    """A sequence whose KV starts with the target's first ``common`` tokens.

    ``own``: the request's own sequence (an idle entry it took), kept in
    place; otherwise ``seq``'s first tokens are shared into the request's.
    ``logits_position``: the position whose logits come with it, if any.
    """

    seq: int
    common: int
    own: bool
    logits_position: int | None = None


@dataclass(frozen=True, slots=True)
class Resolution:
    """How a sequence gets to hold the target's first ``keep`` tokens.

    With ``restore``, the row is unpacked into the sequence and then truncated
    to ``keep``; with ``copy_from``, that sequence's first ``keep`` tokens are
    shared into this one; otherwise the sequence's current KV is truncated to
    ``keep``. ``read``: target tokens the restored row or the live KV covered
    (``cache_delta.read``). ``live``: the kept tokens are live KV (the
    sequence's own, a session's, or ``copy_from``'s), not a row.
    ``stored_logits``: the row or the live KV comes with the logits of the
    target's last position; ``keep`` is the whole target and the first token
    is sampled from them.
    """

    kind: CacheHitKind
    keep: int
    restore: RowRef | None = None
    read: int = 0
    stored_logits: bool = False
    copy_from: int | None = None
    live: bool = False


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Number of leading tokens ``a`` and ``b`` share (memcmp speed on long runs)."""
    return shared_prefix(a, tokens_to_bytes(b[: len(a)]))


def shared_prefix(tokens: Sequence[int], packed: bytes) -> int:
    """:func:`common_prefix` of ``tokens`` and the tokens ``packed`` holds
    (:func:`~llamad.cache.key.tokens_to_bytes`), packed once by their owner.

    A request's target is compared with every live sequence, by up to three
    lookups a tick (releasing idle entries, following a prefill, resolving):
    packing both sides each time took a quarter of a worker's time on a
    2,048-token back-to-back repeat (py-spy), packing the target once halves it."""
    n = min(len(tokens), len(packed) // TOKEN_BYTES)
    if n == 0 or tokens[0] != int.from_bytes(packed[:TOKEN_BYTES], "little"):
        return 0
    mine = tokens_to_bytes(tokens[:n] if len(tokens) > n else tokens)
    return common_prefix_len(mine, packed) // TOKEN_BYTES


def _held_back(keep: int, target_len: int, wants_logits: bool) -> int:
    return min(keep, target_len - 1 if wants_logits else target_len)


def _usable(lookup: Lookup | None, target_len: int) -> int:
    if lookup is None or lookup.row is None:
        return 0
    return max(0, min(lookup.use_tokens, target_len))


def restore_beats_live(row_use: int, live_use: int) -> bool:
    """Whether restoring a row covering ``row_use`` target tokens (the whole row
    is read) beats keeping ``live_use`` live tokens and prefilling the rest."""
    return row_use - live_use > RESTORE_OVER_LIVE * row_use


def _kind(use: int, target_len: int) -> CacheHitKind:
    return CacheHitKind.EXACT if use == target_len else CacheHitKind.PARTIAL


def decide_fresh(
    target_len: int,
    lookup: Lookup | None,
    *,
    wants_logits: bool,
    live: LiveSource | None = None,
) -> Resolution:
    """A fresh request: keep or share the live KV that covers the most of the
    target, restore what the cache offers when it covers clearly more, or go cold."""
    live_use = 0 if live is None else max(0, min(live.common, target_len))
    use = _usable(lookup, target_len)
    if use > 0 and restore_beats_live(use, live_use):
        assert lookup is not None
        return Resolution(
            _kind(use, target_len), _held_back(use, target_len, wants_logits), lookup.row, use
        )
    if live is None or live_use == 0:
        return Resolution(CacheHitKind.COLD, 0)
    return Resolution(
        _kind(live_use, target_len),
        _held_back(live_use, target_len, wants_logits),
        read=live_use,
        copy_from=None if live.own else live.seq,
        live=True,
    )


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
    return Resolution(
        CacheHitKind.STICKY,
        _held_back(live_common, target_len, wants_logits),
        read=live_common,
        live=True,
    )


def decide_continue(
    held: int, target_len: int, lookup: Lookup | None, *, wants_logits: bool
) -> Resolution:
    """``continue``: keep the ``held`` tokens the session's sequence has; a parked
    session (``held`` 0) restores what the cache has of its transcript first."""
    use = _usable(lookup, target_len)
    if lookup is not None and use > held:
        keep = _held_back(use, target_len, wants_logits)
        return Resolution(CacheHitKind.CONTINUATION, keep, lookup.row, use)
    return Resolution(
        CacheHitKind.CONTINUATION,
        _held_back(held, target_len, wants_logits),
        live=held > 0,
    )


def keeps_target_logits(res: Resolution, target_len: int, logits_position: int | None) -> bool:
    """Whether the row ``res`` restores, or the live KV it keeps, comes with the
    target's own last logits: it covers the whole target and its logits are
    those of exactly the target's last position (``logits_position``; ``None``
    when it keeps none). Logits of another position belong to another prefix."""
    return (
        (res.restore is not None or res.live)
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
    return dataclasses.replace(res, keep=target_len, stored_logits=True)


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
