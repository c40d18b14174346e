"""Save points (SPEC M5, C7): which reason fires at which token count."""

from __future__ import annotations

import pytest

from llamad.cache.kvc import SaveReason
from llamad.model.backend import PackedState
from llamad.model.results import CacheHitKind, DoneEvent, Event
from llamad.model.savepoints import SaveJob, SaveSchedule
from llamad.model.stub_cache import MemoryCache
from worker_harness import SMALL_POLICY, Clock, make, prompt

pytestmark = pytest.mark.timeout(60)


def saves(cache: MemoryCache) -> list[tuple[SaveReason, int]]:
    return [(j.reason, j.n_tokens) for j in cache.saves]


# -- the schedule ------------------------------------------------------------------


def test_a_cold_schedule_saves_at_the_trimmed_aligned_boundary() -> None:
    schedule = SaveSchedule.for_cold_prompt(39, SMALL_POLICY)
    assert schedule.cold_at == 32  # (39 - 2) rounded down to a multiple of 8
    assert schedule.limit(20) == 12
    assert schedule.due(31) is None
    assert schedule.due(32) is SaveReason.COLD
    assert schedule.limit(32) is None and schedule.due(40) is None


def test_a_short_cold_prompt_has_no_cold_save() -> None:
    assert SaveSchedule.for_cold_prompt(9, SMALL_POLICY).cold_at is None


def test_continued_saves_count_generated_tokens_only() -> None:
    schedule = SaveSchedule(SMALL_POLICY)
    assert schedule.due(100) is None  # generation has not started
    schedule.generation_started(100)
    assert [n for n in range(100, 140) if schedule.due(n)] == [116, 132]


def test_a_row_is_never_saved_twice_by_one_request() -> None:
    schedule = SaveSchedule(SMALL_POLICY)
    schedule.record(40)
    assert not schedule.finish_due(40, prefill_only=False)
    assert schedule.finish_due(41, prefill_only=False)
    assert not schedule.finish_due(7, prefill_only=False)  # below min_tokens
    assert schedule.finish_due(7, prefill_only=True)


def test_sync_reasons_are_evict_and_shutdown() -> None:
    job = SaveJob(SaveReason.EVICT, b"k" * 32, MemoryCache().namespace(None), (1,), 0)
    assert job.sync
    assert not SaveJob(SaveReason.FINISH, b"k" * 32, job.namespace, (1,), 0).sync


# -- through the core --------------------------------------------------------------


def test_a_cold_prefill_is_saved_at_its_boundary_then_finishes() -> None:
    h = make(chunk=16)
    p = prompt(39)
    result = h.complete("a", p, max_tokens=4)
    assert saves(h.cache) == [(SaveReason.COLD, 32), (SaveReason.FINISH, 42)]
    cold = h.cache.saves[0]
    assert list(cold.tokens) == p[:32]
    # Chunks stopped at the boundary: 16, 16 (=32), then 6 and the held-back token.
    chunks = [len(s.tokens) for plan in h.backend.decoded[:4] for s in plan.spans]
    assert chunks == [16, 16, 6, 1]
    assert result.finish_key == h.cache.saves[1].key
    assert result.cache_delta.created == 42


def test_continued_saves_fire_every_interval_of_generated_tokens() -> None:
    h = make()
    h.complete("a", prompt(20), max_tokens=40)
    assert saves(h.cache) == [
        (SaveReason.COLD, 16),
        (SaveReason.CONTINUED, 36),
        (SaveReason.CONTINUED, 52),
        (SaveReason.FINISH, 59),
    ]


def test_the_finish_save_covers_the_committed_transcript() -> None:
    h = make()
    result = h.complete("a", prompt(20), max_tokens=5)
    finish = h.cache.saves[-1]
    assert finish.reason is SaveReason.FINISH
    assert list(finish.tokens) == result.context_tokens[: result.committed_tokens]
    assert result.committed_tokens == len(result.context_tokens) - 1
    assert result.finish_key == h.cache.namespace(None).key(finish.tokens)


def test_no_finish_save_below_min_tokens() -> None:
    h = make()
    result = h.complete("a", prompt(3), max_tokens=2)
    assert h.cache.saves == [] and result.finish_key is None


