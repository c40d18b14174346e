"""The memoised primer (SPEC M3): a row keeps its prompt's last logits, and an
exact repeat samples its first token from them instead of decoding again.

A run that decodes its target's last token alone (the cold path always does,
to give the first token its logits) keeps that row's logits when its finish
save may be taken, and hands them with its saves that reach that position.
An exact hit on a row keeping the logits of exactly the target's last
position keeps the whole target and samples from them: no prompt row is
decoded before the first token, whose reply is the cold one by construction.
Any other row primes as before.

These tests are about rows, so the idle entries a request leaves (SPEC M18)
are off here (``live_reuse=False``): with them, a repeat reuses the live KV
and its logits, which tests/unit/model/test_worker_live.py covers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from llamad.cache.kvc import SaveReason
from llamad.model.active import Phase
from llamad.model.planner import BatchPlan, Span
from llamad.model.results import CacheHitKind, TokenEvent
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache
from worker_harness import Harness, prompt
from worker_harness import make as make_core

pytestmark = pytest.mark.timeout(60)


def make(**kw: Any) -> Harness:
    return make_core(live_reuse=False, **kw)


def logits_after(tokens: list[int]) -> bytes:
    """What the stub computes for the last of ``tokens``, decoded alone after the rest."""
    stub = StubBackend(n_ctx=1024, n_batch=1024, n_seq_max=1)
    stub.decode(BatchPlan((Span(0, 0, tuple(tokens[:-1]), False),)))
    stub.decode(BatchPlan((Span(0, len(tokens) - 1, (tokens[-1],), True),)))
    return stub.row_logits(0)


def finish_jobs(cache: MemoryCache) -> list[tuple[int, int | None]]:
    """(tokens, logits position) of every finish save, in order."""
    return [
        (j.n_tokens, None if j.logits is None else j.logits.position)
        for j in cache.saves
        if j.reason is SaveReason.FINISH
    ]


def test_a_cold_finish_save_keeps_the_logits_its_prompts_last_token_was_sampled_from() -> None:
    h = make()
    p = prompt(20)
    cold = h.complete("cold", p, max_tokens=4)
    finish = [j for j in h.cache.saves if j.reason is SaveReason.FINISH]
    assert len(finish) == 1 and finish[0].logits is not None
    assert finish[0].n_tokens == len(p) + 3  # the reply less its undecoded last token
    assert finish[0].logits.position == len(p) - 1
    assert finish[0].logits.values == logits_after(p)
    # The cold save stops before the prompt's end: nothing of the logits to keep.
    cold_saves = [j for j in h.cache.saves if j.reason is SaveReason.COLD]
    assert cold_saves and all(j.logits is None for j in cold_saves)
    assert cold.finish_key == finish[0].key


def test_an_exact_hit_on_a_row_with_the_prompts_logits_decodes_no_prompt_row() -> None:
    h = make()
    p = prompt(20)
    cold = h.complete("cold", p, max_tokens=6)
    decoded = len(h.backend.decoded)
    h.submit("warm", p, max_tokens=6)
    report = h.step()
    # Restored whole and sampled from the row's logits, in the resolving tick,
    # which decodes nothing: the first token goes out before any decode.
    assert not report.batch and len(h.backend.decoded) == decoded
    firsts = [e for rid, e in report.events if rid == "warm" and isinstance(e, TokenEvent)]
    assert [e.token for e in firsts] == cold.generated[:1]
    assert h.backend.logits_sampled == 1
    # The next tick decodes that token like any generated one, at the prompt's end.
    h.step()
    assert h.backend.decoded[decoded].spans == (Span(0, len(p), (cold.generated[0],), True),)
    h.run()
    warm = h.result("warm")
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert (warm.generated, warm.reply) == (cold.generated, cold.reply)
    assert warm.stats.prefill_tokens == 0 and warm.cache_delta.read == len(p)
    assert warm.stats.prefill_ms == 0.0  # no decode between the restore and the first token


def test_a_row_with_logits_of_another_position_primes_as_before() -> None:
    # A longer prompt's finish row covers `short` whole, but its logits are
    # those after the longer prompt: the shared prefix's are not in it.
    h = make(policy=replace(make().core.config.policy, cold_min_tokens=10_000))
    short = prompt(30)
    longer = short + prompt(10, start=77)
    h.complete("long", longer, max_tokens=4)
    assert finish_jobs(h.cache) == [(len(longer) + 3, len(longer) - 1)]
    got = h.complete("short", short, max_tokens=5)
    assert h.cache.resolves[-1].answer.row is not None
    assert h.cache.resolves[-1].answer.row.n_tokens == len(longer) + 3  # that row was restored
    assert got.cache_hit_kind is CacheHitKind.EXACT
    assert got.stats.prefill_tokens == 1  # the held-back last token, decoded again
    assert h.backend.logits_sampled == 0
    assert got.generated == make().complete("ref", short, max_tokens=5).generated
    # Its own finish save keeps the logits it computed for its own prompt.
    assert finish_jobs(h.cache)[-1] == (len(short) + 4, len(short) - 1)


@pytest.mark.parametrize("logprobs", [None, 3])
def test_seeded_sampling_from_stored_logits_replies_as_the_cold_run(logprobs: int | None) -> None:
    h = make()
    p = prompt(25)
    params = {"temperature": 0.9, "top_k": 5, "seed": 11, "logprobs": logprobs}
    cold = h.complete("cold", p, max_tokens=8, **params)
    warm = h.complete("warm", p, max_tokens=8, **params)
    assert warm.cache_hit_kind is CacheHitKind.EXACT and warm.stats.prefill_tokens == 0
    assert h.backend.logits_sampled == 1
    assert warm.generated == cold.generated
    assert warm.logprobs == cold.logprobs
    if logprobs is not None:
        assert warm.logprobs is not None and len(warm.logprobs[0].top) == logprobs


def test_a_first_token_that_ends_the_request_finishes_without_any_decode() -> None:
    h = make()
    p = prompt(20)
    cold = h.complete("cold", p, max_tokens=1)
    # max_tokens=1: the finish row is the prompt itself, with its last logits.
    assert finish_jobs(h.cache) == [(len(p), len(p) - 1)]
    decoded, saves = len(h.backend.decoded), len(h.cache.saves)
    warm = h.complete("warm", p, max_tokens=1)
    assert warm.generated == cold.generated and warm.stats.prefill_tokens == 0
    assert len(h.backend.decoded) == decoded  # nothing at all was decoded
    # The restored row is the finish row: reported, not written again.
    assert warm.finish_key == cold.finish_key and len(h.cache.saves) == saves


def test_a_warm_requests_finish_save_keeps_the_stored_logits_for_the_next_repeat() -> None:
    h = make()
    p = prompt(20)
    h.complete("cold", p, max_tokens=2)
    stored = h.cache.saves[-1].logits
    warm = h.complete("warm", p, max_tokens=9)
    assert warm.stats.prefill_tokens == 0
    last = h.cache.saves[-1]
    assert (last.reason, last.n_tokens) == (SaveReason.FINISH, len(p) + 8)
    assert last.logits == stored


def test_a_request_keeps_its_prompts_logits_only_while_a_finish_save_may_take_them() -> None:
    h = make()
    # 3 prompt tokens and at most 2 more committed: under min_tokens (8), never saved.
    h.submit("short", prompt(3), max_tokens=3)
    req = h.core.requests["short"]
    while not req.generating:
        h.step()
    assert req.phase is Phase.RUNNING and (req.keep_logits, req.prompt_logits) == (False, None)
    h.run()
    assert h.cache.saves == []
    h.submit("long", prompt(12), max_tokens=3)
    req = h.core.requests["long"]
    while not req.generating:
        h.step()
    assert req.keep_logits and req.prompt_logits is not None
    h.run()
    assert req.prompt_logits is None  # released once the finish save took them
    assert finish_jobs(h.cache) == [(12 + 2, 11)]


def test_prefill_only_decodes_its_last_token_alone_and_keeps_its_logits() -> None:
    h = make()
    p = prompt(20)
    warmed = h.complete("warm", p, prefill_only=True)
    assert warmed.generated == [] and warmed.committed_tokens == len(p)
    spans = [s for plan in h.backend.decoded for s in plan.spans]
    assert spans[-1] == Span(0, len(p) - 1, (p[-1],), True)
    assert finish_jobs(h.cache) == [(len(p), len(p) - 1)]
    hit = h.complete("hit", p, max_tokens=5)
    assert hit.cache_hit_kind is CacheHitKind.EXACT and hit.stats.prefill_tokens == 0
    assert hit.generated == make().complete("ref", p, max_tokens=5).generated


def test_a_parent_key_turn_primes_as_before() -> None:
    # The parent row keeps the logits after turn 1's prompt, not after turn 2's.
    h = make()
    first = h.complete("t1", prompt(20), max_tokens=4)
    turn2 = first.context_tokens + prompt(6, start=40)
    second = h.complete("t2", turn2, max_tokens=4, parent_key=first.finish_key)
    assert second.cache_hit_kind is CacheHitKind.PARTIAL
    assert second.cache_delta.read == first.committed_tokens
    assert second.stats.prefill_tokens == len(turn2) - first.committed_tokens
    assert h.backend.logits_sampled == 0
    assert second.generated == make().complete("ref", turn2, max_tokens=4).generated


def test_a_sticky_session_keeps_its_live_kv_and_a_new_session_may_use_stored_logits() -> None:
    h = make()
    p = prompt(24)
    cold = h.complete("cold", p, max_tokens=4)
    # A new session resolves like any fresh request: an exact hit on the row.
    fresh = h.complete("s1", p, max_tokens=4, session_id="s")
    assert fresh.cache_hit_kind is CacheHitKind.EXACT and fresh.stats.prefill_tokens == 0
    assert fresh.generated == cold.generated
    # Its next turn runs on the live sequence, today's sticky path: the live
    # prefix wins, the last token is decoded again.
    turn2 = fresh.context_tokens + prompt(5, start=9)
    sticky = h.complete("s2", turn2, max_tokens=4, session_id="s")
    assert sticky.cache_hit_kind is CacheHitKind.STICKY
    assert sticky.stats.prefill_tokens == 1 + 5
    assert h.backend.logits_sampled == 1
    assert sticky.generated == make().complete("ref", turn2, max_tokens=4).generated


def test_a_first_token_from_stored_logits_goes_out_before_other_sequences_decode() -> None:
    h = make()
    p = prompt(20)
    h.complete("cold", p, max_tokens=3)
    h.submit("busy", prompt(10, start=5), max_tokens=30)
    while not h.core.requests["busy"].generating:
        h.step()
    h.submit("warm", p, max_tokens=3)
    report = h.step()
    assert not report.batch
    assert {rid for rid, _ in report.events} == {"warm"}
    report = h.step()  # both decode now, in one batch
    assert sorted(s.seq for s in report.batch.spans) == [0, 1]
    h.run()
    assert h.result("busy").finish_reason.value == "length"


def test_a_row_whose_logits_are_the_wrong_size_primes() -> None:
    h = make()
    p = prompt(20)
    cold = h.complete("cold", p, max_tokens=4)
    row = h.cache.rows[cold.finish_key]
    assert row.job.logits is not None
    short = replace(row.job.logits, values=row.job.logits.values[:-4])
    row.job = replace(row.job, logits=short)
    warm = h.complete("warm", p, max_tokens=4)
    assert warm.cache_hit_kind is CacheHitKind.EXACT and warm.stats.prefill_tokens == 1
    assert warm.generated == cold.generated


def test_a_damaged_row_runs_cold_with_the_cold_reply() -> None:
    h = make()
    p = prompt(20)
    cold = h.complete("cold", p, max_tokens=4)
    assert cold.finish_key is not None
    h.cache.corrupt.add(cold.finish_key)
    again = h.complete("again", p, max_tokens=4)
    assert again.generated == cold.generated
    assert h.backend.logits_sampled == 0
    assert all(r.phase is not Phase.RUNNING for r in h.core.requests.values())


def test_the_status_counts_first_tokens_sampled_from_stored_logits() -> None:
    h = make()
    p = prompt(20)
    h.complete("cold", p, max_tokens=4)
    assert h.core.status().stored_logits_hits == 0
    h.complete("warm", p, max_tokens=4)
    h.complete("again", p, max_tokens=4)
    assert h.core.status().stored_logits_hits == 2
    # A row without logits primes: not counted.
    old = make(cache=MemoryCache(keep_logits=False))
    old.complete("cold", p, max_tokens=4)
    assert old.complete("warm", p, max_tokens=4).cache_hit_kind is CacheHitKind.EXACT
    assert old.core.status().stored_logits_hits == 0
