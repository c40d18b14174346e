"""The worker's request metrics: fixed-bucket histograms, counted where requests are served."""

from __future__ import annotations

import msgspec
import pytest

from llamad.llama_ffi.errors import DecodeError
from llamad.model.planner import BatchPlan
from llamad.model.request_metrics import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    QUEUE_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
    RequestMetrics,
)
from llamad.model.results import (
    CacheHitKind,
    FinishReason,
    IdleEntry,
    TokenSources,
    WorkerPhase,
    WorkerStatus,
)
from llamad.model.status_board import SLOT_BYTES
from llamad.model.stub import StubBackend
from llamad.model.wire import CollapseReport, ThreadStatus, WorkerSnapshot
from worker_harness import Clock, make, prompt

pytestmark = pytest.mark.timeout(30)

DECODE_S = 0.25

# vLLM's own bounds (vllm/v1/metrics/loggers.py): a dashboard written for
# vLLM reads these le values, so every one of them must be ours too.
VLLM_TTFT = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
             5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]  # fmt: skip
VLLM_ITL = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
            7.5, 10.0, 20.0, 40.0, 80.0]  # fmt: skip
VLLM_LATENCY = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]  # fmt: skip


class TimedBackend(StubBackend):
    """The stub, with every decode taking DECODE_S of the test's clock."""

    def __init__(self, clock: Clock, fail_on: int | None = None) -> None:
        super().__init__(n_ctx=1024, n_batch=64, n_seq_max=2)
        self.clock = clock
        self.fail_on = fail_on
        self.calls = 0

    def decode(self, plan: BatchPlan) -> None:
        self.calls += 1
        if self.calls == self.fail_on:
            raise DecodeError("llama_decode failed (rc=-3)")
        super().decode(plan)
        self.clock.advance(DECODE_S)


def test_a_value_on_a_bound_counts_in_that_bucket() -> None:
    h = Histogram((0.1, 0.5, 1.0))
    for v in (0.0, 0.1, 0.10001, 0.5, 1.0, 1.5, 99.0):
        h.observe(v)
    # le is "at most": 0.1 is in the first bucket, 1.5 and 99 above every bound.
    assert h.counts == [2, 2, 1, 2]
    assert h.count == 7
    assert h.sum == pytest.approx(0.0 + 0.1 + 0.10001 + 0.5 + 1.0 + 1.5 + 99.0)


@pytest.mark.parametrize("bounds", [(), (1.0, 0.5), (0.5, 0.5)])
def test_bounds_must_increase(bounds: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="increasing"):
        Histogram(bounds)


@pytest.mark.parametrize(
    ("ours", "vllm"),
    [(TTFT_BUCKETS, VLLM_TTFT), (ITL_BUCKETS, VLLM_ITL), (E2E_BUCKETS, VLLM_LATENCY),
     (QUEUE_BUCKETS, VLLM_LATENCY)],
)  # fmt: skip
def test_every_bound_vllm_publishes_is_ours_too(ours: tuple[float, ...], vllm: list[float]) -> None:
    assert set(vllm) <= set(ours)
    assert list(ours) == sorted(set(ours))


def test_a_request_is_counted_where_it_is_served() -> None:
    clock = Clock()
    h = make(backend=TimedBackend(clock), clock=clock, chunk=16)
    sent = clock.now
    h.complete("a", prompt(20), max_tokens=3)
    m = h.core.metrics
    # One first token, then two gaps of one decode each.
    ttft, itl, e2e, queue = (m.histograms[k] for k in ("ttft", "itl", "e2e", "queue"))
    assert ttft.count == 1 and itl.count == 2 and e2e.count == 1 and queue.count == 1
    assert itl.sum == pytest.approx(2 * DECODE_S, abs=0.01)
    # 20 tokens in chunks of 16: two prefill decodes (plus the held-back last
    # token's) before the first token exists.
    assert ttft.sum >= 2 * DECODE_S
    assert e2e.sum == pytest.approx(clock.now - sent, abs=0.01)
    assert e2e.sum >= ttft.sum + itl.sum
    assert m.outcomes["length"] == 1 and m.generation_tokens == 3
    assert m.cache_hits["cold"] == 1
    assert m.prompt_tokens["computed"] == 20

    # The same prompt again: a hit, its prompt tokens from the kept KV.
    h.complete("b", prompt(20), max_tokens=2)
    assert m.cache_hits["exact"] == 1
    assert sum(m.prompt_tokens.values()) == 40
    assert m.prompt_tokens["computed"] < 20 + 20
    assert m.histograms["ttft"].count == 2 and m.histograms["itl"].count == 3
    assert m.outcomes["length"] == 2 and m.generation_tokens == 5

    board = m.snapshot()
    assert board.ttft.counts == m.histograms["ttft"].counts
    assert board.outcomes == m.outcomes and board.prompt_tokens == m.prompt_tokens


