"""Live reuse (SPEC M18): a finished request's KV stays as an idle entry, and the
next request sharing a prefix with it keeps those cells in place or shares them.

Every test sends its requests back to back, the way users do: nothing waits
for a save. The in-memory cache holds its asynchronous saves back
(``defer_async``) wherever a test must show that the live KV, not a row, was
what the request reused.

The tests that keep an idle entry across another request's start turn
``release_saved_idle`` off (``KEEP``): their entries' finish saves count as
rows, and with it on the other request's start would clear them (that
release is tested in ``test_worker_idle_release.py``).
"""

from __future__ import annotations

import msgspec
import pytest

from llamad.cache.policy import CachePolicy
from llamad.errors import LlamadError
from llamad.model.active import Phase
from llamad.model.planner import BatchPlan
from llamad.model.results import CacheHitKind, TokenSources
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache
from worker_harness import Harness, make, prompt

pytestmark = pytest.mark.timeout(60)

KEEP = {"release_saved_idle": False}
"""Idle entries stay across other requests' starts, saved or not."""


def prompt_rows(h: Harness) -> int:
    """Rows decoded so far (prompt and generated)."""
    return sum(p.n_rows for p in h.backend.decoded)


def idle(h: Harness) -> list[tuple[int, int]]:
    return [(e.seq, e.tokens) for e in h.core.status().idle_entries]


def test_an_exact_repeat_sent_at_once_reuses_the_idle_entry_with_no_lookup() -> None:
    h = make(n_seq_max=1, cache=MemoryCache(defer_async=True))
    p = prompt(40)
    cold = h.complete("cold", p, max_tokens=6)
    assert h.cache.pending, "the finish save is still being written"
    resolves = len(h.cache.resolves)
    warm = h.complete("warm", p, max_tokens=6)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.generated == cold.generated and warm.reply == cold.reply
    # The cells stayed where they were: no lookup, no restore, no prompt row
    # decoded; the first token came from the logits the idle entry kept.
    assert len(h.cache.resolves) == resolves and h.cache.reads == 0
    assert warm.stats.prefill_tokens == 0 and h.backend.logits_sampled == 1
    assert warm.cache_delta.read == 40
    assert warm.cache_delta.sources == TokenSources(live=40)
    assert cold.cache_delta.sources == TokenSources(computed=40)
    assert h.core.status().live_hits == 1


def test_an_exact_live_repeat_replies_as_the_cold_run_on_a_batch_sensitive_backend() -> None:
    backend = StubBackend(n_ctx=1024, n_batch=64, n_seq_max=2, batch_sensitive=True)
    h = make(backend=backend)
    p = prompt(50)
    cold = h.complete("cold", p, max_tokens=10, logprobs=2)
    warm = h.complete("warm", p, max_tokens=10, logprobs=2)
    assert warm.cache_delta.sources.live == 50
    assert (warm.generated, warm.logprobs) == (cold.generated, cold.logprobs)


def test_a_continuation_sent_at_once_keeps_the_prompt_and_the_reply() -> None:
    h = make(n_seq_max=1, cache=MemoryCache(defer_async=True))
    p = prompt(30)
    first = h.complete("a", p, max_tokens=5)
    turn2 = first.context_tokens + prompt(7, start=90)
    second = h.complete("b", turn2, max_tokens=4)
    # The idle entry holds the prompt and all but the last sampled token.
    assert second.cache_hit_kind is CacheHitKind.PARTIAL
    assert second.cache_delta.sources.live == first.committed_tokens
    assert second.stats.prefill_tokens == len(turn2) - first.committed_tokens
    assert second.generated == make().complete("ref", turn2, max_tokens=4).generated
    assert h.cache.reads == 0


def test_a_short_stateless_chat_reuses_everything_but_the_new_message() -> None:
    """Six turns of ~30-token messages and replies of up to 8 tokens, far below
    min_tokens: no row is ever written, and from turn 2 on every turn reuses
    all but the new message and the previous reply's last (undecoded) token."""
    h = make(n_seq_max=1, policy=CachePolicy())
    history: list[int] = []
    for turn in range(6):
        message = prompt(30, start=11 * turn + 3)
        target = history + message
        result = h.complete(f"t{turn}", target, max_tokens=8)
        if turn:
            assert result.cache_delta.sources.live == len(history) - 1
            assert result.stats.prefill_tokens == len(message) + 1
        history = list(result.context_tokens)
    assert h.cache.saves == []


