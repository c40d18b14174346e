"""Carrying out a resolution: lookup, restore, truncate (SPEC M3, C8).

:mod:`llamad.model.resolution` decides from values; :class:`Restorer` asks
the cache for those values, restores the chosen row into the request's
sequence, truncates it to what the target shares, and leaves the request
RUNNING with the rest of its target to feed. A row that covers the whole
target and keeps the logits of its last position is kept whole instead, and
the request leaves with those logits to sample its first token from
(:attr:`Resolution.stored_logits`). A cache that fails (cache-meta
restarting, a row gone corrupt) costs the request its warm start, never the
request: it runs cold.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from llamad.cache.kvc import KvcLogits
from llamad.cache.lookup import Lookup, RowRef
from llamad.errors import LlamadError
from llamad.model.active import ActiveRequest, Phase
from llamad.model.backend import Backend
from llamad.model.cacheview import CacheView
from llamad.model.config import WorkerConfig
from llamad.model.resolution import (
    Resolution,
    common_prefix,
    decide_continue,
    decide_fresh,
    decide_sticky,
    explain_miss,
    keeps_target_logits,
    sticky_needs_lookup,
    with_stored_logits,
)
from llamad.model.results import CacheHitKind
from llamad.model.savepoints import SaveSchedule, may_save_finish
from llamad.model.slots import Slot

__all__ = ["Restorer"]

log = structlog.get_logger("llamad.model")


class Restorer:
    """Resolves admitted requests for one core."""

    def __init__(
        self,
        config: WorkerConfig,
        backend: Backend,
        cache: CacheView,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.backend = backend
        self.cache = cache
        self.clock = clock

    def resolve(self, req: ActiveRequest, slot: Slot, *, may_wait: bool) -> Resolution:
        """Bring ``slot`` to a prefix of ``req.target`` and start the request.

        ``may_wait``: the cache may block for an in-flight parent save (nothing
        else is running that the wait would hold up).
        """
        session = req.session
        if session is not None and slot.kv and session.namespace != req.namespace:
            # KV computed under other adapters or another salt is not this
            # request's state, whatever its tokens say.
            self.backend.seq_truncate(slot.seq, 0)
            slot.kv = []
        hint = req.params.parent_key
        if hint is None and session is not None:
            hint = session.saved_key
        wants, n = req.wants_logits, len(req.target)
        lookup = None
        if req.continuation:
            held = len(slot.kv)
            if held == 0:
                lookup = self._lookup(req, hint, may_wait)
            res = decide_continue(held, n, lookup, wants_logits=wants)
        elif slot.kv:
            common = common_prefix(slot.kv, req.target)
            if sticky_needs_lookup(common, n, wants_logits=wants):
                lookup = self._lookup(req, hint, may_wait)
            res = decide_sticky(common, n, lookup, wants_logits=wants)
        else:
            lookup = self._lookup(req, hint, may_wait)
            res = decide_fresh(n, lookup, wants_logits=wants)
        try:
            res = self._apply(req, slot, res)
        finally:
            self._checkin(lookup)
        self._start(req, res, lookup)
        return res

    def _lookup(
        self, req: ActiveRequest, parent_key: bytes | None, may_wait: bool
    ) -> Lookup | None:
        wait_s = 0.0
        if parent_key is not None and may_wait:
            wait_s = self.config.policy.session_resume_wait_ms / 1000.0
        try:
            return self.cache.resolve(
                req.namespace, req.target, parent_key=parent_key, wait_s=wait_s
            )
        except (LlamadError, OSError) as exc:
            log.warning("model.lookup_failed", request_id=req.request_id, error=repr(exc))
            return None

    def _restore(self, slot: Slot, row: RowRef) -> tuple[bool, KvcLogits | None]:
        """Unpack ``row`` into the slot's sequence: whether it was, and the
        logits the row keeps (immutable, usable after the read)."""
        if slot.kv:
            # Whatever happens next, the sequence no longer holds its old tokens.
            self.backend.seq_truncate(slot.seq, 0)
            slot.kv = []
        try:
            with self.cache.read(row) as got:
                if got is None:
                    return False, None
                self.backend.unpack(slot.seq, got.payload)
                logits = got.logits
        except (LlamadError, OSError) as exc:
            log.warning("model.restore_failed", seq=slot.seq, key=row.key.hex(), error=repr(exc))
            self.backend.seq_truncate(slot.seq, 0)
            return False, None
        return True, logits

    def _checkin(self, lookup: Lookup | None) -> None:
        if lookup is None or lookup.row is None or lookup.row.pin is None:
            return
        try:
            self.cache.checkin(lookup.row.pin)
        except (LlamadError, OSError) as exc:
            # cache-meta releases the pins of a process it sees die; a lost
            # checkin only delays that row's eviction.
            log.warning("model.checkin_failed", error=repr(exc))

    def _apply(self, req: ActiveRequest, slot: Slot, res: Resolution) -> Resolution:
        """Make the sequence hold ``req.target[:res.keep]``; a row that cannot be
        read turns the request cold (a continuation stays one, from nothing).
        A row keeping the logits of the target's last position is kept whole,
        and the request takes them (:func:`with_stored_logits`)."""
        if res.restore is not None:
            restored, logits = self._restore(slot, res.restore)
            if not restored:
                kind = CacheHitKind.CONTINUATION if req.continuation else CacheHitKind.COLD
                res = Resolution(kind, 0)
            elif (
                logits is not None
                and logits.count == self.backend.n_vocab
                and keeps_target_logits(res, len(req.target), logits.position)
            ):
                # The row's logits are the target's own (it covers the whole
                # target): kept for this request's saves, and sampled from
                # when it generates.
                req.prompt_logits = logits
                res = with_stored_logits(
                    res, len(req.target), logits.position, wants_logits=req.wants_logits
                )
        if res.restore is not None or len(slot.kv) > res.keep:
            # A restored row may run past the target or diverge after `read` tokens.
            self.backend.seq_truncate(slot.seq, res.keep)
        slot.kv = req.target[: res.keep]
        return res

    def _start(self, req: ActiveRequest, res: Resolution, lookup: Lookup | None) -> None:
        n = len(req.target)
        policy = self.config.policy
        cold = res.kind is CacheHitKind.COLD
        req.schedule = SaveSchedule.for_cold_prompt(n, policy) if cold else SaveSchedule(policy)
        req.keep_logits = may_save_finish(
            n,
            max_tokens=req.params.max_tokens,
            n_ctx=self.config.n_ctx,
            prefill_only=req.params.prefill_only,
            policy=policy,
        )
        if res.restore is not None and res.restore.n_tokens == res.read:
            # The restored row is exactly the target's first `read` tokens.
            req.schedule.record(res.read)
        if res.kind in (CacheHitKind.PARTIAL, CacheHitKind.COLD):
            req.miss = explain_miss(
                req.target,
                lookup,
                res.read,
                window=self.config.miss_window,
                piece=self.backend.piece,
            )
        req.resolution = res
        req.start_feed(req.target[res.keep :])
        req.phase = Phase.RUNNING
        req.resolved_at = self.clock()
