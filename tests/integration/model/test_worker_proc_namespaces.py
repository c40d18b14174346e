"""Who may share cache rows, and seeded sampling, across real worker processes (SPEC C1, M6, M17).

One supervisor runs cache-meta and two workers of the same model file that
differ only in their context size: ``smol`` (n_ctx 1024) and ``smol-wide``
(n_ctx 2048). Rows are shared only within one namespace: a row computed under
another context size, or for another tenant's ``cache_salt``, is never
restored, while a repeat in the same namespace is an exact hit. Each test's
prompts begin with words no other test's do, so "no nearest row" holds in any
order.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

from llamad.model.results import CacheHitKind
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY: dict[str, Any] = {"temperature": 0.0}
NARROW = "smol"
WIDE = "smol-wide"


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    model_id=NARROW,
    n_ctx=1024,
    n_batch=64,
    n_seq_max=2,
    prefix="lmn",
    siblings={WIDE: {"n_ctx": 2048}},
)


@pytest.fixture
def narrow(tree: WorkerTree) -> Iterator[WorkerClient]:
    w = tree.client(NARROW)
    yield w
    tree.wait_idle(model_id=NARROW)


@pytest.fixture
def wide(tree: WorkerTree) -> Iterator[WorkerClient]:
    w = tree.client(WIDE)
    yield w
    tree.wait_idle(model_id=WIDE)


def test_salts_and_no_salt_never_share_rows(tree: WorkerTree, narrow: WorkerClient) -> None:
    prompt = "Harbour ledger. " + prompt_text(80, words=30)
    runs: dict[str | None, list[Any]] = {}
    for salt in ("tenant-a", "tenant-b", None):
        got = narrow.complete(prompt, cache_salt=salt, max_tokens=4, **GREEDY)
        tree.wait_saved(got.finish_key)
        runs[salt] = [got]
    # Each was cold, although the same prompt was saved just before under
    # another salt (or none): nothing of another namespace is even "nearest".
    for salt, (first,) in runs.items():
        assert first.cache_hit_kind is CacheHitKind.COLD, salt
        assert first.cache_miss is not None and first.cache_miss.nearest_key is None, salt
    assert len({first.finish_key for (first,) in runs.values()}) == 3
    # The same salt again (and no salt again) finds its own row.
    for salt in ("tenant-a", "tenant-b", None):
        again = narrow.complete(prompt, cache_salt=salt, max_tokens=4, **GREEDY)
        assert again.cache_hit_kind is CacheHitKind.EXACT, salt
        assert again.stats.prefill_tokens <= 1
        runs[salt].append(again)
    # The salt splits the cache, never the computation.
    assert len({tuple(r.generated) for rs in runs.values() for r in rs}) == 1


def test_workers_with_other_context_sizes_never_share_rows(
    tree: WorkerTree, narrow: WorkerClient, wide: WorkerClient
) -> None:
    prompt = "Mountain diary. " + prompt_text(81, words=30)
    first = narrow.complete(prompt, max_tokens=4, **GREEDY)
    assert first.cache_hit_kind is CacheHitKind.COLD
    tree.wait_saved(first.finish_key)

    other = wide.complete(prompt, max_tokens=4, **GREEDY)
    assert other.cache_hit_kind is CacheHitKind.COLD
    assert other.cache_miss is not None and other.cache_miss.nearest_key is None
    assert other.finish_key != first.finish_key
    tree.wait_saved(other.finish_key)
    # Each worker still hits its own rows in the one shared cache.
    assert wide.complete(prompt, max_tokens=4, **GREEDY).cache_hit_kind is CacheHitKind.EXACT
    assert narrow.complete(prompt, max_tokens=4, **GREEDY).cache_hit_kind is CacheHitKind.EXACT


def test_seeded_sampling_is_reproducible_across_two_worker_processes(
    tree: WorkerTree, narrow: WorkerClient, wide: WorkerClient
) -> None:
    assert tree.pid(tree.specs[NARROW].actor_name) != tree.pid(tree.specs[WIDE].actor_name)
    chat = [{"role": "user", "content": "Write a list of twenty random unrelated words."}]
    # Temperature 1 with every truncation off: the draw is from the model's own
    # distribution, which is what the logprobs report.
    params: dict[str, Any] = {
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "min_p": 0.0,
        "max_tokens": 24,
        "logprobs": 0,
    }
    here = narrow.complete(messages=chat, seed=1234, **params)
    there = wide.complete(messages=chat, seed=1234, **params)
    # Both computed cold (their namespaces differ), each in its own process.
    assert here.cache_hit_kind is CacheHitKind.COLD
    assert there.cache_hit_kind is CacheHitKind.COLD
    assert there.generated == here.generated
    assert there.reply == here.reply

    # Another seed draws the same reply only with the probability of that
    # reply, which this prompt makes negligible.
    assert here.logprobs is not None
    log_p = math.fsum(lp.logprob for lp in here.logprobs)
    assert log_p < math.log(1e-6), log_p
    reseeded = narrow.complete(messages=chat, seed=4321, **params)
    assert reseeded.generated != here.generated
