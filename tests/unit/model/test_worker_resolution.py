"""Resolution (SPEC M3, C8, M16): exact, partial, cold; truncation; held-back logits token."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from llamad.cache.key import tokens_to_bytes
from llamad.cache.lookup import HitKind, Lookup, RowRef
from llamad.cache.tier_kind import TierKind
from llamad.errors import WorkerCrashed
from llamad.model.active import Phase
from llamad.model.resolution import (
    common_prefix,
    decide_continue,
    decide_fresh,
    decide_sticky,
    explain_miss,
    keeps_target_logits,
    shared_prefix,
    with_stored_logits,
)
from llamad.model.results import CacheHitKind
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache
from worker_harness import make, prompt

pytestmark = pytest.mark.timeout(60)

KEY = b"\x07" * 32


def lookup(use: int, row_tokens: int | None = None, kind: HitKind = HitKind.PREFIX) -> Lookup:
    row = RowRef(KEY, TierKind.RAM, "x", 100, row_tokens or use, pin=1)
    return Lookup(kind, row, use, use, KEY)


MISS = Lookup(None, None, 0, 0, None)


# -- decisions ---------------------------------------------------------------------


def test_a_row_covering_the_whole_prompt_is_exact_and_holds_back_the_last_token() -> None:
    res = decide_fresh(10, lookup(10), wants_logits=True)
    assert (res.kind, res.keep, res.read) == (CacheHitKind.EXACT, 9, 10)
    # prefill_only needs no logits: nothing held back.
    assert decide_fresh(10, lookup(10), wants_logits=False).keep == 10


def test_a_shorter_row_is_partial_and_no_row_is_cold() -> None:
    res = decide_fresh(10, lookup(6), wants_logits=True)
    assert (res.kind, res.keep, res.read) == (CacheHitKind.PARTIAL, 6, 6)
    assert decide_fresh(10, MISS, wants_logits=True).kind is CacheHitKind.COLD
    assert decide_fresh(10, None, wants_logits=True).keep == 0


def test_the_live_prefix_wins_ties_with_the_cache() -> None:
    assert decide_sticky(6, 10, lookup(6), wants_logits=True).kind is CacheHitKind.STICKY
    assert decide_sticky(6, 10, lookup(8), wants_logits=True).kind is CacheHitKind.PARTIAL
    assert decide_sticky(0, 10, None, wants_logits=True).kind is CacheHitKind.COLD


def test_a_continuation_keeps_what_its_sequence_holds() -> None:
    res = decide_continue(7, 10, None, wants_logits=True)
    assert (res.kind, res.keep, res.restore) == (CacheHitKind.CONTINUATION, 7, None)
    # Nothing new and nothing pending: the last token is decoded again for logits.
    assert decide_continue(10, 10, None, wants_logits=True).keep == 9
    parked = decide_continue(0, 10, lookup(8), wants_logits=True)
    assert (parked.kind, parked.keep, parked.read) == (CacheHitKind.CONTINUATION, 8, 8)


def test_a_row_keeping_the_targets_last_logits_is_kept_whole_and_sampled_from() -> None:
    exact = decide_fresh(10, lookup(10, row_tokens=14, kind=HitKind.COMMON), wants_logits=True)
    assert exact.keep == 9 and not exact.stored_logits
    res = with_stored_logits(exact, 10, 9, wants_logits=True)
    assert (res.kind, res.keep, res.read, res.stored_logits) == (CacheHitKind.EXACT, 10, 10, True)
    assert res.restore == exact.restore
    # Logits of another position, no logits, or no sampling: as before.
    assert with_stored_logits(exact, 10, 13, wants_logits=True) == exact
    assert with_stored_logits(exact, 10, 8, wants_logits=True) == exact
    assert with_stored_logits(exact, 10, None, wants_logits=True) == exact
    only = decide_fresh(10, lookup(10), wants_logits=False)
    assert with_stored_logits(only, 10, 9, wants_logits=False) == only
    assert keeps_target_logits(only, 10, 9)  # prefill_only still keeps them for its save
    # A partial row never holds the target's last position.
    partial = decide_fresh(10, lookup(6), wants_logits=True)
    assert not keeps_target_logits(partial, 10, 9)
    assert with_stored_logits(partial, 10, 5, wants_logits=True) == partial
    # Live KV covering the target comes with its logits when the request that
    # computed it kept them (an idle entry): kept whole too.
    sticky = decide_sticky(10, 10, None, wants_logits=True)
    assert with_stored_logits(sticky, 10, 9, wants_logits=True).keep == 10
    assert with_stored_logits(sticky, 10, 8, wants_logits=True) == sticky
    # A parked session's continuation restoring its whole target may.
    parked = decide_continue(0, 10, lookup(10), wants_logits=True)
    assert with_stored_logits(parked, 10, 9, wants_logits=True).keep == 10


def test_common_prefix_counts_shared_leading_tokens() -> None:
    assert common_prefix([1, 2, 3, 4], [1, 2, 9]) == 2
    assert common_prefix([], [1]) == 0
    long = list(range(5000))
    assert common_prefix(long, [*long[:4321], 7]) == 4321


def _shared(a: list[int], b: list[int]) -> int:
    """The leading tokens ``a`` and ``b`` share, one by one (the reference)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def test_shared_prefix_against_a_packed_side_agrees_with_common_prefix() -> None:
    # Resolution compares live sequences with a request's target packed once
    # (ActiveRequest.packed_target): the answer, and common_prefix's, must be
    # the tokens shared one by one for every pair: either side longer, a
    # first token that differs, a mismatch at every byte of a token (ids
    # that share low bytes), empty sides.
    rng = random.Random(7)
    cases = [([], [1]), ([1], []), ([5, 6], [6, 6]), ([1, 2, 3, 4], [1, 2, 9])]
    for _ in range(400):
        base = [rng.choice([rng.randrange(49_152), 0x01020304, 0x01020305]) for _ in range(300)]
        a = base[: rng.randrange(301)]
        b = base[: rng.randrange(301)]
        if b and rng.random() < 0.7:
            b[rng.randrange(len(b))] ^= 1 << (8 * rng.randrange(4))
        cases.append((a, b))
    for a, b in cases:
        assert shared_prefix(a, tokens_to_bytes(b)) == _shared(a, b), (a, b)
        assert common_prefix(a, b) == _shared(a, b), (a, b)


