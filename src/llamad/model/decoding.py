"""Running one planned batch: decode, commit, sample, and what each request made of it.

:func:`run_batch` is the middle of a tick. It hands the plan to the backend,
records the decoded tokens as held by their sequences, samples every logits
row through the request's sampler, feeds the sampled token to the request
(events, stop strings, endings), and takes the save points now due. It ends
nothing itself: it answers, per request, the events to stream and whether the
request finished or failed, and the core carries that out.

When a request decodes its target's last token and keeps logits for its saves
(:attr:`ActiveRequest.keep_logits`), the row's logits are copied before it is
sampled; ``prefill_only`` decodes that token alone for this alone. A request
restored with the logits of its target's last position samples its first
token from them (:func:`sample_stored`), with no decode at all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import structlog

from llamad.cache.kvc import KvcLogits
from llamad.errors import LlamadError, RequestTimeout
from llamad.llama_ffi.errors import DecodeAborted
from llamad.model.active import ActiveRequest
from llamad.model.backend import Backend, Sampled
from llamad.model.planner import BatchPlan
from llamad.model.results import Event, FinishReason
from llamad.model.saver import Saver
from llamad.model.slots import SequenceTable, Slot

__all__ = ["Outcome", "run_batch", "sample_stored"]

log = structlog.get_logger("llamad.model")


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
    except DecodeAborted as exc:
        return _aborted(plan, owners, exc, backend)
    except LlamadError as exc:
        # The KV of every sequence in the batch is now unknown.
        return [Outcome(req, error=exc) for req in owners if req is not None]
    now = clock()
    outcomes = []
    for span, req in zip(plan.spans, owners, strict=True):
        assert req is not None
        slot = seqs[span.seq]
        seqs.extend(slot, span.tokens)
        req.consumed(len(span.tokens))
        out = Outcome(req)
        outcomes.append(out)
        if span.want_logits:
            row = plan.output_row(slot.seq)
            if req.keep_logits and not req.generating and req.remaining == 0:
                _keep_target_logits(req, row, backend)
            if req.wants_logits and not _sample(
                out,
                slot,
                partial(backend.sample, req.sampler, row, req.params.logprobs),
                backend=backend,
                n_ctx=n_ctx,
                now=now,
            ):
                continue
        saver.save_due(req, slot)
        if req.finish_reason is not None:
            out.finished = req.finish_reason
        elif req.remaining == 0 and not req.wants_logits:
            out.finished = FinishReason.LENGTH  # prefill_only: all fed
    return outcomes


def _aborted(
    plan: BatchPlan,
    owners: list[ActiveRequest | None],
    exc: DecodeAborted,
    backend: Backend,
) -> list[Outcome]:
    """A decode stopped under way (a cancel, a shutdown, its deadline): put
    every sequence of the batch back where the plan found it.

    llama.cpp dropped the rows of the micro-batch it was computing, but not
    those of earlier micro-batches of the same call (a plan of more than
    ``n_ubatch`` rows), and their logits are never read: so each sequence is
    cut back to its span's first position, and the step counts as never run.
    Its requests go on and the next tick plans their rows again (a
    cancelled one ends there); after its deadline they fail ``timeout``,
    since a decode that slow would likely run past it again.
    """
    reqs = [req for req in owners if req is not None]
    try:
        for span in plan.spans:
            backend.seq_truncate(span.seq, span.pos)
    except LlamadError as cut:
        # Where the KV stands is unknown: as for any failed decode.
        return [Outcome(req, error=cut) for req in reqs]
    log.info(
        "model.decode_aborted",
        reason=exc.reason,
        rows=plan.n_rows,
        requests=[req.request_id for req in reqs],
    )
    if exc.reason != "deadline":
        return [Outcome(req) for req in reqs]
    timeout = RequestTimeout(
        "the decode ran past the worker's decode_timeout_ms and was stopped",
        details={"where": "decode", "rows": plan.n_rows},
    )
    return [Outcome(req, error=timeout) for req in reqs]


def sample_stored(
    req: ActiveRequest, slot: Slot, *, backend: Backend, n_ctx: int, clock: Callable[[], float]
) -> Outcome:
    """The first token of a request restored with its target's last logits
    (:attr:`ActiveRequest.prompt_logits`): sampled from them through the
    request's chain, as the decode that computed them would have, and fed
    back like any sampled token (decoded at the next tick). Nothing is decoded
    here, so nothing is committed and no save falls due."""
    out = Outcome(req)
    logits = req.prompt_logits
    assert logits is not None
    _sample(
        out,
        slot,
        partial(backend.sample_logits, req.sampler, logits.values, req.params.logprobs),
        backend=backend,
        n_ctx=n_ctx,
        now=None,
        clock=clock,
    )
    if not req.keep_logits:
        req.prompt_logits = None  # no save of this request can keep them
    if out.error is None and req.finish_reason is not None:
        out.finished = req.finish_reason
    return out


def _keep_target_logits(req: ActiveRequest, row: int, backend: Backend) -> None:
    try:
        values = backend.row_logits(row)
    except LlamadError as exc:
        # The row only misses its logits: an exact repeat decodes the position again.
        log.warning("model.logits_not_kept", request_id=req.request_id, error=repr(exc))
        return
    req.prompt_logits = KvcLogits(len(req.target) - 1, values)


def _sample(
    out: Outcome,
    slot: Slot,
    draw: Callable[[], Sampled],
    *,
    backend: Backend,
    n_ctx: int,
    now: float | None,
    clock: Callable[[], float] | None = None,
) -> bool:
    req = out.req
    if req.schedule is not None:
        req.schedule.generation_started(len(slot.kv))
    try:
        sampled = draw()
        eog = backend.is_eog(sampled.token)
        piece = b"" if eog else backend.piece(sampled.token)
    except LlamadError as exc:
        out.error = exc
        return False
    if now is None:
        assert clock is not None
        now = clock()  # a first token exists once it is sampled
    out.events = req.accept(
        sampled, eog=eog, piece=piece, kv_len=len(slot.kv), n_ctx=n_ctx, now=now
    )
    return True
