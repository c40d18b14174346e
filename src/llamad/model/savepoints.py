"""Save points: when a sequence's KV is saved, and at which token count (SPEC M5, C7).

The core decides; the shell packs and writes. Five reasons
(:class:`~llamad.cache.kvc.SaveReason`):

- ``cold``: a cold prefill stops at the trimmed, aligned boundary
  (:func:`~llamad.cache.policy.cold_save_split`), is saved there, and goes
  on. The planner never lets a prefill chunk cross that boundary
  (:meth:`SaveSchedule.limit`), so the sequence holds exactly the boundary's
  tokens at the end of some tick.
- ``continued``: every ``continued_interval`` generated tokens.
- ``finish``: when a request ends, the sequence as it stands (prompt and
  reply, less a last sampled token that was never decoded); for
  ``prefill_only`` whatever its length, since warming the cache is the point.
- ``evict``: synchronously, before an idle session's sequence is taken for
  another request or its cells for another sequence.
- ``shutdown``: synchronously, for every live sequence when the worker stops,
  all of them within ``evict_save_timeout_ms``.

A sequence is saved whole (``llama_state_seq_get_data``), so a save at ``n``
tokens is taken when the sequence holds exactly ``n``: between ticks, right
after the decode that got it there.

A row may also keep the logits of its target's last position
(:class:`~llamad.cache.kvc.KvcLogits`): a request that computed them, and
whose finish save may be taken (:func:`may_save_finish`), hands them with
every save whose tokens reach that position. An exact repeat of the target
then samples its first token from them instead of decoding that position
again (:mod:`llamad.model.resolution`).
"""

from __future__ import annotations

from dataclasses import dataclass

from llamad.cache.key import Namespace
from llamad.cache.kvc import KvcLogits, SaveReason
from llamad.cache.policy import CachePolicy, cold_save_split, should_continued_save

__all__ = ["SYNC_REASONS", "SaveJob", "SaveSchedule", "may_save_finish"]

SYNC_REASONS = frozenset({SaveReason.EVICT, SaveReason.SHUTDOWN})
"""Saves that must be written before the core goes on: the sequence is about to go."""


@dataclass(frozen=True, slots=True)
class SaveJob:
    """One save the core orders: the shell writes ``tokens``' row under ``key``.

    ``deadline`` (the core's clock) caps a synchronous save; ``None`` for async.
    ``logits``: the logits of one of ``tokens``' positions, kept in the row.
    """

    reason: SaveReason
    key: bytes
    namespace: Namespace
    tokens: tuple[int, ...]
    seq: int
    request_id: str | None = None
    session_id: str | None = None
    deadline: float | None = None
    logits: KvcLogits | None = None

    @property
    def sync(self) -> bool:
        return self.reason in SYNC_REASONS

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)


class SaveSchedule:
    """The save points of one request, from admission to its finish save."""

    def __init__(self, policy: CachePolicy, *, cold_at: int | None = None) -> None:
        self.policy = policy
        self.cold_at = cold_at
        """Token count of the pending cold save, if any."""
        self._continued_from: int | None = None
        self.saved_at: set[int] = set()
        """Token counts this request already saved (a row is never saved twice)."""

    @classmethod
    def for_cold_prompt(cls, n_tokens: int, policy: CachePolicy) -> SaveSchedule:
        """The schedule of a prompt prefilled from nothing."""
        split = cold_save_split(n_tokens, policy)
        return cls(policy, cold_at=None if split is None else split.save_at)

    def limit(self, kv_len: int) -> int | None:
        """Most tokens the sequence may gain now before a save must be taken."""
        if self.cold_at is not None and kv_len < self.cold_at:
            return self.cold_at - kv_len
        return None

    def generation_started(self, kv_len: int) -> None:
        """Count the continued interval from here (the prompt is not 'generated')."""
        if self._continued_from is None:
            self._continued_from = kv_len

    def due(self, kv_len: int) -> SaveReason | None:
        """The save to take now that the sequence holds ``kv_len`` tokens, if any."""
        if self.cold_at is not None and kv_len >= self.cold_at:
            reached = kv_len == self.cold_at
            self.cold_at = None
            if reached and kv_len not in self.saved_at:
                return SaveReason.COLD
        last = self._continued_from
        if last is not None and should_continued_save(kv_len, last, self.policy):
            self._continued_from = kv_len
            if kv_len not in self.saved_at:
                return SaveReason.CONTINUED
        return None

    def finish_due(self, kv_len: int, *, prefill_only: bool) -> bool:
        """Whether the finish save should be taken at ``kv_len`` tokens."""
        if kv_len <= 0 or kv_len in self.saved_at:
            return False
        return prefill_only or kv_len >= self.policy.min_tokens

    def record(self, n_tokens: int) -> None:
        self.saved_at.add(n_tokens)


def may_save_finish(
    target_len: int,
    *,
    max_tokens: int | None,
    n_ctx: int,
    prefill_only: bool,
    policy: CachePolicy,
) -> bool:
    """Whether a request's finish save can be taken at all (:meth:`SaveSchedule.finish_due`):
    always for ``prefill_only``, else when the longest transcript it may commit
    (its target and all but the last of ``max_tokens`` replies, within
    ``n_ctx``) reaches ``min_tokens``. Only such a request keeps its target's
    last logits: they are worth their memory (``n_vocab`` float32s) only to a
    row that may be written.
    """
    if prefill_only:
        return True
    longest = n_ctx if max_tokens is None else min(n_ctx, target_len + max_tokens - 1)
    return longest >= policy.min_tokens