def test_prefill_only_saves_the_prompt_whatever_its_length_and_then_hits() -> None:
    h = make(live_reuse=False)
    p = prompt(5)
    warm = h.complete("a", p, prefill_only=True)
    assert warm.generated == [] and warm.committed_tokens == 5
    assert saves(h.cache) == [(SaveReason.FINISH, 5)]
    hit = h.complete("b", p, max_tokens=3)
    assert hit.cache_hit_kind is CacheHitKind.EXACT
    # prefill_only decoded the prompt's last token alone and kept its logits:
    # the hit samples its first token from them and decodes no prompt token.
    assert hit.stats.prefill_tokens == 0
    again = h.complete("c", p, prefill_only=True)
    # Already cached whole: nothing decoded, nothing saved, the key reported.
    assert again.stats.prefill_tokens == 0 and again.finish_key == warm.finish_key
    # ("b" held 7 tokens at its end, below min_tokens: no finish save either.)
    assert len(h.cache.saves) == 1


def test_a_refused_async_save_reports_no_finish_key() -> None:
    cache = MemoryCache()
    cache.refuse_async = True
    h = make(cache=cache)
    result = h.complete("a", prompt(20), max_tokens=3)
    assert result.finish_key is None and cache.rows == {}
    assert result.cache_delta.created == 0


class SlowCache(MemoryCache):
    """A synchronous save that takes 400 ms of the test's clock."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock

    def save(self, job: SaveJob, state: PackedState) -> bool:
        if job.sync:
            self.clock.advance(0.4)
        return super().save(job, state)


def test_shutdown_saves_live_sequences_synchronously_within_the_cap() -> None:
    clock = Clock()
    cache = SlowCache(clock)
    policy = SMALL_POLICY.with_overrides({"evict_save_timeout_ms": 1000})
    h = make(n_seq_max=4, policy=policy, cache=cache, clock=clock)
    for i in range(4):
        h.submit(f"r{i}", prompt(6, start=i), max_tokens=100)
    for _ in range(3):
        h.step()
    report = h.core.shutdown()
    shutdown = [j for j in cache.saves if j.reason is SaveReason.SHUTDOWN]
    # 400 ms each against a 1000 ms cap: three fit, the fourth is skipped.
    assert [j.seq for j in shutdown] == [0, 1, 2]
    assert all(j.sync and j.deadline == shutdown[0].deadline for j in shutdown)
    # Every request ends cancelled, and no finish save follows the shutdown saves.
    done = [e.result for _, e in report.events if isinstance(e, DoneEvent)]
    assert sorted(report.finished) == ["r0", "r1", "r2", "r3"]
    assert all(r.cancelled for r in done) and len(done) == 4
    assert not [j for j in cache.saves if j.reason is SaveReason.FINISH]
    assert h.core.requests == {} and h.backend.samplers_open == 0


def test_tokens_sampled_in_a_tick_leave_before_a_finish_save_packs() -> None:
    # Two requests that end on their first token in the same tick: their
    # tokens go to the shell before the first finish save packs a sequence,
    # not after both packs (the packs of long rows take milliseconds each).
    h = make(n_seq_max=2)
    order: list[str] = []
    real_pack = h.backend.pack

    def pack(seq: int) -> PackedState:
        order.append(f"pack {seq}")
        return real_pack(seq)

    h.backend.pack = pack  # type: ignore[method-assign]

    def send_early(events: list[tuple[str, Event]]) -> None:
        order.extend(f"{type(e).__name__} {rid}" for rid, e in events)

    h.core.send_early = send_early
    h.submit("a", prompt(20, start=1), max_tokens=1)
    h.submit("b", prompt(20, start=40), max_tokens=1)
    h.run()
    # (Each prompt's cold save packed first, during the prefill.)
    first = order.index("TokenEvent a")
    assert order[first:] == ["TokenEvent a", "TokenEvent b", "pack 0", "DoneEvent a", "pack 1"]
    # Nothing is sent twice: the report holds what did not go early.
    reported = [f"{type(e).__name__} {rid}" for r in h.reports for rid, e in r.events]
    assert reported == ["DoneEvent b"]
    assert [reason for reason, _ in saves(h.cache)].count(SaveReason.FINISH) == 2
