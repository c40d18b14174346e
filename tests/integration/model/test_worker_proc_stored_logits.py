"""The memoised primer in the worker process (SPEC M3, P1): a real supervisor
starts cache-meta and the worker (real model, real cache), driven through
WorkerClient.

A cold request's finish row keeps the logits of its prompt's last position;
an exact repeat restores the row and samples its first token from them: its
stats show the restore and no prompt token decoded, the worker's status
counts it, and the reply (tokens and logprobs) is the cold one.

These tests are about the row, so the worker keeps no idle entries
(``live_reuse=False``): with them, the repeat would reuse the live KV and its
logits instead (tests/integration/model/test_worker_proc_live.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from llamad.cache.kvc import parse_meta
from llamad.model.results import CacheHitKind
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(n_ctx=1024, n_batch=64, n_seq_max=2, prefix="lwsl", live_reuse=False)


@pytest.mark.parametrize(
    ("i", "params"),
    [(71, {"temperature": 0.0}), (72, {"temperature": 0.8, "top_k": 40, "seed": 99})],
    ids=["greedy", "seeded"],
)
def test_an_exact_hit_samples_its_first_token_from_the_rows_logits_and_replies_as_cold(
    tree: WorkerTree, worker: WorkerClient, i: int, params: dict[str, Any]
) -> None:
    prompt = prompt_text(i, words=30)
    cold = worker.complete(prompt, max_tokens=8, logprobs=2, **params)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert cold.stats.prefill_tokens == cold.stats.prompt_tokens
    tree.wait_saved(cold.finish_key)
    assert cold.finish_key is not None
    with tree.cache() as cache:
        row = cache.lookup_exact(cold.finish_key, pin=False)
        assert row is not None
        kept = parse_meta(Path(row.location)).logits
    assert kept is not None and kept.position == cold.stats.prompt_tokens - 1
    hits = worker.status_from_loop().status.stored_logits_hits

    warm = worker.complete(prompt, max_tokens=8, logprobs=2, **params)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.cache_delta.read == warm.stats.prompt_tokens
    # Restored, then no prompt token decoded: the first token came from the
    # row's logits, and the worker counted it.
    assert warm.stats.restore_ms > 0
    assert warm.stats.prefill_tokens == 0
    assert worker.status_from_loop().status.stored_logits_hits == hits + 1
    assert warm.generated == cold.generated
    assert warm.reply == cold.reply
    assert warm.logprobs == cold.logprobs
