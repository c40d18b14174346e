"""The daemon's metrics: gathered from the boards and the counters, named as vLLM names them."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llamad.cache.counters import COUNTERS, GAUGES
from llamad.client.prometheus import CACHE_COUNTERS, exposition
from llamad.config import LlamadConfig
from llamad.front.metrics import daemon_metrics, histograms_of
from llamad.front.table import ModelEntry
from llamad.front.wire import OPS, MetricsSnapshot, ModelState
from llamad.model.request_metrics import RequestMetrics
from llamad.model.results import (
    CacheHitKind,
    FinishReason,
    IdleEntry,
    TokenSources,
    WorkerPhase,
    WorkerStatus,
)
from llamad.model.wire import LatencyCounts, ThreadStatus, WorkerSnapshot

pytestmark = pytest.mark.timeout(30)


def _entry(model_id: str, state: ModelState, pid: int | None, restarts: int = 0) -> ModelEntry:
    return ModelEntry(
        model_id=model_id,
        spec={},
        path=f"/m/{model_id}.gguf",
        n_ctx=1000,
        n_seq_max=4,
        keep_alive_s=None,
        configured=True,
        state=state,
        pid=pid,
        restarts=restarts,
    )


def _board(model_id: str, pid: int, metrics: RequestMetrics) -> WorkerSnapshot:
    status = WorkerStatus(
        phase=WorkerPhase.GENERATING,
        pending_len=5,
        queue_depth=2,
        active_sequences=3,
        free_sequences=1,
        sessions=1,
        kv_cells_used=250,
        ticks=77,
        idle_entries=(IdleEntry(0, 10, 10, 1.0),),
        idle_count=1,
        idle_released=3,
        idle_moved=2,
        kv_cells_end=300,
    )
    threads = ThreadStatus(1, 2, 2, 1, 2, 1, True, 4, 6, 0, 0, 0, 0, 1.0, None, None, 3)
    return WorkerSnapshot(
        model_id=model_id,
        pid=pid,
        instance="i",
        seq=1,
        at=1.0,
        status=status,
        requests_total=9,
        threads=threads,
        metrics=metrics.snapshot(),
    )


def _snapshot() -> MetricsSnapshot:
    m = RequestMetrics()
    m.resolved(CacheHitKind.COLD, TokenSources(computed=20))
    m.resolved(CacheHitKind.EXACT, TokenSources(ram=19, computed=1))
    m.token(10.0, None, 10.05)
    m.token(10.0, 10.05, 10.06)
    m.finished(FinishReason.STOP, 10.0, 10.001, 10.07)
    m.finished(FinishReason.CANCELLED, 10.0, 10.001, 10.2)
    m.refused()
    entries = [_entry("b", ModelState.READY, 42, restarts=2), _entry("a", ModelState.FAILED, None)]
    boards = {"b": _board("b", 42, m)}
    counters = {name: i + 1 for i, name in enumerate(COUNTERS)}
    counters.update(bytes_ram=1000, bytes_ram_file=0, bytes_disk=5000)
    snap = daemon_metrics(
        LlamadConfig(),
        started_at=1_700_000_000.0,
        entries=entries,
        board=lambda e: boards.get(e.model_id),
        counters=counters,
    )
    # It crosses the wire whole.
    wire = msgspec.msgpack.encode(snap)
    assert msgspec.msgpack.decode(wire, type=MetricsSnapshot) == snap
    return snap


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key not in out, key
            out[key] = s.value
    return out


def _get(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_is_an_op_of_the_front() -> None:
    assert OPS["metrics"].name == "metrics"


def test_a_model_reads_under_llamad_and_vllm_names() -> None:
    snap = _snapshot()
    assert [m.model_id for m in snap.models] == ["a", "b"]
    assert snap.models[1].status is not None and snap.models[1].status.idle_entries == ()
    s = _samples(exposition(snap))
    b = {"model_name": "b"}
    assert _get(s, "llamad_requests_total", outcome="stop", **b) == 1
    assert _get(s, "llamad_requests_total", outcome="refused", **b) == 1
    assert _get(s, "vllm:request_success_total", finished_reason="abort", **b) == 1
    assert (
        "vllm:request_success_total",
        (("finished_reason", "refused"), ("model_name", "b")),
    ) not in s
    assert _get(s, "llamad_requests_running", **b) == _get(s, "vllm:num_requests_running", **b) == 3
    assert _get(s, "llamad_requests_waiting", **b) == _get(s, "vllm:num_requests_waiting", **b) == 2
    assert _get(s, "vllm:kv_cache_usage_perc", **b) == 0.25
    assert _get(s, "llamad_prompt_tokens_total", source="ram", **b) == 19
    assert _get(s, "llamad_prompt_tokens_total", source="computed", **b) == 21
    assert _get(s, "vllm:prompt_tokens_total", **b) == 40
    assert _get(s, "vllm:prefix_cache_queries_total", **b) == 40
    assert _get(s, "vllm:prefix_cache_hits_total", **b) == 19
    assert _get(s, "llamad_cache_queries_total", **b) == 2
    assert _get(s, "llamad_cache_hits_total", kind="exact", **b) == 1
    assert ("llamad_cache_hits_total", (("kind", "cold"), ("model_name", "b"))) not in s
    assert _get(s, "vllm:generation_tokens_total", **b) == 2
    assert _get(s, "llamad_worker_restarts_total", **b) == 2
    assert _get(s, "llamad_idle_entries_released_total", **b) == 3
    assert _get(s, "llamad_idle_entries_moved_total", **b) == 2
    assert _get(s, "llamad_kv_cells_end", **b) == 300
    assert _get(s, "llamad_thread_fallbacks_total", **b) == 4
    assert _get(s, "llamad_thread_collapses_total", **b) == 6
    assert _get(s, "llamad_thread_quiet_probes_total", **b) == 3
    assert _get(s, "llamad_model_state", state="ready", **b) == 1
    assert _get(s, "llamad_model_state", state="failed", **b) == 0
    # A model with no worker: its state, no worker numbers.
    assert _get(s, "llamad_model_state", state="failed", model_name="a") == 1
    assert ("llamad_requests_running", (("model_name", "a"),)) not in s
    for name in ("llamad_time_to_first_token_seconds", "vllm:time_to_first_token_seconds"):
        assert _get(s, f"{name}_count", **b) == 1
        assert _get(s, f"{name}_bucket", le="0.04", **b) == 0
        assert _get(s, f"{name}_bucket", le="0.06", **b) == 1
        assert _get(s, f"{name}_bucket", le="+Inf", **b) == 1
    assert _get(s, "vllm:inter_token_latency_seconds_count", **b) == 1
    assert _get(s, "vllm:e2e_request_latency_seconds_count", **b) == 2
    assert _get(s, "vllm:e2e_request_latency_seconds_sum", **b) == pytest.approx(0.27)
    assert _get(s, "vllm:request_queue_time_seconds_count", **b) == 2


def test_the_cache_reads_with_its_tiers_against_their_quotas() -> None:
    snap = _snapshot()
    s = _samples(exposition(snap))
    c = LlamadConfig().cache
    assert _get(s, "llamad_cache_bytes", tier="ram") == 1000
    assert _get(s, "llamad_cache_quota_bytes", tier="ram") == c.ram.quota
    assert _get(s, "llamad_cache_bytes", tier="disk") == 5000
    assert _get(s, "llamad_cache_quota_bytes", tier="disk") == c.disk.quota
    saves = COUNTERS.index("saves_finish") + 1
    assert _get(s, "llamad_cache_saves_total", reason="finish") == saves
    assert _get(s, "llamad_cache_demotions_total") == COUNTERS.index("demotions") + 1
    assert _get(s, "llamad_cache_evictions_total") == COUNTERS.index("evictions") + 1
    ns = COUNTERS.index("pack_total_ns") + 1
    assert _get(s, "llamad_cache_pack_seconds_total") == pytest.approx(ns * 1e-9)
    assert _get(s, "llamad_cache_lookups_total", result="miss") == COUNTERS.index("misses") + 1


def test_every_counter_of_the_cache_is_published_once() -> None:
    assert set(CACHE_COUNTERS) == set(COUNTERS)
    assert GAUGES == ("bytes_ram", "bytes_ram_file", "bytes_disk")  # llamad_cache_bytes
    places = [(name, labels) for name, labels, _ in CACHE_COUNTERS.values()]
    assert len(places) == len(set(places))


def test_a_cache_still_starting_leaves_its_families_out() -> None:
    snap = msgspec.structs.replace(_snapshot(), cache={}, tiers={})
    text = exposition(snap)
    assert "llamad_cache_saves_total" not in text and "llamad_cache_bytes" not in text
    assert "vllm:num_requests_running" in text
    _samples(text)


def test_a_histogram_of_other_bounds_is_left_out_not_misread() -> None:
    """A worker of another version (its counts do not fit this daemon's bounds):
    that histogram is dropped, its other numbers are read."""
    counts = RequestMetrics().snapshot()
    odd = msgspec.structs.replace(counts, ttft=LatencyCounts(counts=[1, 2, 3], sum=0.5))
    assert set(histograms_of(odd)) == {"itl", "e2e", "queue"}
    assert set(histograms_of(counts)) == {"ttft", "itl", "e2e", "queue"}
