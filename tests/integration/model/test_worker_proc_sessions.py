"""Sessions over the wire (SPEC M2, M12): sticky, sticky_busy, continue, no_session,
fork, expect_committed, reset and end, through a real worker process."""

from __future__ import annotations

from typing import Any

import pytest

from llamad.errors import NoSession, StickyBusy, TranscriptMismatch
from llamad.model.results import CacheHitKind, FinishReason, TokenEvent
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY = {"temperature": 0.0}
ENDLESS = 'root ::= "la " root'


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(n_seq_max=2, prefix="lms")


def tail(w: WorkerClient, text: str) -> list[int]:
    return w.tokenize(text, add_special=False)


def test_sticky_session_keeps_its_sequence_between_requests(worker: WorkerClient) -> None:
    first = worker.complete(prompt_text(10), session_id="sticky", max_tokens=4, **GREEDY)
    assert first.session_id == "sticky"
    more = tail(worker, " What next?")
    second = worker.complete(
        first.context_tokens + more, session_id="sticky", max_tokens=4, **GREEDY
    )
    assert second.cache_hit_kind is CacheHitKind.STICKY
    # Only what the sequence does not hold yet is decoded: the last sampled
    # token of the first turn, and the new tail.
    uncommitted = len(first.context_tokens) - first.committed_tokens
    assert second.stats.prefill_tokens == uncommitted + len(more)
    worker.end_session("sticky")


def test_second_request_on_a_busy_session_is_sticky_busy(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    stream = worker.infer(
        prompt_text(11), session_id="busy", max_tokens=500, grammar=ENDLESS, **GREEDY
    )
    events = iter(stream)
    assert any(isinstance(e, TokenEvent) for e in events)  # it holds the session now
    other = tree.client()
    with pytest.raises(StickyBusy):
        other.complete(prompt_text(12), session_id="busy", max_tokens=2)
    with pytest.raises(StickyBusy):
        other.end_session("busy")
    stream.cancel()
    tree.wait_idle()
    worker.end_session("busy")


def test_continue_extends_the_session_and_checks_the_callers_view(worker: WorkerClient) -> None:
    first = worker.complete(prompt_text(13), session_id="cont", max_tokens=4, **GREEDY)
    more = tail(worker, " Go on.")
    with pytest.raises(TranscriptMismatch):
        worker.complete(
            more,
            session_id="cont",
            continue_=True,
            expect_committed=first.committed_tokens + 1,
            max_tokens=2,
        )
    second = worker.complete(
        more,
        session_id="cont",
        continue_=True,
        expect_committed=first.committed_tokens,
        max_tokens=3,
        **GREEDY,
    )
    assert second.cache_hit_kind is CacheHitKind.CONTINUATION
    assert second.context_tokens == first.context_tokens + more + second.generated
    worker.end_session("cont")


def test_continue_on_an_unknown_session_is_no_session(worker: WorkerClient) -> None:
    with pytest.raises(NoSession):
        worker.complete([1, 2, 3], session_id="nobody", continue_=True, max_tokens=2)


def test_fork_continues_exactly_like_its_source(worker: WorkerClient) -> None:
    base = worker.complete(prompt_text(14), session_id="src", max_tokens=4, **GREEDY)
    assert worker.fork_session("src", "fork") is True  # a free sequence: KV copied
    more = tail(worker, " And?")
    a = worker.complete(more, session_id="src", continue_=True, max_tokens=4, **GREEDY)
    b = worker.complete(more, session_id="fork", continue_=True, max_tokens=4, **GREEDY)
    assert b.generated == a.generated
    assert b.context_tokens == a.context_tokens
    assert b.context_tokens[: len(base.context_tokens)] == base.context_tokens
    worker.end_session("src")
    worker.end_session("fork")


def test_reset_empties_the_transcript_and_end_forgets_the_session(
    worker: WorkerClient,
) -> None:
    worker.complete(prompt_text(15), session_id="gone", max_tokens=2, **GREEDY)
    worker.reset_session("gone")
    fresh = worker.complete([5, 6, 7, 8], session_id="gone", continue_=True, max_tokens=2)
    assert fresh.context_tokens[:4] == [5, 6, 7, 8]
    assert fresh.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
    worker.end_session("gone")
    with pytest.raises(NoSession):
        worker.end_session("gone")
    with pytest.raises(NoSession):
        worker.complete([1, 2], session_id="gone", continue_=True, max_tokens=2)
