"""Idle entries left above freed cells move down (``SequenceTable.compact_idle``).

A real supervisor starts cache-meta and the worker (default model, one
thread, rows from 16 tokens). A short request runs while a long one
generates, so llama.cpp gives its cells above the long one's; it is too
short to be saved, and stays live as an idle entry. The long one's row is
saved, so when the next request starts its entry is released
(``release_saved_idle``), and without more the short entry would keep every
later decode attending over the ~700 freed cells below it. It is moved
down instead: the cells in use end where their count does, and the moved
entry replies as it did (SPEC M19: its KV's values and their order are
unchanged).

The tests wait for the long entry's row before the next request (a stated
choice): whether a save still in flight or one published releases the
entry is the release's business (test_worker_proc_idle_release.py); here
the release must happen, so that the move is what is tested.

Every tick stays under 64 rows (``prefill_chunk_size=15``): replies are
compared token for token and log-probability for log-probability.
"""

from __future__ import annotations

from typing import Any

import pytest

import tolerances
from llamad.model.results import CacheHitKind, TokenEvent, WorkerStatus
from llamad.model.slots import COMPACT_GAP_CELLS
from llamad.model.worker_client import WorkerClient
from worker_tree import prompt_text, saved_entry

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY: dict[str, Any] = {"temperature": 0.0}

#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    n_ctx=2048, n_batch=64, n_seq_max=4, prefill_chunk_size=15, prefix="lwic"
)

SHORT: dict[str, Any] = {"prompt": "A brief note", "max_tokens": 3, "logprobs": 2, **GREEDY}
"""Under the tree's 16-token rows: never saved, its live KV is its only copy."""


def status(worker: WorkerClient) -> WorkerStatus:
    return worker.status_from_loop().status


def test_a_short_entry_left_above_a_released_one_moves_down_and_replies_the_same(
    worker: WorkerClient,
) -> None:
    with worker.infer(prompt=prompt_text(1, words=700), max_tokens=40, **GREEDY) as stream:
        events = iter(stream)
        # The long prompt is prefilled and generating: its cells are placed.
        next(e for e in events if isinstance(e, TokenEvent))
        short = worker.complete(**SHORT)
        for _ in events:
            pass
        long = stream.result
    assert long is not None and long.finish_key is not None
    assert short.finish_key is None, "the short one is never saved"

    before = saved_entry(worker, long.committed_tokens)
    assert before.kv_cells_end >= long.committed_tokens + short.committed_tokens

    other = worker.complete(prompt_text(2, words=20), max_tokens=4, **GREEDY)
    after = status(worker)
    assert after.idle_released == before.idle_released + 1
    assert after.idle_moved == before.idle_moved + 1
    # The short entry is still there, and the cells in use end where their
    # count does: the long entry's ~700 freed cells are no longer attended over.
    assert any(e.tokens == short.committed_tokens for e in after.idle_entries)
    assert after.kv_cells_used == short.committed_tokens + other.committed_tokens
    assert after.kv_cells_end - after.kv_cells_used < COMPACT_GAP_CELLS

    again = worker.complete(**SHORT)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.live == short.stats.prompt_tokens
    assert again.generated == short.generated
    if tolerances.exact():
        assert again.logprobs == short.logprobs


def test_a_chat_turn_and_the_turn_it_extends_move_down_together(worker: WorkerClient) -> None:
    """Turn 2 shares turn 1's cells (``seq_cp``) and adds its own, both while
    a long prompt generates: the two move as one, still sharing, and each
    replies as it did."""
    turn1 = [504, 2837, 1217, 284, 260]
    with worker.infer(prompt=prompt_text(3, words=700), max_tokens=40, **GREEDY) as stream:
        events = iter(stream)
        next(e for e in events if isinstance(e, TokenEvent))
        first = worker.complete(turn1, max_tokens=3, logprobs=2, **GREEDY)
        kv = [*turn1, *first.generated][: first.committed_tokens]
        turn2 = [*kv, 1978, 314, 2343]
        second = worker.complete(turn2, max_tokens=3, logprobs=2, **GREEDY)
        for _ in events:
            pass
        long = stream.result
    assert long is not None and long.finish_key is not None
    assert first.finish_key is None and second.finish_key is None, "neither is saved"
    assert second.cache_delta.sources.live == len(kv), "turn 2 shares turn 1's cells"

    before = saved_entry(worker, long.committed_tokens)

    worker.complete(prompt_text(4, words=20), max_tokens=4, **GREEDY)
    after = status(worker)
    assert after.idle_moved == before.idle_moved + 2
    assert after.kv_cells_end - after.kv_cells_used < COMPACT_GAP_CELLS

    for tokens, done in ((turn1, first), (turn2, second)):
        again = worker.complete(tokens, max_tokens=3, logprobs=2, **GREEDY)
        # From either entry: one that keeps no logits at the prompt's last
        # position (turn 2's, for turn 1's prompt) has that token decoded again.
        assert again.cache_delta.sources.live >= len(tokens) - 1
        assert again.generated == done.generated
        if tolerances.exact():
            assert again.logprobs == done.logprobs


def test_an_entry_a_request_repeats_stays_where_it_is(worker: WorkerClient) -> None:
    """A back-to-back repeat reuses its entry where it sits: moving it first
    (a pack and an unpack) would land in the repeat's first token."""
    mid: dict[str, Any] = {
        "prompt": prompt_text(5, words=40),
        "max_tokens": 3,
        "logprobs": 2,
        **GREEDY,
    }
    with worker.infer(prompt=prompt_text(6, words=700), max_tokens=40, **GREEDY) as stream:
        events = iter(stream)
        next(e for e in events if isinstance(e, TokenEvent))
        done = worker.complete(**mid)
        for _ in events:
            pass
        long = stream.result
    assert long is not None and long.finish_key is not None
    assert done.stats.prompt_tokens > 32, "over RELEASE_KEEP_MIN_TOKENS: the repeat keeps it"

    before = saved_entry(worker, long.committed_tokens)
    assert before.kv_cells_end >= long.committed_tokens + done.committed_tokens, "it sits above"

    again = worker.complete(**mid)
    after = status(worker)
    assert after.idle_released == before.idle_released + 1, "the long entry's cells were freed"
    assert after.idle_moved == before.idle_moved
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.live == done.stats.prompt_tokens
    assert again.generated == done.generated
    if tolerances.exact():
        assert again.logprobs == done.logprobs
