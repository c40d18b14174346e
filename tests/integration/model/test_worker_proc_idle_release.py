"""Idle entries whose rows are saved give their cells back (issue 21, ``release_saved_idle``).

A real supervisor starts cache-meta and the worker (default model, one
thread, rows from 16 tokens). In llama.cpp's unified KV every decode attends
over every used cell, so when a request starts, an idle entry whose KV is
exactly a row the cache has published (or is writing) is cleared: the cells are free for
the new request, and the next request for that prompt restores the row from
``ram``, with the reply the live entry would have given (SPEC M19).

Every tick stays under 64 rows (``prefill_chunk_size=15``), so the first
reply and the restored one are compared token for token and
log-probability for log-probability.
"""

from __future__ import annotations

from typing import Any

import pytest

import tolerances
from llamad.model.results import CacheHitKind
from llamad.model.worker_client import WorkerClient
from worker_tree import prompt_text, saved_entry

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY: dict[str, Any] = {"temperature": 0.0}

#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    n_ctx=2048, n_batch=64, n_seq_max=4, prefill_chunk_size=15, prefix="lwir"
)


def test_a_saved_entry_is_released_when_another_request_starts_and_restored_from_ram(
    worker: WorkerClient,
) -> None:
    long_prompt = prompt_text(1, words=700)
    params: dict[str, Any] = {"prompt": long_prompt, "max_tokens": 8, "logprobs": 2, **GREEDY}
    first = worker.complete(**params)
    assert first.cache_hit_kind is CacheHitKind.COLD and first.finish_key is not None
    n = first.stats.prompt_tokens
    assert n >= 600, n
    before = saved_entry(worker, first.committed_tokens)
    assert before.kv_cells_used >= first.committed_tokens

    other = worker.complete(prompt_text(2, words=20), max_tokens=4, **GREEDY)
    after = worker.status_from_loop().status
    assert after.idle_released == before.idle_released + 1
    # Only the short request's cells are left: the long entry's were freed.
    assert after.kv_cells_used == other.committed_tokens
    assert all(e.tokens != first.committed_tokens for e in after.idle_entries)

    again = worker.complete(**params)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.live == 0
    assert again.cache_delta.sources.ram >= n - 1
    assert again.generated == first.generated
    if tolerances.exact():
        assert again.logprobs == first.logprobs


def test_an_unsaved_entry_stays_live(worker: WorkerClient) -> None:
    # Below the policy's 16 tokens no row is written: the entry is the only copy.
    short = worker.complete("A brief note", max_tokens=2, **GREEDY)
    assert short.finish_key is None
    worker.complete(prompt_text(3, words=20), max_tokens=4, **GREEDY)
    status = worker.status_from_loop().status
    assert any(e.tokens == short.committed_tokens for e in status.idle_entries)
    again = worker.complete("A brief note", max_tokens=2, **GREEDY)
    assert again.cache_delta.sources.live == short.stats.prompt_tokens


def test_a_repeat_sent_at_once_after_another_request_is_never_cold(
    worker: WorkerClient,
) -> None:
    """Back to back, the way users send them: a long prompt, another request
    the moment it ends, the long prompt again the moment that one ends.
    Whether the long entry's finish save was still in flight when the other
    request released it or had landed, the repeat is a hit with the first
    reply, never a cold prefill (SPEC M18: a lookup that matches a save in
    flight waits for it)."""
    long_prompt = prompt_text(4, words=700)
    params: dict[str, Any] = {"prompt": long_prompt, "max_tokens": 8, "logprobs": 2, **GREEDY}
    first = worker.complete(**params)
    assert first.cache_hit_kind is CacheHitKind.COLD and first.finish_key is not None
    before = worker.status_from_loop().status.idle_released
    worker.complete(prompt_text(5, words=20), max_tokens=4, **GREEDY)
    assert worker.status_from_loop().status.idle_released == before + 1
    again = worker.complete(**params)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.cache_delta.sources.computed <= 1
    assert again.generated == first.generated
    if tolerances.exact():
        assert again.logprobs == first.logprobs
