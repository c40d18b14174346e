"""Sessions (SPEC M2, M12): the table's transitions and sticky, continue, fork, reset, end, park."""

from __future__ import annotations

import pytest

from llamad.cache.key import Namespace
from llamad.cache.kvc import SaveReason
from llamad.errors import BadRequest, NoSession, SessionExists, StickyBusy, TranscriptMismatch
from llamad.model.results import CacheHitKind
from llamad.model.sessions import SessionState, SessionTable
from llamad.model.stub_cache import MemoryCache
from worker_harness import make, prompt

pytestmark = pytest.mark.timeout(60)


# -- the table ---------------------------------------------------------------------


def test_a_first_request_opens_a_busy_session_that_settles_idle_or_parked() -> None:
    table = SessionTable()
    s = table.claim("s", "r1", None, now=1.0)
    assert s.state is SessionState.BUSY
    table.bind(s, 0)
    table.settle(s, [1, 2, 3], 2, now=2.0)
    assert (s.state, s.committed, s.transcript) == (SessionState.IDLE, 2, [1, 2, 3])
    assert table.park(s) == 0
    assert s.state is SessionState.PARKED


def test_a_busy_session_refuses_another_request_end_reset_and_fork() -> None:
    table = SessionTable()
    table.claim("s", "r1", None, now=1.0)
    with pytest.raises(StickyBusy):
        table.claim("s", "r2", None, now=1.0)
    for op in (table.end, table.reset):
        with pytest.raises(StickyBusy):
            op("s")
    with pytest.raises(StickyBusy):
        table.fork("s", "t", now=1.0)


def test_unknown_sessions_are_no_session() -> None:
    table = SessionTable()
    for op in (table.end, table.reset, table.known):
        with pytest.raises(NoSession):
            op("ghost")
    with pytest.raises(NoSession):
        table.fork("ghost", "t", now=0.0)


def test_a_fork_into_a_taken_id_is_refused() -> None:
    table = SessionTable()
    s = table.claim("a", "r", None, now=0.0)
    table.settle(s, [1], 1, now=0.0)
    table.claim("b", "r2", None, now=0.0)
    with pytest.raises(SessionExists):
        table.fork("a", "b", now=0.0)


def test_a_session_created_by_a_refused_request_disappears() -> None:
    table = SessionTable()
    table.claim("s", "r1", None, now=0.0)
    table.unclaim_new("s", "r1")
    assert "s" not in table


def test_only_an_idle_live_session_can_be_parked() -> None:
    table = SessionTable()
    s = table.claim("s", "r1", None, now=0.0)
    table.bind(s, 1)
    with pytest.raises(Exception, match="idle"):
        table.park(s)


# -- through the core --------------------------------------------------------------


def test_a_sticky_request_reuses_the_live_sequence() -> None:
    h = make()
    first = h.complete("a", prompt(30), max_tokens=4, session_id="s")
    assert first.cache_hit_kind is CacheHitKind.COLD
    turn2 = first.context_tokens + prompt(6, start=50)
    second = h.complete("b", turn2, max_tokens=4, session_id="s")
    assert second.cache_hit_kind is CacheHitKind.STICKY
    # Only the uncommitted last reply token and the new turn were decoded.
    assert second.stats.prefill_tokens == 1 + 6
    assert second.generated == make().complete("ref", turn2, max_tokens=4).generated


def test_a_sticky_request_that_diverges_truncates_the_live_sequence() -> None:
    h = make()
    first = h.complete("a", prompt(30), max_tokens=4, session_id="s")
    edited = first.context_tokens[:20] + prompt(5, start=3)
    second = h.complete("b", edited, max_tokens=3, session_id="s")
    assert second.cache_hit_kind is CacheHitKind.STICKY
    assert second.stats.prefill_tokens == 5
    assert h.backend.tokens[0] == second.context_tokens[: second.committed_tokens]