def test_a_request_cancelled_in_the_queue_counts_its_wait() -> None:
    clock = Clock()
    h = make(backend=TimedBackend(clock), clock=clock, n_seq_max=1)
    h.submit("a", prompt(10), max_tokens=4)
    h.submit("b", prompt(10, start=3), max_tokens=4)
    h.step()
    h.core.cancel("b")
    h.run()
    m = h.core.metrics
    assert m.outcomes["cancelled"] == 1 and m.outcomes["length"] == 1
    assert m.histograms["queue"].count == 2
    assert m.histograms["e2e"].count == 2
    assert m.histograms["ttft"].count == 1  # b never sampled a token


def test_a_failed_request_is_an_error_not_a_success() -> None:
    clock = Clock()
    h = make(backend=TimedBackend(clock, fail_on=2), clock=clock)
    h.submit("a", prompt(10), max_tokens=5)
    h.run()
    m = h.core.metrics
    assert h.error("a").code == "decode_failed"
    assert m.outcomes["error"] == 1
    assert sum(m.outcomes.values()) == 1
    assert m.histograms["e2e"].count == 0  # e2e is of requests that ended done


def test_refusals_and_resolutions_add_up() -> None:
    m = RequestMetrics()
    m.refused()
    m.resolved(CacheHitKind.PARTIAL, TokenSources(ram=8, computed=2))
    m.resolved(CacheHitKind.STICKY, TokenSources(live=5, computed=1))
    m.finished(FinishReason.STOP, 10.0, 10.5, 12.0)
    assert m.outcomes == {"stop": 1, "length": 0, "cancelled": 0, "error": 0, "refused": 1}
    assert m.cache_hits["partial"] == m.cache_hits["sticky"] == 1
    assert m.prompt_tokens == {
        "live": 5, "ram": 8, "ram_file": 0, "disk": 0, "remote": 0, "computed": 3,
    }  # fmt: skip
    assert m.histograms["queue"].sum == pytest.approx(0.5)
    assert m.histograms["e2e"].sum == pytest.approx(2.0)


def test_the_fullest_snapshot_fits_the_status_board() -> None:
    """Every count at its largest, every idle entry shown, the thread governor's
    report: the board's slot still holds it (a publish that does not fit raises)."""
    m = RequestMetrics()
    big = 2**63
    for counts in (m.outcomes, m.cache_hits, m.prompt_tokens):
        for key in counts:
            counts[key] = big
    for h in m.histograms.values():
        h.counts = [big] * len(h.counts)
        h.sum = 1e300
    m.generation_tokens = big
    status = WorkerStatus(
        phase=WorkerPhase.GENERATING,
        pending_len=big,
        queue_depth=big,
        active_sequences=big,
        free_sequences=big,
        sessions=big,
        kv_cells_used=big,
        ticks=big,
        last_cache_hit=CacheHitKind.CONTINUATION,
        stored_logits_hits=big,
        idle_entries=tuple(IdleEntry(big, big, big, 1e300, True, True) for _ in range(64)),
        idle_count=big,
        live_hits=big,
        idle_released=big,
    )
    collapse = CollapseReport(big, big, 1e300, 1e300, 1e300, big)
    threads = ThreadStatus(big, big, big, big, big, big, True, big, big, big, big, big, big,
                           1e300, 1e300, collapse)  # fmt: skip
    snap = WorkerSnapshot(
        model_id="m" * 58,
        pid=big,
        instance="i" * 64,
        seq=big,
        at=1e300,
        status=status,
        busy_since=1e300,
        requests_total=big,
        threads=threads,
        last_request_at=1e300,
        tokenizing=big,
        metrics=m.snapshot(),
    )
    size = len(msgspec.msgpack.encode(snap))
    assert size <= SLOT_BYTES - 16, size