def test_a_requests_packed_target_is_its_target_packed_once() -> None:
    h = make(n_seq_max=1)
    h.submit("r", prompt(40), max_tokens=1)
    req = h.core.requests["r"]
    packed = req.packed_target
    assert packed == tokens_to_bytes(req.target)
    assert req.packed_target is packed


def test_a_miss_names_the_nearest_row_and_where_the_prompt_left_it() -> None:
    target = [ord(c) for c in "hello world"]
    near = Lookup(None, None, 0, 6, KEY)
    miss = explain_miss(target, near, 0, window=3, piece=lambda t: bytes((t,)))
    assert (miss.diverged_at, miss.nearest_key, miss.before, miss.after) == (6, KEY, "lo ", "wor")
    cold = explain_miss(target, None, 0, window=3, piece=lambda t: bytes((t,)))
    assert (cold.nearest_key, cold.diverged_at, cold.before) == (None, 0, "")


# -- through the core --------------------------------------------------------------


def batch_lengths_with_logits(backend: StubBackend) -> list[int]:
    return [len(s.tokens) for p in backend.decoded for s in p.spans if s.want_logits]


@pytest.mark.parametrize("keep_logits", [True, False], ids=["row_keeps_logits", "primer"])
@pytest.mark.parametrize("batch_sensitive", [False, True])
def test_an_exact_hit_reproduces_the_cold_reply(batch_sensitive: bool, keep_logits: bool) -> None:
    backend = StubBackend(n_ctx=1024, n_batch=64, n_seq_max=2, batch_sensitive=batch_sensitive)
    h = make(backend=backend, cache=MemoryCache(keep_logits=keep_logits), live_reuse=False)
    p = prompt(50)
    cold = h.complete("cold", p, max_tokens=12)
    warm = h.complete("warm", p, max_tokens=12)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.generated == cold.generated
    assert warm.reply == cold.reply
    # Prefill skipped: a row keeping the prompt's last logits samples the first
    # token from them; a row without (an older file) decodes the held-back
    # last token again.
    assert (cold.stats.prefill_tokens, warm.stats.prefill_tokens) == (50, 0 if keep_logits else 1)
    assert backend.logits_sampled == (1 if keep_logits else 0)
    assert warm.cache_delta.read == 50
    assert warm.cache_miss is None
    # Every logits row, cold or warm, came from a one-token span.
    assert set(batch_lengths_with_logits(backend)) == {1}


