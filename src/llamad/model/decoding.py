"""Running one planned batch: decode, commit, sample, and what each request made of it.

:func:`run_batch` is the middle of a tick. It hands the plan to the backend,
records the decoded tokens as held by their sequences, samples every logits
row through the request's sampler, feeds the sampled token to the request
(events, stop strings, endings), and takes the save points now due. It ends
nothing itself: it answers, per request, the events to stream and whether the
request finished or failed, and the core carries that out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llamad.errors import LlamadError
from llamad.model.active import ActiveRequest
from llamad.model.backend import Backend
from llamad.model.planner import BatchPlan
from llamad.model.results import Event, FinishReason
from llamad.model.saver import Saver
from llamad.model.slots import SequenceTable, Slot

__all__ = ["Outcome", "run_batch"]


@dataclass(eq=False)
class Outcome:
    """What one request got from a tick."""

    req: ActiveRequest
    events: list[Event] = field(default_factory=list)
    finished: FinishReason | None = None
    error: LlamadError | None = None


def run_batch(
    plan: BatchPlan,
    *,
    backend: Backend,
    seqs: SequenceTable,
    saver: Saver,
    n_ctx: int,
    clock: Callable[[], float],
) -> list[Outcome]:
    """Decode ``plan`` and sample it; one :class:`Outcome` per request in the batch.

    Tokens are stamped with ``clock()`` read once the decode has returned: a
    first token exists when its logits do, so ``prefill_ms`` counts the decode
    that computed them (on an exact hit, the held-back token's decode).
    """
    owners = [seqs[span.seq].owner for span in plan.spans]
    try:
        backend.decode(plan)
    except LlamadError as exc:
        # The KV of every sequence in the batch is now unknown.
        return [Outcome(req, error=exc) for req in owners if req is not None]
    now = clock()
    outcomes = []
    for span, req in zip(plan.spans, owners, strict=True):
        assert req is not None
        slot = seqs[span.seq]
        slot.kv.extend(span.tokens)
        req.consumed(len(span.tokens))
        out = Outcome(req)
        outcomes.append(out)
        if span.want_logits and not _sample(out, slot, plan, backend=backend, n_ctx=n_ctx, now=now):
            continue
        saver.save_due(req, slot)
        if req.finish_reason is not None:
            out.finished = req.finish_reason
        elif req.remaining == 0 and not req.wants_logits:
            out.finished = FinishReason.LENGTH  # prefill_only: all fed
    return outcomes


def _sample(
    out: Outcome, slot: Slot, plan: BatchPlan, *, backend: Backend, n_ctx: int, now: float
) -> bool:
    req = out.req
    if req.schedule is not None:
        req.schedule.generation_started(len(slot.kv))
    try:
        row = plan.output_row(slot.seq)
        sampled = backend.sample(req.sampler, row, req.params.logprobs)
        eog = backend.is_eog(sampled.token)
        piece = b"" if eog else backend.piece(sampled.token)
    except LlamadError as exc:
        out.error = exc
        return False
    out.events = req.accept(
        sampled, eog=eog, piece=piece, kv_len=len(slot.kv), n_ctx=n_ctx, now=now
    )
    return True