def test_a_second_request_on_a_busy_session_is_sticky_busy() -> None:
    h = make(n_seq_max=1)
    h.submit("a", prompt(20), max_tokens=50, session_id="s")
    with pytest.raises(StickyBusy):
        h.submit("b", prompt(20), session_id="s")
    h.submit("other", prompt(8), max_tokens=2)  # queued behind "a"
    h.submit("c", prompt(8), max_tokens=2, session_id="q")  # a new session, queued too
    with pytest.raises(StickyBusy):
        h.submit("d", prompt(8), session_id="q")


def test_continue_appends_the_tail_to_the_transcript() -> None:
    h = make()
    first = h.complete("a", prompt(30), max_tokens=4, session_id="s")
    tail = prompt(5, start=60)
    cont = h.complete("b", tail, max_tokens=3, session_id="s", continue_=True)
    assert cont.cache_hit_kind is CacheHitKind.CONTINUATION
    assert cont.context_tokens == first.context_tokens + tail + cont.generated
    # The pending last reply token goes in first, then the tail.
    assert cont.stats.prefill_tokens == 1 + 5
    reference = make().complete("ref", first.context_tokens + tail, max_tokens=3)
    assert cont.generated == reference.generated


def test_continue_on_an_unknown_session_is_no_session() -> None:
    h = make()
    with pytest.raises(NoSession):
        h.submit("a", prompt(3), session_id="ghost", continue_=True)
    assert "ghost" not in h.core.sessions


def test_expect_committed_refuses_a_stale_view_of_the_session() -> None:
    h = make()
    first = h.complete("a", prompt(30), max_tokens=4, session_id="s")
    assert first.committed_tokens == 33
    with pytest.raises(TranscriptMismatch) as err:
        h.submit("b", [1], session_id="s", continue_=True, expect_committed=34)
    assert err.value.details == {"committed": 33, "expected": 34}
    # The refusal left the session usable.
    ok = h.complete("c", [1], max_tokens=1, session_id="s", continue_=True, expect_committed=33)
    assert ok.cache_hit_kind is CacheHitKind.CONTINUATION


def test_end_session_frees_its_sequence() -> None:
    h = make(n_seq_max=1)
    h.complete("a", prompt(20), max_tokens=2, session_id="s")
    assert h.core.status().free_sequences == 0
    h.core.end_session("s")
    assert h.core.status().free_sequences == 1
    assert h.backend.tokens[0] == [] and h.core.cells_used == 0
    with pytest.raises(NoSession):
        h.core.end_session("s")


def test_reset_session_empties_transcript_and_kv_but_keeps_the_sequence() -> None:
    h = make()
    h.complete("a", prompt(20), max_tokens=2, session_id="s")
    h.core.reset_session("s")
    session = h.core.sessions.known("s")
    assert (session.transcript, session.committed, session.seq) == ([], 0, 0)
    assert h.backend.tokens[0] == []
    fresh = h.complete(
        "b", prompt(6), max_tokens=2, session_id="s", continue_=True, expect_committed=0
    )
    assert fresh.context_tokens[:6] == prompt(6)


@pytest.mark.parametrize("free_sequence", [True, False])
def test_a_fork_continues_exactly_like_its_source(free_sequence: bool) -> None:
    h = make(n_seq_max=2 if free_sequence else 1)
    h.complete("a", prompt(30), max_tokens=4, session_id="src")
    live = h.core.fork_session("src", "copy")
    assert live is free_sequence
    tail = prompt(4, start=9)
    from_copy = h.complete("b", tail, max_tokens=5, session_id="copy", continue_=True)
    from_src = h.complete("c", tail, max_tokens=5, session_id="src", continue_=True)
    assert from_copy.generated == from_src.generated
    assert from_copy.context_tokens == from_src.context_tokens