def test_a_longer_row_is_restored_and_truncated_to_the_prompt() -> None:
    h = make(live_reuse=False)
    p = prompt(40)
    first = h.complete("a", p, max_tokens=10)
    # The only rows: the cold boundary (32) and the finish row (prompt + reply).
    assert sorted(len(t) for t in h.cache.row_tokens().values()) == [32, 49]
    again = h.complete("b", p, max_tokens=10)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.generated == first.generated
    assert h.backend.tokens[0] == [] and h.core.cells_used == 0


def test_a_partial_hit_prefills_only_the_rest_and_explains_the_miss() -> None:
    h = make()
    base = prompt(40)
    h.complete("a", base, max_tokens=2)
    longer = base + prompt(20, start=99)
    result = h.complete("b", longer, max_tokens=4)
    assert result.cache_hit_kind is CacheHitKind.PARTIAL
    # The finish row (prompt + a decoded reply token) leaves the new prompt at 40.
    assert result.cache_delta.read == 40
    assert result.stats.prefill_tokens == 20
    miss = result.cache_miss
    assert miss is not None
    assert (miss.prompt_tokens, miss.restored_tokens) == (60, 40)
    assert miss.diverged_at == 40 and miss.nearest_key is not None
    assert miss.after.startswith(h.backend.piece(longer[40]).decode())
    cold_reference = make().complete("ref", longer, max_tokens=4)
    assert result.generated == cold_reference.generated


def test_a_diverging_row_is_restored_up_to_the_divergence() -> None:
    h = make()
    shared = prompt(30)
    h.complete("a", shared + prompt(10, start=1), max_tokens=1)
    other = shared + prompt(12, start=200)
    result = h.complete("b", other, max_tokens=6)
    assert result.cache_hit_kind is CacheHitKind.PARTIAL
    assert result.cache_delta.read == 30
    assert result.generated == make().complete("ref", other, max_tokens=6).generated


def test_a_corrupt_row_turns_the_request_cold() -> None:
    h = make(live_reuse=False)
    p = prompt(40)
    first = h.complete("a", p, max_tokens=5)
    h.cache.corrupt.update(h.cache.rows)
    again = h.complete("b", p, max_tokens=5)
    assert again.cache_hit_kind is CacheHitKind.COLD
    assert again.generated == first.generated
    assert not h.cache.pins


class FailingCache(MemoryCache):
    def resolve(self, *args: object, **kwargs: object) -> Lookup:
        raise WorkerCrashed("cache-meta died")


def test_a_cache_that_fails_costs_the_warm_start_not_the_request() -> None:
    h = make(cache=FailingCache())
    result = h.complete("a", prompt(30), max_tokens=4)
    assert result.cache_hit_kind is CacheHitKind.COLD
    assert len(result.generated) == 4


def test_every_pin_is_checked_back_in() -> None:
    h = make(n_seq_max=2)
    p = prompt(40)
    h.complete("a", p, max_tokens=3)
    for i in range(4):
        h.submit(f"r{i}", p[: 20 + i] + prompt(5, start=i), max_tokens=2)
    h.run()
    assert len(h.cache.resolves) == 5
    assert not h.cache.pins


