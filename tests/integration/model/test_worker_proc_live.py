"""Live reuse through the real worker process (SPEC M18): requests sent back to back.

A real supervisor starts cache-meta and the worker (default model, one
thread, the default save policy: nothing under 512 tokens is ever written to
a tier). Every request here is sent the moment the previous reply ended, as
users send them: no test waits for a save. A finished request's KV stays in
its sequence as an idle entry, and the next request that shares a prefix with
it keeps those cells (in place, or shared with ``seq_cp``) instead of
restoring or prefilling them.

Reference replies are cold runs under a cache salt nobody else uses (a
namespace of its own, so no live KV or row is reused). Every tick stays under
64 rows (``prefill_chunk_size=15``, four sequences), so warm and cold runs are
compared token for token and log-probability for log-probability.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

import tolerances
from llamad.cache.counters import snapshot_of
from llamad.cache.policy import CachePolicy
from llamad.model.results import CacheHitKind, Completion
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY: dict[str, Any] = {"temperature": 0.0}


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    n_ctx=2048,
    n_batch=64,
    n_seq_max=4,
    prefill_chunk_size=15,
    policy=CachePolicy(),
    prefix="lwlv",
)


_salts = iter(range(10**6))


def reference(worker: WorkerClient, **request: Any) -> Completion:
    """The cold reply: a namespace of its own reuses nothing."""
    got = worker.complete(cache_salt=f"reference-{next(_salts)}", **request)
    assert got.cache_hit_kind is CacheHitKind.COLD
    return got


def same_reply(got: Completion, want: Completion) -> None:
    assert got.generated == want.generated
    if tolerances.exact():
        assert got.logprobs == want.logprobs


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_an_exact_repeat_sent_at_once_reuses_the_idle_entry(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    chat = [{"role": "user", "content": "Name three rivers of Europe and one fact about each."}]
    params: dict[str, Any] = {"messages": chat, "max_tokens": 12, "logprobs": 2, **GREEDY}
    cold = worker.complete(**params)
    hits = worker.status_from_loop().status.stored_logits_hits
    warm = worker.complete(**params)
    n = warm.stats.prompt_tokens
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.cache_delta.sources.live == n and warm.cache_delta.sources.computed == 0
    # No prompt token decoded: the first token came from the idle entry's logits.
    assert warm.stats.prefill_tokens == 0
    status = worker.status_from_loop().status
    assert status.stored_logits_hits == hits + 1
    assert any(e.tokens >= n and e.logits for e in status.idle_entries)
    same_reply(warm, cold)
    same_reply(warm, reference(worker, **params))


def test_a_prompt_extended_at_once_keeps_the_previous_prompt_and_reply(
    worker: WorkerClient,
) -> None:
    first = worker.complete("The old mill by the river was built", max_tokens=8, **GREEDY)
    turn2 = [*first.context_tokens, *worker.tokenize(" and later it was")]
    got = worker.complete(turn2, max_tokens=8, logprobs=1, **GREEDY)
    assert got.cache_hit_kind is CacheHitKind.PARTIAL
    assert got.cache_delta.sources.live == first.committed_tokens
    assert got.stats.prefill_tokens == len(turn2) - first.committed_tokens
    same_reply(got, reference(worker, prompt=turn2, max_tokens=8, logprobs=1, **GREEDY))


def test_a_short_stateless_chat_sent_back_to_back_reuses_its_history(
    worker: WorkerClient,
) -> None:
    """Six turns through the chat template, ~30-token user messages and replies
    of up to 40 tokens, the whole history resent each turn: from turn 2 on at
    least 95 % of the reusable tokens (all but the new message) come from the
    live KV, although no row is ever written (all far below min_tokens)."""
    topics = ["bread", "rain", "chess", "tides", "bees", "glass"]
    messages: list[dict[str, str]] = []
    previous: list[int] = []
    shares = []
    for turn, topic in enumerate(topics):
        messages.append(
            {
                "role": "user",
                "content": f"Tell me one short, surprising fact about {topic}, in a single "
                "sentence, and say why it matters to people who live in small towns.",
            }
        )
        rendered = worker.apply_chat_template(messages)
        got = worker.complete(messages=messages, max_tokens=40, **GREEDY)
        if turn:
            reusable = common_prefix(previous, rendered)
            shares.append(got.cache_delta.sources.live / reusable)
        messages.append({"role": "assistant", "content": got.reply})
        previous = list(got.context_tokens)
    assert min(shares) >= 0.95, shares
    assert worker.status_from_loop().status.live_hits >= len(topics) - 1


def test_agents_arriving_together_share_one_prefill_of_their_prefix(
    worker: WorkerClient, tree: WorkerTree
) -> None:
    prefix = worker.tokenize(
        "You are one of several agents reviewing the same report about the harbour "
        "town's water supply, its pumps, its pipes and the reservoir on the hill. "
        "Read the findings and give one recommendation. " * 3
    )
    tails = [
        worker.tokenize(f" Agent {name}: focus on {name}.") for name in ("pumps", "pipes", "cost")
    ]
    results: dict[int, Completion] = {}
    errors: list[BaseException] = []
    go = threading.Barrier(len(tails))

    def agent(i: int) -> None:
        try:
            with tree.client() as w:
                go.wait()
                results[i] = w.complete(prefix + tails[i], max_tokens=4, logprobs=1, **GREEDY)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(len(tails))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    computed = sum(r.cache_delta.sources.computed for r in results.values())
    # The prefix was prefilled once (by whichever request led), not three times.
    assert computed < len(prefix) + sum(len(t) + 1 for t in tails)
    sharers = [r for r in results.values() if r.cache_delta.sources.live >= len(prefix) - 1]
    assert len(sharers) >= len(tails) - 1
    for i, tail in enumerate(tails):
        want = reference(worker, prompt=prefix + tail, max_tokens=4, logprobs=1, **GREEDY)
        same_reply(results[i], want)


def test_prompt_tokens_are_counted_by_source(tree: WorkerTree, worker: WorkerClient) -> None:
    path = tree.settings.counters_path
    before = snapshot_of(path)
    cold = worker.complete("Counting the tokens of a short prompt", max_tokens=3, **GREEDY)
    worker.complete("Counting the tokens of a short prompt", max_tokens=3, **GREEDY)
    after = snapshot_of(path)
    n = cold.stats.prompt_tokens
    assert after["prompt_tokens_live"] - before["prompt_tokens_live"] == n
    assert after["prompt_tokens_computed"] - before["prompt_tokens_computed"] == n
    assert after["hits_live"] - before["hits_live"] == 1
