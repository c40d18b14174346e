"""How a request ends: ``done`` with its result, or ``error`` (SPEC M7, M8).

Ending a request touches four things in a fixed order, gathered here so that
every path (a stop, ``max_tokens``, a cancel, a full context, a failed
decode, shutdown) does the same: the finish save (before the sequence can be
cleared), the session or the sequence (settled, or given back), the sampler
(closed), and the terminal event.
"""

from __future__ import annotations

import structlog

from llamad.errors import LlamadError
from llamad.model.active import ActiveRequest
from llamad.model.backend import Backend
from llamad.model.results import DoneEvent, ErrorEvent, Event, FinishReason
from llamad.model.saver import Saver
from llamad.model.slots import SequenceTable

__all__ = ["Endings"]

log = structlog.get_logger("llamad.model")


class Endings:
    """Ends requests for one core; returns the events that close their streams."""

    def __init__(self, seqs: SequenceTable, saver: Saver, backend: Backend) -> None:
        self.seqs = seqs
        self.saver = saver
        self.backend = backend

    def finish(
        self, req: ActiveRequest, reason: FinishReason, now: float, *, allow_save: bool
    ) -> list[Event]:
        """End ``req`` normally: held text released, finish save, session settled or
        sequence freed, then ``done``. ``allow_save=False`` at shutdown (saved already)."""
        req.finish_reason = reason
        events = req.flush()
        if req.seq is not None and req.resolution is not None:
            self.saver.finish(req, self.seqs[req.seq], allowed=allow_save)
        # The finish save was the last save that could keep the prompt's
        # logits; an idle entry keeps them in memory (release_finished).
        committed = self.seqs.release_finished(req, now)
        req.prompt_logits = None
        self._close_sampler(req)
        result = req.completion(committed=committed, now=now)
        events.append(DoneEvent(result))
        log.info(
            "model.request_done",
            request_id=req.request_id,
            finish_reason=reason.value,
            cache_hit_kind=result.cache_hit_kind.value,
            prompt_tokens=result.stats.prompt_tokens,
            completion_tokens=result.stats.completion_tokens,
        )
        return events

    def fail(self, req: ActiveRequest, exc: LlamadError, now: float) -> list[Event]:
        """End ``req`` with ``error``; its KV is dropped, a session keeps its transcript."""
        req.prompt_logits = None
        self.seqs.release_failed(req, now)
        self._close_sampler(req)
        wire = exc.to_wire()
        log.warning("model.request_failed", request_id=req.request_id, code=exc.code)
        return [ErrorEvent(wire["code"], wire["message"], wire["details"])]

    def _close_sampler(self, req: ActiveRequest) -> None:
        if req.sampler is not None:
            sampler, req.sampler = req.sampler, None
            self.backend.close_sampler(sampler)
