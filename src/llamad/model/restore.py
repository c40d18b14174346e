"""Carrying out a resolution: live KV, lookup, restore, truncate (SPEC M3, M18, C8).

:mod:`llamad.model.resolution` decides from values; :class:`Restorer` finds
those values (the live KV of the context's sequences, the cache's answer),
brings the request's sequence to the chosen prefix of its target (keeping
its own idle entry in place, sharing another sequence's cells with
``seq_cp``, or unpacking a row), and leaves the request RUNNING with the rest
of its target to feed. KV that covers the whole target and comes with the
logits of its last position is kept whole instead, and the request leaves
with those logits to sample its first token from
(:attr:`Resolution.stored_logits`). A cache that fails (cache-meta
restarting, a row gone corrupt) costs the request its warm start, never the
request: it runs cold.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import structlog

from llamad.cache.kvc import KvcLogits
from llamad.cache.lookup import Lookup, RowRef
from llamad.cache.tier_kind import TierKind
from llamad.errors import LlamadError
from llamad.model.active import ActiveRequest, Phase
from llamad.model.backend import Backend
from llamad.model.cache_view_protocol import CacheView
from llamad.model.config import WorkerConfig
from llamad.model.resolution import (
    LiveSource,
    Resolution,
    decide_continue,
    decide_fresh,
    decide_sticky,
    explain_miss,
    keeps_target_logits,
    shared_prefix,
    sticky_needs_lookup,
    with_stored_logits,
)
from llamad.model.results import CacheHitKind, TokenSources
from llamad.model.savepoints import SaveSchedule, may_save_finish
from llamad.model.slots import SequenceTable, Slot

__all__ = ["Restorer", "best_live"]

log = structlog.get_logger("llamad.model")

_TIER_SOURCE = {
    TierKind.RAM: "ram",
    TierKind.RAM_FILE: "ram_file",
    TierKind.DISK: "disk",
    TierKind.REMOTE: "remote",
}


def _source_logits(slot: Slot, position: int) -> KvcLogits | None:
    """The logits after ``position`` that come with ``slot``'s KV, if it has them:
    an idle entry's kept logits, or its running request's prompt logits."""
    kept = slot.logits_at(position)
    if kept is not None:
        return kept
    owner = slot.owner
    if owner is not None and owner.resolution is not None:
        logits = owner.prompt_logits
        if logits is not None and logits.position == position and position < len(slot.kv):
            return logits
    return None


def best_live(seqs: SequenceTable, req: ActiveRequest, own: Slot) -> LiveSource | None:
    """The sequence whose KV starts with the most of ``req``'s target, in its
    namespace: its own (an idle entry it took) or any other, idle, running or a
    session's. Ties go to its own sequence (kept in place), then to an idle
    entry (nobody is extending it)."""
    best: tuple[int, int, int] | None = None
    found: LiveSource | None = None
    n = len(req.target)
    for slot in seqs:
        if not slot.kv or slot.namespace != req.namespace:
            continue
        if slot is not own and slot.owner is not None and slot.owner.resolution is None:
            continue  # admitted, not resolved: its KV is about to change
        common = shared_prefix(slot.kv, req.packed_target)
        if common == 0:
            continue
        rank = (common, slot is own, slot.idle)
        if best is not None and rank <= best:
            continue
        logits = _source_logits(slot, n - 1) if common == n else None
        best = rank
        found = LiveSource(
            slot.seq,
            common,
            own=slot is own,
            logits_position=None if logits is None else logits.position,
        )
    return found


class Restorer:
    """Resolves admitted requests for one core."""

    def __init__(
        self,
        config: WorkerConfig,
        backend: Backend,
        cache: CacheView,
        clock: Callable[[], float],
        seqs: SequenceTable,
        *,
        on_bad_row: Callable[[bytes], None] = lambda key: None,
        on_row_read: Callable[[bytes], None] = lambda key: None,
    ) -> None:
        self.on_bad_row = on_bad_row
        """Told the key of a row that could not be read (missing, damaged)."""
        self.on_row_read = on_row_read
        """Told the key of a row that was read and unpacked (it is published)."""
        self.config = config
        self.backend = backend
        self.cache = cache
        self.clock = clock
        self.seqs = seqs

    def resolve(self, req: ActiveRequest, slot: Slot, *, may_wait: bool) -> Resolution | None:
        """Bring ``slot`` to a prefix of ``req.target`` and start the request;
        ``None`` when it should wait for a save still in flight instead (the
        caller asks again at a later tick, until ``req.inflight_until``).

        ``may_wait``: the cache may block for a save in flight (nothing else
        is running that the wait would hold up).
        """
        session = req.session
        if slot.kv and slot.namespace != req.namespace:
            # KV computed under other adapters or another salt is not this
            # request's state, whatever its tokens say.
            self.seqs.clear(slot)
        hint = req.params.parent_key
        if hint is None and session is not None:
            hint = session.saved_key
        wants, n = req.wants_logits, len(req.target)
        lookup = None
        live = None
        if req.continuation:
            if not req.session_kv:
                self.seqs.clear(slot)  # a parked session: nothing of it is live
            held = len(slot.kv)
            if held == 0:
                lookup = self._lookup(req, hint, may_wait)
            res = decide_continue(held, n, lookup, wants_logits=wants)
        elif req.session_kv and slot.kv:
            common = shared_prefix(slot.kv, req.packed_target)
            if sticky_needs_lookup(common, n, wants_logits=wants):
                lookup = self._lookup(req, hint, may_wait)
            res = decide_sticky(common, n, lookup, wants_logits=wants)
        else:
            live = best_live(self.seqs, req, slot)
            live_common = 0 if live is None else live.common
            if sticky_needs_lookup(live_common, n, wants_logits=wants):
                lookup = self._lookup(req, hint, may_wait)
                if self._waits_for_inflight(req, lookup, live_common):
                    self._checkin(lookup)
                    return None
            res = decide_fresh(n, lookup, wants_logits=wants, live=live)
        try:
            res = self._apply(req, slot, res)
        finally:
            self._checkin(lookup)
        self._start(req, res, lookup)
        return res

    def _waits_for_inflight(
        self, req: ActiveRequest, lookup: Lookup | None, live_common: int
    ) -> bool:
        """Whether ``req`` should wait for a save in flight that would serve it
        better than the published row and the live KV (SPEC M18), within its
        bound (``session_resume_wait_ms`` from the first time it saw one)."""
        if lookup is None or lookup.inflight_key is None or lookup.resumed:
            return False
        usable = max(0, min(lookup.use_tokens, len(req.target))) if lookup.row else 0
        if lookup.inflight_tokens <= max(usable, live_common):
            return False
        now = self.clock()
        if req.inflight_until is None:
            req.inflight_until = now + self.config.policy.session_resume_wait_ms / 1000.0
        return now < req.inflight_until

    def _lookup(
        self, req: ActiveRequest, parent_key: bytes | None, may_wait: bool
    ) -> Lookup | None:
        wait_s = 0.0
        started = self.clock()
        if may_wait:
            # The cache waits only for a save in flight: the parent's, or one
            # that would serve this prompt better than any published row. One
            # bound for the request, however many times it asks.
            if req.inflight_until is None:
                req.inflight_until = started + self.config.policy.session_resume_wait_ms / 1000.0
            wait_s = max(0.0, req.inflight_until - started)
        try:
            lookup = self.cache.resolve(
                req.namespace, req.target, parent_key=parent_key, wait_s=wait_s
            )
        except (LlamadError, OSError) as exc:
            log.warning("model.lookup_failed", request_id=req.request_id, error=repr(exc))
            return None
        finally:
            req.lookup_ms += (self.clock() - started) * 1000.0
        if wait_s > 0 and req.waited_from is None and (lookup.resumed or lookup.inflight_key):
            req.waited_from = started  # the cache held the answer back for it
        return lookup

    def _restore(
        self, req: ActiveRequest, slot: Slot, row: RowRef, covered: int
    ) -> tuple[bool, KvcLogits | None]:
        """Unpack ``row`` into the slot's sequence: whether it was, and the
        logits the row keeps (immutable, usable after the read). The row's
        first ``covered`` tokens are the target's."""
        # Whatever happens next, the sequence no longer holds its old tokens.
        self.seqs.clear(slot)
        started = self.clock()
        try:
            with self.cache.read(row) as got:
                if got is None:
                    self.on_bad_row(row.key)
                    return False, None
                if not self.backend.may_unpack_unchecked(got.payload, row.n_tokens):
                    got.check()  # before llama.cpp reads a byte of it
                self.backend.unpack(slot.seq, got.payload)
                # A ram row's checksum runs beside the unpack (RowRead.check):
                # a damaged row's cells are dropped below before anything
                # reads them.
                got.check()
                logits = got.logits
        except (LlamadError, OSError) as exc:
            log.warning("model.restore_failed", seq=slot.seq, key=row.key.hex(), error=repr(exc))
            self.seqs.forget(slot)
            self.on_bad_row(row.key)
            return False, None
        finally:
            req.load_ms += (self.clock() - started) * 1000.0
        self.on_row_read(row.key)
        # Past `covered`, a diverging row holds tokens that are not the
        # target's: they are cut below, never read as the target's.
        tail = [-1] * max(0, row.n_tokens - covered)
        self.seqs.restored(slot, req.target[:covered] + tail)
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
        """Make the sequence hold ``req.target[:res.keep]``: unpack a row, share
        another sequence's cells, or keep its own. A row that cannot be read
        turns the request cold (a continuation stays one, from nothing). KV
        that comes with the logits of the target's last position is kept whole,
        and the request takes them (:func:`with_stored_logits`)."""
        n = len(req.target)
        logits: KvcLogits | None = None
        if res.restore is not None:
            restored, logits = self._restore(req, slot, res.restore, res.read)
            if not restored:
                kind = CacheHitKind.CONTINUATION if req.continuation else CacheHitKind.COLD
                res = Resolution(kind, 0)
                logits = None
        elif res.live:
            source = slot if res.copy_from is None else self.seqs[res.copy_from]
            logits = _source_logits(source, n - 1) if res.read == n else None
        if (
            logits is not None
            and logits.count == self.backend.n_vocab
            and keeps_target_logits(res, n, logits.position)
        ):
            # The KV's logits are the target's own (it covers the whole
            # target): kept for this request's saves, and sampled from when
            # it generates.
            req.prompt_logits = logits
            res = with_stored_logits(res, n, logits.position, wants_logits=req.wants_logits)
        if res.copy_from is not None:
            self.seqs.share(self.seqs[res.copy_from], slot, res.keep)
        else:
            self.seqs.truncate(slot, res.keep)
        # A row or a source may run past the target or diverge after `read`
        # tokens: what the sequence holds now is exactly the target's first
        # `keep` tokens.
        slot.kv[: res.keep] = req.target[: res.keep]
        slot.namespace = req.namespace
        slot.logits = None
        return res

    def _start(self, req: ActiveRequest, res: Resolution, lookup: Lookup | None) -> None:
        n = len(req.target)
        policy = self.config.policy
        cold = res.kind is CacheHitKind.COLD
        req.schedule = SaveSchedule.for_cold_prompt(n, policy) if cold else SaveSchedule(policy)
        # The prompt's last logits are kept for a row that may be written, and
        # for the idle entry a request without a session leaves (an exact
        # repeat then samples from them, however short the prompt).
        req.keep_logits = may_save_finish(
            n,
            max_tokens=req.params.max_tokens,
            n_ctx=self.config.n_ctx,
            prefill_only=req.params.prefill_only,
            policy=policy,
        ) or (self.config.live_reuse and req.session is None and req.wants_logits)
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
            if lookup is not None and lookup.inflight_key is not None:
                # It went on without the row still being written: say which,
                # and how long it waited for it (SPEC M18).
                waited = 0.0 if req.waited_from is None else self.clock() - req.waited_from
                req.miss = msgspec.structs.replace(
                    req.miss,
                    inflight_key=lookup.inflight_key,
                    inflight_tokens=lookup.inflight_tokens,
                    waited_ms=round(max(0.0, waited) * 1000.0, 3),
                )
        req.resolution = res
        req.sources = _sources(res, n)
        req.start_feed(req.target[res.keep :])
        req.phase = Phase.RUNNING
        req.resolved_at = self.clock()


def _sources(res: Resolution, n: int) -> TokenSources:
    """Where the target's tokens come from once ``res`` is carried out."""
    kept = res.keep
    counts = {"computed": n - kept}
    if kept:
        if res.restore is not None:
            counts[_TIER_SOURCE.get(res.restore.tier, "disk")] = kept
        else:
            counts["live"] = kept
    return TokenSources(**counts)
