"""Admission (SPEC M2): the sequence pool, the bounded FIFO queue, refusals, cancellation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.errors import BadRequest, ContextOverflow, LlamadError, Overloaded, Unavailable
from llamad.llama_ffi.errors import GrammarError, InvalidToken
from llamad.model.active import Phase
from llamad.model.admission import AdmissionQueue, SequencePool
from llamad.model.results import FinishReason, WorkerPhase
from worker_harness import make, prompt

pytestmark = pytest.mark.timeout(60)


def test_pool_hands_out_the_lowest_free_sequence() -> None:
    pool = SequencePool(3)
    assert [pool.acquire(), pool.acquire()] == [0, 1]
    pool.release(0)
    assert pool.acquire() == 0
    assert pool.acquire() == 2
    assert pool.acquire() is None


def test_pool_refuses_a_double_release() -> None:
    pool = SequencePool(2)
    seq = pool.acquire()
    assert seq is not None
    pool.release(seq)
    with pytest.raises(LlamadError):
        pool.release(seq)


def test_queue_is_first_in_first_out_and_bounded() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(2)
    assert queue.push("a", "A") == 0
    assert queue.push("b", "B") == 1
    with pytest.raises(Overloaded) as err:
        queue.push("c", "C")
    assert err.value.details == {"queue_depth": 2, "max_queue": 2}
    assert queue.remove("a") == "A"
    assert queue.push("c", "C") == 1
    assert [queue.pop(), queue.pop()] == ["B", "C"]


def test_requests_beyond_the_pool_get_sequences_in_submission_order() -> None:
    h = make(n_seq_max=2, max_queue=8)
    positions = [h.submit(f"r{i}", prompt(12, start=i), max_tokens=3) for i in range(6)]
    assert positions == [None, None, 0, 1, 2, 3]
    h.run()
    queued = [h.result(f"r{i}").stats.queue_ms for i in range(6)]
    assert queued[:2] == [0.0, 0.0]
    assert queued == sorted(queued)
    assert len(set(queued[2:])) > 1


def test_a_full_queue_refuses_with_overloaded_and_leaves_no_trace() -> None:
    h = make(n_seq_max=1, max_queue=1)
    h.submit("a", prompt(10), max_tokens=2)
    assert h.submit("b", prompt(10), max_tokens=2) == 0
    with pytest.raises(Overloaded):
        h.submit("c", prompt(10), max_tokens=2)
    assert "c" not in h.core.requests
    assert h.backend.samplers_open == 2
    assert h.core.status().queue_depth == 1


def test_max_queue_zero_means_no_waiting() -> None:
    h = make(n_seq_max=1, max_queue=0)
    h.submit("a", prompt(10), max_tokens=2)
    with pytest.raises(Overloaded):
        h.submit("b", prompt(10), max_tokens=2)


def test_a_queued_request_cancelled_ends_at_once_without_a_sequence() -> None:
    h = make(n_seq_max=1)
    h.submit("a", prompt(10), max_tokens=5)
    h.submit("b", prompt(10), max_tokens=5)
    assert h.core.cancel("b")
    h.drain()
    result = h.result("b")
    assert result.finish_reason is FinishReason.CANCELLED
    assert result.generated == []
    assert h.core.status().queue_depth == 0
    assert not h.core.cancel("b")


def test_cancel_is_observed_between_ticks_and_frees_the_sequence() -> None:
    h = make(n_seq_max=1)
    h.submit("a", prompt(10), max_tokens=100)
    h.submit("b", prompt(10, start=3), max_tokens=2)
    for _ in range(3):
        h.step()
    generated_before = sum(1 for e in h.events["a"] if type(e).__name__ == "TokenEvent")
    assert h.core.cancel("a")
    report = h.step()
    assert report.finished[0] == "a"
    result = h.result("a")
    assert result.cancelled
    assert len(result.generated) == generated_before
    # The freed sequence went to the queued request in the same tick.
    assert report.batch.spans[0].seq == 0
    assert h.core.slots[0].owner is not None and h.core.slots[0].owner.request_id == "b"
    h.run()
    assert h.result("b").finish_reason is FinishReason.LENGTH


def test_a_running_request_id_cannot_be_reused() -> None:
    h = make()
    h.submit("a", prompt(10))
    with pytest.raises(BadRequest):
        h.submit("a", prompt(10))


@pytest.mark.parametrize("bad", [-1, 256, 10**9])
def test_token_ids_outside_the_vocabulary_are_refused(bad: int) -> None:
    h = make()
    with pytest.raises(InvalidToken) as err:
        h.submit("a", [1, 2, bad])
    assert err.value.details["index"] == 2
    assert not h.core.requests


def test_an_empty_prompt_is_refused() -> None:
    with pytest.raises(BadRequest):
        make().submit("a", [])


def test_a_prompt_longer_than_the_context_is_refused() -> None:
    h = make(n_ctx=64, n_batch=32)
    with pytest.raises(ContextOverflow):
        h.submit("a", prompt(65))
    h.submit("b", prompt(64), max_tokens=4)
    h.run()
    # A prompt that fills the context gets its one token, then runs out of room.
    result = h.result("b")
    assert len(result.generated) == 1
    assert result.finish_reason is FinishReason.LENGTH


def test_an_invalid_grammar_is_refused_before_admission() -> None:
    h = make()
    with pytest.raises(GrammarError):
        h.submit("a", prompt(10), grammar="start ::= x")
    assert not h.core.requests
    assert h.backend.samplers_open == 0


def test_status_counts_queued_and_running_requests() -> None:
    h = make(n_seq_max=1)
    assert h.core.status().phase is WorkerPhase.IDLE
    h.submit("a", prompt(40), max_tokens=3)
    h.submit("b", prompt(40), max_tokens=3)
    status = h.core.status()
    assert (status.pending_len, status.queue_depth, status.active_sequences) == (2, 1, 1)
    assert status.free_sequences == 0
    assert status.phase is WorkerPhase.PREFILLING
    while not h.core.requests["a"].generating:
        h.step()
    assert h.core.status().phase is WorkerPhase.GENERATING
    h.run()
    assert h.core.status().phase is WorkerPhase.IDLE
    assert h.core.status().last_cache_hit is not None


def test_after_shutdown_submissions_are_refused() -> None:
    h = make()
    h.core.shutdown()
    with pytest.raises(Unavailable):
        h.submit("a", prompt(4))


def test_an_idle_core_has_no_work_and_no_wakeup() -> None:
    h = make()
    assert not h.core.has_work() and h.core.next_wakeup() is None
    assert h.step().idle
    h.submit("a", prompt(5), max_tokens=1)
    assert h.core.has_work()
    h.run()
    assert not h.core.has_work()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 6), st.booleans()), min_size=1, max_size=8
    ),
)
def test_sequences_are_granted_in_submission_order(
    n_seq_max: int, requests: list[tuple[int, int, bool]]
) -> None:
    h = make(n_seq_max=n_seq_max, max_queue=16, n_batch=64)
    for i, (length, max_tokens, _) in enumerate(requests):
        h.submit(f"r{i}", prompt(length, start=i), max_tokens=max_tokens)
    for i, (_, _, cancel) in enumerate(requests):
        if cancel and h.core.requests[f"r{i}"].phase is Phase.QUEUED:
            h.core.cancel(f"r{i}")
    h.run()
    # Everyone was submitted at the same instant, so queue_ms orders the grants.
    granted = [
        h.result(f"r{i}").stats.queue_ms
        for i in range(len(requests))
        if h.result(f"r{i}").generated
    ]
    assert granted == sorted(granted)
    assert h.core.status().free_sequences == n_seq_max