def test_a_parent_save_still_in_flight_is_waited_for_between_ticks() -> None:
    h = make(cache=MemoryCache(defer_async=True), live_reuse=False)
    first = h.complete("a", prompt(40), max_tokens=3)
    assert first.finish_key is not None and h.cache.pending
    turn2 = first.context_tokens + prompt(8, start=77)
    h.submit("b", turn2, max_tokens=3, parent_key=first.finish_key)
    report = h.step()
    assert not report.batch
    assert h.core.next_wakeup() is not None
    for key in h.cache.publish_pending():
        h.core.save_done(key, published=True)
    h.run()
    result = h.result("b")
    assert result.cache_hit_kind is CacheHitKind.PARTIAL
    assert result.cache_delta.read == first.committed_tokens


def test_the_wait_for_a_parent_save_gives_up_after_session_resume_wait_ms() -> None:
    h = make(cache=MemoryCache(defer_async=True), live_reuse=False)
    first = h.complete("a", prompt(40), max_tokens=3)
    h.submit("b", [*first.context_tokens, 5], max_tokens=2, parent_key=first.finish_key)
    assert not h.step().batch
    assert h.core.requests["b"].phase is Phase.WAITING
    h.clock.advance(0.4)
    assert not h.step().batch
    h.clock.advance(0.2)
    assert h.step().batch
    h.run()
    # No save was ever published (the writer is held back): the request ran cold.
    assert h.result("b").cache_hit_kind is CacheHitKind.COLD
    assert not h.cache.resolves[-1].answer.hit


def waits(cache: MemoryCache) -> Sequence[float]:
    return [r.wait_s for r in cache.resolves]


def test_the_cache_may_block_only_while_nothing_else_runs() -> None:
    """A lookup may wait for a save in flight (the parent's, or a better row's:
    the cache decides) only when no other sequence runs: the wait blocks the loop."""
    h = make(n_seq_max=2)
    h.submit("alone", prompt(12), max_tokens=2, parent_key=KEY)
    h.run()
    h.submit("busy", prompt(12, start=5), max_tokens=50)
    h.step()
    h.step()
    h.submit("second", prompt(12, start=9), max_tokens=2, parent_key=KEY)
    h.run()
    assert waits(h.cache) == [0.5, 0.5, 0.0]


def test_a_repeat_waits_for_its_row_still_being_written_instead_of_running_cold() -> None:
    """No idle entry holds it (live reuse off), no parent key names it: the row
    the first request is still writing is what the cache reports in flight, and
    the repeat waits for it between ticks while another request decodes."""
    h = make(n_seq_max=2, cache=MemoryCache(defer_async=True), live_reuse=False)
    p = prompt(40)
    first = h.complete("a", p, max_tokens=3)
    h.submit("busy", prompt(20, start=90), max_tokens=40)
    h.step()
    h.submit("b", p, max_tokens=3)
    h.step()
    assert h.core.requests["b"].phase is Phase.WAITING
    h.clock.advance(0.1)
    for key in h.cache.publish_pending():
        h.core.save_done(key, published=True)
    h.run()
    got = h.result("b")
    assert got.cache_hit_kind is CacheHitKind.EXACT
    assert got.generated == first.generated
    assert got.stats.wait_ms >= 100.0
    assert got.cache_miss is None


def test_a_row_that_does_not_land_in_time_is_named_in_the_miss() -> None:
    h = make(n_seq_max=2, cache=MemoryCache(defer_async=True), live_reuse=False)
    p = prompt(40)
    first = h.complete("a", p, max_tokens=3)
    h.submit("busy", prompt(20, start=90), max_tokens=80)
    h.step()
    h.submit("b", [*first.context_tokens[: first.committed_tokens], 9], max_tokens=3)
    h.step()
    assert h.core.requests["b"].phase is Phase.WAITING
    h.clock.advance(0.6)  # past session_resume_wait_ms (500)
    h.run()
    got = h.result("b")
    # Every save is still held back: cold, and it says what it went without.
    assert got.cache_hit_kind is CacheHitKind.COLD
    miss = got.cache_miss
    assert miss is not None and miss.inflight_key == first.finish_key
    assert miss.inflight_tokens == first.committed_tokens
    assert miss.waited_ms >= 500.0
