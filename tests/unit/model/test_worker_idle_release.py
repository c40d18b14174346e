"""Releasing idle entries whose rows are saved (issue 21, ``release_saved_idle``).

In a unified KV every decode attends over every used cell, an idle entry's
too, so when a request starts, the idle entries whose KV is exactly a row a
tier has published or is writing are cleared: the next request for that prompt restores
the row (one whose save is in flight too: its copy is packed, and a repeat
waits for it). An entry that is the only copy of its KV (never saved, or its
save failed) stays, and so does one the starting request reuses.

The in-memory cache holds asynchronous saves back (``defer_async``) until a
test publishes them and tells the core, as the writer's completions do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from llamad.cache.policy import CachePolicy
from llamad.model.cells import CellRuns
from llamad.model.planner import BatchPlan
from llamad.model.results import CacheHitKind, Completion
from llamad.model.slots import Slot
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache
from worker_harness import Harness, make, prompt

pytestmark = pytest.mark.timeout(60)


def held(h: Harness) -> dict[int, int]:
    """Tokens each idle entry holds, by sequence."""
    return {e.seq: e.tokens for e in h.core.status().idle_entries}


def published(h: Harness) -> None:
    """The writer finishes every save in flight and the core hears of it."""
    for key in h.cache.publish_pending():
        h.core.save_done(key, published=True)


def saved(h: Harness, rid: str, tokens: Sequence[int], **params: Any) -> Completion:
    """A request whose finish row is published by the time it returns."""
    done = h.complete(rid, tokens, **params)
    assert done.finish_key is not None, "its finish save was taken"
    published(h)
    return done


def deferred(**config: Any) -> Harness:
    return make(n_seq_max=2, cache=MemoryCache(defer_async=True), **config)


A = prompt(40)
B = prompt(30, start=120)


def test_an_entry_whose_row_is_published_is_released_when_another_request_starts() -> None:
    h = deferred()
    first = saved(h, "a", A, max_tokens=4)
    assert held(h) == {0: first.committed_tokens}
    assert [e.saved for e in h.core.status().idle_entries] == [True]
    h.submit("b", B, max_tokens=4)
    h.step()
    # Released before "b" placed a cell: only "b"'s own KV is in use.
    assert 0 not in held(h)
    assert h.core.status().idle_released == 1
    assert h.core.cells_used == h.backend.cells_used == len(h.backend.tokens[1])
    h.run()
    published(h)
    # "a" again is a hit from the row (not cold) with the same reply.
    again = h.complete("a2", A, max_tokens=4)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.live == 0 and h.cache.reads == 1
    assert again.generated == first.generated
    assert h.core.cells_used == h.backend.cells_used


def test_an_entry_whose_save_is_in_flight_is_released_and_its_repeat_waits_for_the_row() -> None:
    """The save in flight has its copy packed: the entry goes at the next
    start (waiting for the row to land would leave the starting request's
    cells above it), and a repeat of its prompt waits for the row and
    restores it exactly, never cold (SPEC M18)."""
    h = make(n_seq_max=3, cache=MemoryCache(defer_async=True))
    first = h.complete("a", A, max_tokens=4)
    assert h.cache.pending, "the finish save is still being written"
    assert [e.saved for e in h.core.status().idle_entries] == [True]
    h.submit("b", B, max_tokens=4)
    h.step()
    assert 0 not in held(h), "released while its save is in flight"
    assert h.core.status().idle_released == 1
    assert h.core.cells_used == h.backend.cells_used == len(h.backend.tokens[1])
    h.run()
    assert h.cache.pending, "a's row has not landed yet"
    h.submit("a2", A, max_tokens=4)
    for _ in range(3):
        h.step()
    assert "a2" in h.core.requests, "the repeat waits for the row in flight"
    published(h)
    h.run()
    again = h.result("a2")
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.live == 0 and h.cache.reads == 1
    assert again.generated == first.generated


def test_an_entry_whose_save_failed_stays() -> None:
    h = deferred()
    first = h.complete("a", A, max_tokens=4)
    assert first.finish_key is not None
    h.core.save_done(first.finish_key, published=False)
    h.complete("b", B, max_tokens=4)
    assert held(h)[0] == first.committed_tokens
    assert h.core.status().idle_released == 0


def test_an_entry_never_saved_stays() -> None:
    # The default policy writes no row under 512 tokens: live reuse is all there is.
    h = make(n_seq_max=2, policy=CachePolicy())
    first = h.complete("a", A, max_tokens=4)
    assert first.finish_key is None and h.cache.saves == []
    h.complete("b", B, max_tokens=4)
    assert held(h)[0] == first.committed_tokens
    assert h.core.status().idle_released == 0


def test_with_the_switch_off_a_saved_entry_stays() -> None:
    h = deferred(release_saved_idle=False)
    first = saved(h, "a", A, max_tokens=4)
    h.complete("b", B, max_tokens=4)
    assert held(h)[0] == first.committed_tokens
    assert h.core.status().idle_released == 0
    again = h.complete("a2", A, max_tokens=4)
    assert again.cache_delta.sources.live == len(A)


def test_the_entry_a_starting_request_continues_stays_and_is_reused_live() -> None:
    h = deferred()
    busy = saved(h, "busy", B, max_tokens=4)
    first = saved(h, "a", A, max_tokens=4)
    # "a"'s start released "busy"'s entry (saved, not reused); "a"'s own stays.
    assert set(held(h)) == {1} and h.core.status().idle_released == 1
    turn2 = first.context_tokens + prompt(8, start=77)
    second = h.complete("b", turn2, max_tokens=4)
    assert second.cache_delta.sources.live == first.committed_tokens
    assert h.cache.reads == 0
    assert busy.finish_key is not None


def test_the_entry_a_starting_request_shares_a_prefix_of_stays() -> None:
    h = make(n_seq_max=3, n_ctx=512, cache=MemoryCache(defer_async=True))
    first = saved(h, "a", A, max_tokens=4)
    # Two requests start in one tick: one shares "a"'s first 40 cells.
    h.submit("b", B, max_tokens=30)
    h.submit("c", [*A, *prompt(5, start=200)], max_tokens=4)
    h.run()
    assert h.result("c").cache_delta.sources.live == len(A)
    assert h.core.status().idle_released == 0
    assert first.committed_tokens in held(h).values()


def test_an_entry_that_shares_only_a_few_first_tokens_is_released() -> None:
    # Every chat prompt shares its template's first tokens with every entry:
    # that is no reason to keep 40 cells attended at every step.
    h = deferred()
    saved(h, "a", A, max_tokens=4)
    other = h.complete("b", [*A[:4], *B], max_tokens=4)
    assert 0 not in held(h) and h.core.status().idle_released == 1
    assert other.cache_delta.sources.live == 0


def test_an_entry_restored_from_a_row_another_worker_wrote_is_released() -> None:
    # One token each: the entry holds exactly the prompt, the row restored.
    cache = MemoryCache()
    make(n_seq_max=2, cache=cache).complete("a", A, max_tokens=1)
    h = make(n_seq_max=2, cache=cache)
    restored = h.complete("a", A, max_tokens=1)
    assert restored.cache_hit_kind is CacheHitKind.EXACT and h.cache.reads == 1
    assert h.cache.saves[-1].n_tokens == len(A), "nothing but the first row was written"
    assert [e.saved for e in h.core.status().idle_entries] == [True]
    h.complete("b", B, max_tokens=4)
    assert 0 not in held(h) and h.core.status().idle_released == 1


def test_a_sessions_kv_is_never_released() -> None:
    h = deferred()
    first = saved(h, "a", A, max_tokens=4, session_id="s")
    h.complete("b", B, max_tokens=4)
    session_seq = next(s.seq for s in h.core.slots if s.session is not None)
    assert len(h.core.slots[session_seq].kv) == first.committed_tokens
    assert h.core.status().idle_released == 0


class PlacementLog(StubBackend):
    """Records how many positions each sequence held when cells were next placed."""

    def __init__(self) -> None:
        super().__init__(n_ctx=1024, n_batch=64, n_seq_max=2)
        self.placed: list[tuple[str, dict[int, int]]] = []

    def _held(self) -> dict[int, int]:
        return {seq: len(tokens) for seq, tokens in self.tokens.items()}

    def decode(self, plan: BatchPlan) -> None:
        self.placed.append(("decode", self._held()))
        super().decode(plan)

    def unpack(self, seq: int, payload: memoryview) -> None:
        self.placed.append(("unpack", self._held()))
        super().unpack(seq, payload)


def test_the_entries_are_released_before_a_cold_prefill_places_its_cells() -> None:
    backend = PlacementLog()
    h = make(backend=backend, n_seq_max=2, cache=MemoryCache(defer_async=True))
    saved(h, "a", A, max_tokens=4)
    backend.placed.clear()
    h.complete("b", B, max_tokens=4)
    kind, before = backend.placed[0]
    assert kind == "decode" and before[0] == 0, "the entry was still there"


def test_the_entries_are_released_before_a_restore_places_its_cells() -> None:
    backend = PlacementLog()
    h = make(backend=backend, n_seq_max=2, cache=MemoryCache(defer_async=True))
    first = saved(h, "a", A, max_tokens=4)
    saved(h, "b", B, max_tokens=4)  # releases "a"'s entry: its row is in the cache
    assert set(held(h)) == {1}
    backend.placed.clear()
    again = h.complete("a2", A, max_tokens=4)
    assert again.cache_hit_kind is CacheHitKind.EXACT and again.generated == first.generated
    kind, before = backend.placed[0]
    assert kind == "unpack" and before[1] == 0, '"b"\'s entry was still there'


def test_a_saved_entry_continued_in_place_by_a_request_whose_saves_were_refused_stays() -> None:
    h = deferred()
    # Started together (nothing idle to release yet), "a" ends first: sequence
    # 1 then holds the blocker's idle entry, newer than "a"'s.
    h.submit("a", A, max_tokens=4)
    h.submit("blocker", B, max_tokens=6)
    h.run()
    first = h.result("a")
    published(h)
    h.cache.refuse_async = True  # the writer pool is saturated: no row of what follows
    turn2 = first.context_tokens + prompt(8, start=77)
    second = h.complete("b", turn2, max_tokens=4)
    # "b" took "a"'s sequence (the least recently used) and kept its KV in
    # place; its start released the blocker's saved entry.
    assert second.cache_delta.sources.live == first.committed_tokens and not h.backend.copies
    assert second.finish_key is None and h.core.status().idle_released == 1
    h.complete("c", prompt(30, start=33), max_tokens=4)
    # "b"'s KV grew past "a"'s row: it is the only copy of it.
    assert held(h)[0] == second.committed_tokens
    assert h.core.status().idle_released == 1


def test_a_saved_entry_that_grew_is_no_longer_that_row() -> None:
    slot = Slot(0, kv=[1, 2, 3], cells=CellRuns(), saved_key=b"k")
    make(n_seq_max=1).core.seqs.extend(slot, [4])
    assert slot.saved_key is None