def test_a_repeat_on_another_sequence_shares_the_idle_entrys_cells() -> None:
    h = make(n_seq_max=2, cache=MemoryCache(defer_async=True), **KEEP)
    p = prompt(40)
    cold = h.complete("cold", p, max_tokens=4)
    before = prompt_rows(h)
    h.submit("busy", prompt(20, start=200), max_tokens=30)
    h.step()
    # The idle entry sits on sequence 0; "busy" took the empty sequence 1...
    h.submit("again", p + prompt(3, start=99), max_tokens=4)
    h.run()
    again = h.result("again")
    # ... so "again" took sequence 0 in place once it was the only free one.
    assert again.cache_delta.sources.live == 40
    assert h.core.cells_used == h.backend.cells_used
    assert prompt_rows(h) - before < 20 + 30 + 3 + 4 + 4
    assert cold.cache_hit_kind is CacheHitKind.COLD


def test_a_request_sharing_a_running_sequences_prefix_copies_its_cells() -> None:
    h = make(n_seq_max=3, n_ctx=256)
    shared = prompt(60)
    h.complete("seed", shared, max_tokens=2)
    h.submit("a", shared + prompt(5, start=150), max_tokens=40)
    h.submit("b", shared + prompt(6, start=160), max_tokens=40)
    h.run()
    a, b = h.result("a"), h.result("b")
    # One kept the idle entry in place, the other shared its first 60 cells.
    assert sorted([a.cache_delta.sources.live, b.cache_delta.sources.live]) == [60, 60]
    assert any(n == 60 for _, _, n in h.backend.copies)
    assert h.core.cells_used == h.backend.cells_used
    ref = make(n_seq_max=1)
    assert a.generated == ref.complete("ra", shared + prompt(5, start=150), max_tokens=40).generated
    assert b.generated == ref.complete("rb", shared + prompt(6, start=160), max_tokens=40).generated


def test_agents_arriving_together_prefill_their_shared_prefix_once() -> None:
    h = make(n_seq_max=4, n_ctx=1024, n_batch=64, chunk=16)
    prefix = prompt(200)
    tails = [prompt(8, start=100 + 10 * i) for i in range(4)]
    for i, tail in enumerate(tails):
        h.submit(f"agent{i}", prefix + tail, max_tokens=2)
    h.step()
    # Agents 1-3 wait for agent 0 to prefill the prefix they share.
    assert [h.core.requests[f"agent{i}"].phase for i in range(1, 4)] == [Phase.WAITING] * 3
    h.run()
    results = [h.result(f"agent{i}") for i in range(4)]
    assert results[0].cache_delta.sources == TokenSources(computed=208)
    for r in results[1:]:
        assert r.cache_delta.sources == TokenSources(live=200, computed=8)
    prefill_rows = sum(r.stats.prefill_tokens for r in results)
    assert prefill_rows == 200 + 4 * 8
    for i, tail in enumerate(tails):
        solo = make(n_seq_max=1).complete("solo", prefix + tail, max_tokens=2)
        assert results[i].generated == solo.generated
    assert h.core.cells_used == h.backend.cells_used


def test_a_follower_stops_waiting_when_its_leader_is_cancelled() -> None:
    h = make(n_seq_max=2, n_ctx=1024, n_batch=64, chunk=16)
    prefix = prompt(200)
    h.submit("leader", prefix + prompt(4, start=40), max_tokens=2)
    h.submit("follower", prefix + prompt(4, start=80), max_tokens=2)
    h.step()
    assert h.core.requests["follower"].phase is Phase.WAITING
    h.core.cancel("leader")
    h.run()
    follower = h.result("follower")
    # It shares what the leader had computed (whole chunks) and prefills the rest.
    assert 0 < follower.cache_delta.sources.live < 200
    assert (
        follower.generated
        == make().complete("ref", prefix + prompt(4, start=80), max_tokens=2).generated
    )