def test_a_parked_session_is_restored_when_it_comes_back() -> None:
    h = make(n_seq_max=1)
    first = h.complete("a", prompt(30), max_tokens=4, session_id="s")
    h.complete("other", prompt(12, start=3), max_tokens=2)
    assert h.core.sessions.known("s").state is SessionState.PARKED
    # The finish save already held the session's KV, so no evict save was needed.
    assert SaveReason.EVICT not in {j.reason for j in h.cache.saves}
    turn2 = first.context_tokens + prompt(5, start=40)
    back = h.complete("b", turn2, max_tokens=4, session_id="s")
    assert back.cache_hit_kind is CacheHitKind.PARTIAL
    assert back.cache_delta.read == first.committed_tokens
    assert back.generated == make().complete("ref", turn2, max_tokens=4).generated


def test_parking_an_unsaved_session_takes_a_synchronous_evict_save() -> None:
    h = make(n_seq_max=1)
    # Below min_tokens: no finish save, so the KV exists only in the sequence.
    first = h.complete("a", prompt(4), max_tokens=2, session_id="s")
    assert first.finish_key is None
    h.complete("other", prompt(6), max_tokens=1)
    evicts = [j for j in h.cache.saves if j.reason is SaveReason.EVICT]
    assert len(evicts) == 1 and evicts[0].sync and evicts[0].deadline is not None
    assert list(evicts[0].tokens) == first.context_tokens[: first.committed_tokens]
    back = h.complete("b", [7], max_tokens=2, session_id="s", continue_=True)
    assert back.cache_delta.read == first.committed_tokens


def test_a_session_refuses_another_cache_salt() -> None:
    h = make()
    h.complete("a", prompt(10), max_tokens=1, session_id="s", cache_salt="t1")
    with pytest.raises(BadRequest) as err:
        h.submit("b", prompt(10), session_id="s", cache_salt="t2")
    assert err.value.details["field"] == "cache_salt"


def test_a_live_sequence_from_another_namespace_is_not_reused() -> None:
    h = make()
    first = h.complete("a", prompt(20), max_tokens=2, session_id="s")
    # An adapter's scale changed: the model computes other KV for the same tokens.
    h.cache.rebase(Namespace(fingerprint=b"\x33" * 32, quant=2, ctx_hash=b"\x22" * 32))
    again = h.complete("b", [*first.context_tokens, 3], max_tokens=2, session_id="s")
    assert again.cache_hit_kind is CacheHitKind.COLD


def test_continue_with_no_tail_generates_from_where_the_session_stands() -> None:
    h = make()
    first = h.complete("a", prompt(20), max_tokens=3, session_id="s")
    cont = h.complete("b", [], max_tokens=3, session_id="s", continue_=True)
    assert cont.context_tokens[: len(first.context_tokens)] == first.context_tokens
    # Only the pending last reply token needed decoding.
    assert cont.stats.prefill_tokens == 1
    reference = make().complete("ref", first.context_tokens, max_tokens=3)
    assert cont.generated == reference.generated


def test_fork_into_a_taken_id_is_session_exists() -> None:
    h = make()
    h.complete("a", prompt(10), max_tokens=1, session_id="s")
    h.complete("b", prompt(10), max_tokens=1, session_id="t")
    with pytest.raises(SessionExists):
        h.core.fork_session("s", "t")
    with pytest.raises(NoSession):
        h.core.fork_session("ghost", "u")


def test_parking_saves_a_rewritten_kv_even_at_the_saved_length() -> None:
    cache = MemoryCache()
    h = make(n_seq_max=1, cache=cache)
    first = h.complete("a", prompt(30), max_tokens=4, session_id="s")  # finish row: 33 tokens
    cache.refuse_async = True  # the next finish save is dropped by a busy writer
    edited = first.context_tokens[:20] + prompt(13, start=9)
    second = h.complete("b", edited, max_tokens=1, session_id="s")
    assert second.committed_tokens == 33 and second.finish_key is None
    h.complete("other", prompt(6), max_tokens=1)
    evicts = [j for j in cache.saves if j.reason is SaveReason.EVICT]
    assert len(evicts) == 1
    assert list(evicts[0].tokens) == second.context_tokens[:33]
