"""Idle entries left above freed cells move down (``SequenceTable.compact_idle``).

In a unified KV every decode attends over the cells up to the highest one in
use. A short request that ran beside a long one got the cells above the long
one's; once the long one's entry is released (its row saved), the short
entry stays up there and every later decode attends over the freed cells
below it. When a request starts, the idle entry holding the highest cell is
packed, cleared and unpacked into the lowest free cells while the cells in
use end ``COMPACT_GAP_CELLS`` or more above their count.

The stub backend places cells as the patched llama.cpp does (each new cell
the lowest free one above its sequence's highest, an unpacked state the
lowest free ones), so ``cell_end`` shows what a real pool would.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest

from llamad.model.core import RELEASE_KEEP_MIN_TOKENS
from llamad.model.results import CacheHitKind, Completion
from llamad.model.slots import COMPACT_GAP_CELLS
from llamad.model.stub_cache import MemoryCache
from worker_harness import SMALL_POLICY, Harness, make, prompt

pytestmark = pytest.mark.timeout(60)

POLICY = dataclasses.replace(SMALL_POLICY, min_tokens=300, cold_min_tokens=300)
"""Rows of 300 tokens or more: the long request is saved, the short ones never."""

LONG = prompt(400)
SHORT = prompt(24, start=60)
OTHER = prompt(20, start=130)


def harness(n_seq_max: int = 3, **config: Any) -> Harness:
    return make(
        n_ctx=2048, n_batch=512, n_seq_max=n_seq_max, policy=POLICY, cache=MemoryCache(), **config
    )


def short_beside_long(h: Harness, short_prompt: Sequence[int] = SHORT) -> Completion:
    """``short_prompt`` runs to its end while ``LONG`` generates beside it (so
    its cells sit above ``LONG``'s), then ``LONG`` ends and is saved."""
    h.submit("long", LONG, max_tokens=40)
    while len(h.backend.tokens[0]) <= len(LONG):  # LONG prefilled and generating
        h.step()
    short = h.complete("short", short_prompt, max_tokens=4)
    h.run()
    assert h.result("long").finish_key is not None, "the long one's row was saved"
    return short


def finish(h: Harness, rid: str, tokens: Sequence[int], **params: Any) -> Completion:
    """Run ``rid`` to its end, stepping whatever else runs beside it."""
    h.submit(rid, tokens, **params)
    while rid in h.core.requests:
        h.step()
    return h.result(rid)


def idle_tokens(h: Harness) -> dict[int, int]:
    return {e.seq: e.tokens for e in h.core.status().idle_entries}


def test_a_short_entry_left_above_a_released_one_moves_down_when_a_request_starts() -> None:
    h = harness()
    short = short_beside_long(h)
    kept = list(h.backend.tokens[1])
    assert h.backend.cell_end(1) > len(LONG), "the short entry sits above the long one"
    h.submit("other", OTHER, max_tokens=4)
    h.step()
    # The long entry was released (its row is saved) and the short one moved
    # into the cells it freed: the cells in use end where their count does.
    status = h.core.status()
    assert status.idle_released == 1
    assert status.idle_moved == 1
    assert h.backend.tokens[1] == kept, "the entry holds what it held"
    assert idle_tokens(h) == {1: len(kept)}
    assert h.backend.cell_end(-1) == h.backend.cells_used == h.core.cells_used
    h.run()
    # The moved entry is still reused live, with the same reply.
    again = h.complete("short-again", SHORT, max_tokens=4)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.live == len(SHORT)
    assert again.generated == short.generated


def test_an_entry_a_starting_request_repeats_stays_where_it_is() -> None:
    """The entry a starting request is about to reuse is not moved first: the
    move's pack and unpack would land in that request's first token (a
    back-to-back repeat of 1,024 tokens waited 4-9 ms for it), and once the
    request holds the entry it runs where it is."""
    h = harness()
    # Over RELEASE_KEEP_MIN_TOKENS: a repeat of fewer reuses too little of
    # an entry that also holds its reply for the entry to be kept in place.
    repeated = prompt(RELEASE_KEEP_MIN_TOKENS + 8, start=60)
    short = short_beside_long(h, repeated)
    assert h.backend.cell_end(1) > len(LONG), "the short entry sits above the long one"
    unpacks = h.backend.unpacks
    again = finish(h, "short-again", repeated, max_tokens=4)
    assert h.core.status().idle_released == 1, "the long entry's cells were freed below it"
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.live == len(repeated)
    assert again.generated == short.generated
    assert h.core.status().idle_moved == 0
    assert h.backend.unpacks == unpacks, "nothing was packed and unpacked"


def test_nothing_moves_while_the_gap_is_under_a_padding_unit() -> None:
    h = harness()
    h.complete("a", prompt(40, start=3), max_tokens=4)
    h.complete("b", prompt(30, start=90), max_tokens=4)
    h.submit("c", OTHER, max_tokens=4)
    h.step()
    assert h.backend.cell_end(-1) - h.backend.cells_used < COMPACT_GAP_CELLS
    assert h.core.status().idle_moved == 0
    assert h.backend.unpacks == 0


def test_an_entry_under_a_running_request_stays() -> None:
    """The highest cell is a running request's: moving an idle entry below
    it would not lower the span, so nothing moves."""
    h = harness()
    h.submit("long", LONG, max_tokens=200)
    while len(h.backend.tokens[0]) <= len(LONG):
        h.step()
    h.submit("short", SHORT, max_tokens=4)
    while "short" in h.core.requests:
        h.step()
    # LONG still runs; a third request starts beside both.
    h.submit("other", OTHER, max_tokens=4)
    h.step()
    assert "long" in h.core.requests
    assert h.core.status().idle_moved == 0
    assert h.backend.unpacks == 0
    h.run()


def test_an_entry_sharing_cells_with_another_sequence_stays() -> None:
    """Moving it would copy the shared prefix into cells of its own."""
    h = harness(release_saved_idle=False)
    h.complete("long", LONG, max_tokens=4)
    # A request over LONG's first 200 tokens and a tail shares LONG's cells
    # for the prefix: its own cells go above LONG's.
    shared = LONG[:200] + prompt(8, start=200)
    done = h.complete("shared", shared, max_tokens=4)
    assert done.cache_delta.sources.live >= 200
    assert h.core.seqs.cells_only_in(h.core.slots[1]) < len(h.backend.tokens[1])
    end = h.backend.cell_end(-1)
    h.submit("other", OTHER, max_tokens=4)
    h.step()
    assert h.core.status().idle_moved == 0
    assert h.backend.cell_end(-1) >= end


def test_a_backend_that_cannot_tell_where_cells_are_moves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = harness()
    short_beside_long(h)
    monkeypatch.setattr(h.backend, "cell_end", lambda seq: -1)
    h.submit("other", OTHER, max_tokens=4)
    h.step()
    assert h.core.status().idle_moved == 0
    assert h.backend.unpacks == 0


def test_an_entry_that_fails_to_unpack_is_dropped_and_the_request_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llamad.llama_ffi.errors import StateError  # noqa: PLC0415

    h = harness()
    short_beside_long(h)

    def refuse(seq: int, payload: memoryview) -> None:
        raise StateError("no room")

    monkeypatch.setattr(h.backend, "unpack", refuse)
    other = h.complete("other", OTHER, max_tokens=4)
    assert len(other.generated) == 4
    assert 1 not in idle_tokens(h), "the entry that could not come back is gone"
    assert h.core.status().idle_moved == 0
    assert h.core.cells_used == h.backend.cells_used


def generated(h: Harness, rid: str, tokens: Sequence[int]) -> list[int]:
    return list(h.complete(rid, tokens, max_tokens=6).generated)


def test_a_moved_entry_continues_as_it_would_have_in_place() -> None:
    """A request extending the moved entry replies as one extending it in
    place does (the stub's replies follow the tokens; the real model's
    bit-identity is tested against libllama)."""
    moved, kept = harness(), harness()
    for h in (moved, kept):
        short_beside_long(h)
    kept.core.seqs.compact_idle = lambda keep=(): None  # type: ignore[method-assign]
    tail = [*SHORT, 3, 5, 7]
    assert generated(moved, "t", tail) == generated(kept, "t", tail)
    assert moved.core.status().idle_moved == 1


def chat_beside_long(h: Harness) -> tuple[Completion, Completion, list[int]]:
    """Turn 1 of a chat, then turn 2 (its KV and more: it shares turn 1's
    cells by ``seq_cp`` and adds its own), both while ``LONG`` generates:
    their cells sit above the long one's; then ``LONG`` ends, saved."""
    h.submit("long", LONG, max_tokens=60)
    while len(h.backend.tokens[0]) <= len(LONG):
        h.step()
    first = finish(h, "turn1", SHORT, max_tokens=4)
    turn2 = [*h.backend.tokens[1], *prompt(10, start=200)]
    second = finish(h, "turn2", turn2, max_tokens=4)
    assert second.cache_delta.sources.live == len(turn2) - 10, "turn 2 shares turn 1's cells"
    h.run()
    assert h.result("long").finish_key is not None
    return first, second, turn2


def test_a_chat_turn_and_the_turn_it_extends_move_down_together_still_sharing() -> None:
    """Both entries sit above the long one. They move as one: turn 2 is
    unpacked low and turn 1 shares its prefix again, so no cell is copied
    twice."""
    h = harness(n_seq_max=4)
    first, second, turn2 = chat_beside_long(h)
    turn1_kv = list(h.backend.tokens[1])
    shared_cells = h.backend.cells_used - len(h.backend.tokens[0])
    h.submit("other", OTHER, max_tokens=4)  # on the empty sequence
    h.step()
    assert h.core.status().idle_moved == 2
    assert h.backend.tokens[1] == turn1_kv
    # Sharing kept: the two entries hold as many cells as before, all low.
    assert h.backend.cells_used == shared_cells + len(h.backend.tokens[3])
    assert h.backend.cell_end(-1) == h.backend.cells_used == h.core.cells_used
    h.run()
    for rid, tokens, done in (("again1", SHORT, first), ("again2", turn2, second)):
        again = h.complete(rid, tokens, max_tokens=4)
        assert again.cache_delta.sources.live == len(tokens)
        assert again.generated == done.generated


def test_an_entry_moves_once_the_request_that_took_its_sharers_sequence_resolved() -> None:
    """With no empty sequence the new request takes the least recently used
    idle entry's (turn 1's), whose KV stays until it resolves: turn 2 shares
    it and cannot move before; after, turn 1's KV is gone and turn 2 moves."""
    h = harness()
    _, second, turn2 = chat_beside_long(h)
    h.submit("other", OTHER, max_tokens=4)
    h.step()
    assert h.core.status().idle_moved == 1
    assert h.backend.cell_end(-1) == h.backend.cells_used == h.core.cells_used
    h.run()
    again = h.complete("again2", turn2, max_tokens=4)
    assert again.cache_delta.sources.live == len(turn2)
    assert again.generated == second.generated


def test_an_entry_a_session_shares_stays() -> None:
    h = harness()
    h.submit("long", LONG, max_tokens=60)
    while len(h.backend.tokens[0]) <= len(LONG):
        h.step()
    finish(h, "turn1", SHORT, max_tokens=4)
    turn1_kv = list(h.backend.tokens[1])
    # A session continues turn 1: it shares the entry's cells and is never moved.
    finish(h, "s", [*turn1_kv, 9, 9], max_tokens=2, session_id="s1")
    h.run()
    h.submit("other", OTHER, max_tokens=4)
    h.step()
    assert h.core.status().idle_moved == 0