def test_status_shows_idle_entries_with_their_tokens_age_and_cells() -> None:
    h = make(n_seq_max=2, **KEEP)
    first = h.complete("a", prompt(20), max_tokens=3)
    h.clock.advance(2.0)
    h.complete("b", prompt(12, start=77), max_tokens=2)
    entries = h.core.status().idle_entries
    assert [(e.seq, e.tokens) for e in entries] == [(0, first.committed_tokens), (1, 13)]
    assert entries[0].age_s > entries[1].age_s >= 0
    assert entries[0].cells == first.committed_tokens and entries[0].logits
    assert h.core.status().free_sequences == 2


def test_a_new_request_takes_an_empty_sequence_before_an_idle_entrys() -> None:
    h = make(n_seq_max=2, **KEEP)
    h.complete("a", prompt(20), max_tokens=2)
    h.complete("b", prompt(20, start=50), max_tokens=2)
    # "b" took the empty sequence 1 and kept "a"'s entry; a third unrelated
    # request takes the least recently used entry ("a"'s) and drops it.
    assert [seq for seq, _ in idle(h)] == [0, 1]
    h.complete("c", prompt(20, start=120), max_tokens=2)
    assert [seq for seq, _ in idle(h)] == [1, 0]
    assert h.core.cells_used == h.backend.cells_used == 21 + 21


def test_idle_entries_give_their_cells_up_first_when_cells_run_out() -> None:
    h = make(n_ctx=64, n_batch=32, n_seq_max=2, chunk=16)
    h.complete("a", prompt(30), max_tokens=2)
    big = h.complete("b", prompt(40, start=90), max_tokens=10)
    # "b" needed more cells than were free: "a"'s idle entry went first.
    assert big.finish_reason.value == "length" or len(big.generated) == 10
    assert [seq for seq, _ in idle(h)] == [1]
    assert h.core.cells_used == h.backend.cells_used


def test_an_idle_entry_of_another_namespace_is_never_reused() -> None:
    h = make(n_seq_max=1)
    p = prompt(30)
    h.complete("t1", p, max_tokens=3, cache_salt="tenant-1")
    other = h.complete("t2", p, max_tokens=3, cache_salt="tenant-2")
    assert other.cache_hit_kind is CacheHitKind.COLD
    assert other.cache_delta.sources == TokenSources(computed=30)
    same = h.complete("t2b", p, max_tokens=3, cache_salt="tenant-2")
    assert same.cache_delta.sources.live == 30


def test_a_failed_request_leaves_no_idle_entry() -> None:
    class FailingStub(StubBackend):
        fail = False

        def decode(self, plan: BatchPlan) -> None:
            if self.fail:
                raise LlamadError("decode failed")
            super().decode(plan)

    backend = FailingStub(n_ctx=1024, n_batch=64, n_seq_max=1)
    h = make(backend=backend, n_seq_max=1)
    h.complete("a", prompt(20), max_tokens=2)
    backend.fail = True
    h.submit("b", prompt(20) + prompt(5, start=9), max_tokens=2)
    h.run()
    assert h.error("b").code == "internal"
    assert idle(h) == [] and h.core.cells_used == h.backend.cells_used == 0


def test_a_parent_save_in_flight_is_not_waited_for_when_the_live_kv_holds_it() -> None:
    h = make(n_seq_max=1, cache=MemoryCache(defer_async=True))
    first = h.complete("a", prompt(40), max_tokens=3)
    assert first.finish_key is not None and h.cache.pending
    turn2 = first.context_tokens + prompt(8, start=77)
    h.submit("b", turn2, max_tokens=3, parent_key=first.finish_key)
    assert h.step().batch, "resolved and prefilling at once"
    h.run()
    assert h.result("b").cache_delta.sources.live == first.committed_tokens


def test_with_live_reuse_off_a_sequence_is_cleared_when_its_request_ends() -> None:
    h = make(n_seq_max=1, live_reuse=False)
    h.complete("a", prompt(20), max_tokens=2)
    assert idle(h) == [] and h.core.cells_used == h.backend.cells_used == 0


def test_a_snapshot_lists_at_most_64_idle_entries_and_counts_them_all() -> None:
    h = make(n_seq_max=70, n_batch=128, n_ctx=4096)
    for i in range(70):
        h.complete(f"r{i}", prompt(3, start=3 * i + 1), max_tokens=1)
    status = h.core.status()
    assert status.idle_count == 70 and len(status.idle_entries) == 64
    assert len(msgspec.msgpack.encode(status)) < 4096


def test_a_request_cancelled_before_it_resolves_leaves_the_idle_entry_it_took() -> None:
    h = make(n_seq_max=2, n_ctx=1024, n_batch=64, chunk=16)
    old = h.complete("old", prompt(20, start=200), max_tokens=2)
    prefix = prompt(200)
    h.submit("leader", prefix + prompt(4, start=40), max_tokens=2)
    h.submit("follower", prefix + prompt(4, start=80), max_tokens=2)
    h.step()
    # The follower took the sequence holding "old"'s entry and waits.
    assert h.core.requests["follower"].phase is Phase.WAITING
    follower_seq = h.core.requests["follower"].seq
    h.core.cancel("follower")
    h.run()
    assert (follower_seq, old.committed_tokens) in idle(h)
    kept = old.context_tokens[: old.committed_tokens]
    again = h.complete("again", [*kept, 5], max_tokens=2)
    assert again.cache_delta.sources.live == old.committed_tokens


def test_an_exact_repeat_packs_no_second_copy_of_the_row_its_kv_already_has() -> None:
    """The repeat of a one-token request ends holding exactly the KV whose row
    the first one saved (still in flight here): nothing is packed again, and
    the repeat reports that row as its finish key."""
    h = make(n_seq_max=1, cache=MemoryCache(defer_async=True))
    p = prompt(40)
    first = h.complete("a", p, max_tokens=1)
    packs = h.backend.packs
    again = h.complete("b", p, max_tokens=1)
    assert again.cache_delta.sources.live == 40
    assert h.backend.packs == packs
    assert again.finish_key == first.finish_key is not None
    # Once its write failed, the row is packed and saved again.
    for key in h.cache.publish_pending():
        h.core.save_done(key, published=False)
    h.complete("c", p, max_tokens=1)
    assert h.backend.packs == packs + 1


def test_a_row_found_damaged_is_saved_again_though_it_was_just_written() -> None:
    h = make(n_seq_max=1, live_reuse=False)
    p = prompt(40)
    first = h.complete("a", p, max_tokens=1)
    assert first.finish_key in h.cache.rows
    h.cache.corrupt.add(first.finish_key)
    packs = h.backend.packs
    again = h.complete("b", p, max_tokens=1)
    assert again.cache_hit_kind is CacheHitKind.COLD  # the damaged row was not served
    assert h.backend.packs > packs  # and its KV was saved again
    h.cache.corrupt.clear()
    assert first.finish_key in h.cache.rows


def test_a_row_written_long_ago_is_saved_again() -> None:
    h = make(n_seq_max=1, cache=MemoryCache(defer_async=True))
    p = prompt(40)
    h.complete("a", p, max_tokens=1)
    for key in h.cache.publish_pending():
        h.core.save_done(key, published=True)
    packs = h.backend.packs
    h.complete("b", p, max_tokens=1)
    assert h.backend.packs == packs  # just written: not packed again
    h.clock.advance(120)  # it may have been evicted since
    h.complete("c", p, max_tokens=1)
    assert h.backend.packs == packs + 1


def test_the_idle_entries_are_reported_to_the_cache_when_they_change() -> None:
    # cache-meta publishes them as KV events (medium "live", issue 20).
    cache = MemoryCache()
    h = make(n_seq_max=2, cache=cache, **KEEP)
    p = prompt(40)
    done = h.complete("a", p, max_tokens=4)
    assert cache.live_reports, "the idle entry was never reported"
    last = cache.live_reports[-1]
    assert [(seq, kv) for seq, _, kv in last] == [
        (e.seq, done.context_tokens[: e.tokens]) for e in h.core.status().idle_entries
    ]
    assert last[0][1] == cache.namespace(None)
    # Ticks that change nothing send nothing.
    sent = len(cache.live_reports)
    for _ in range(3):
        h.core.step()
    assert len(cache.live_reports) == sent
    # A second request leaves a second idle entry: the next report names both.
    h.complete("b", prompt(40, start=500), max_tokens=2)
    assert len(cache.live_reports) > sent
    assert sorted(seq for seq, _, _ in cache.live_reports[-1]) == [0, 1]
