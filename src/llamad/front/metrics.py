"""The daemon's ``metrics``: one read of every worker and of the cache (issue 19, item 6).

Gathered from the same sources as ``status`` (:mod:`llamad.front.status`)
and never waiting on anyone: each worker's part is its status board (a file
it publishes between ticks, readable in the middle of a long one), the
cache's part its counters file (summed rows, no message to cache-meta), the
rest the front's own table. Nothing here asks a supervisor either, so a
scrape is answered on the front's loop at once, whatever the daemon is doing.

Each worker counts its own requests and keeps its own histograms
(:mod:`llamad.model.request_metrics`): the numbers of one model come from
one process, whole, and a worker that restarts starts them again from zero
(Prometheus's counter reset). The bucket bounds are added here, from this
daemon's own code, so a client of another version renders them right.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

import msgspec

from llamad.config import LlamadConfig
from llamad.front.status import tier_usage
from llamad.front.table import ModelEntry
from llamad.front.wire import Histogram, MetricsSnapshot, ModelMetrics
from llamad.model.request_metrics import BUCKETS
from llamad.model.wire import LatencyCounts, WorkerMetrics, WorkerSnapshot

__all__ = ["daemon_metrics", "histograms_of", "model_metrics"]


def histograms_of(counts: WorkerMetrics) -> dict[str, Histogram]:
    """The board's histograms with their bounds; one whose counts do not fit
    this daemon's bounds (a worker of another version) is left out."""
    out: dict[str, Histogram] = {}
    for name, bounds in BUCKETS.items():
        h: LatencyCounts = getattr(counts, name)
        if len(h.counts) == len(bounds) + 1:
            out[name] = Histogram(bounds=list(bounds), counts=list(h.counts), sum=h.sum)
    return out


def model_metrics(entry: ModelEntry, board: WorkerSnapshot | None) -> ModelMetrics:
    base = ModelMetrics(
        model_id=entry.model_id,
        state=entry.state,
        n_ctx=entry.n_ctx,
        restarts=entry.restarts,
        pid=entry.pid,
    )
    if board is None:
        return base
    # Idle entries are status's detail, not a metric: leave them off the wire.
    status = msgspec.structs.replace(board.status, idle_entries=())
    return msgspec.structs.replace(
        base,
        status=status,
        threads=board.threads,
        requests_total=board.requests_total,
        counts=board.metrics,
        histograms={} if board.metrics is None else histograms_of(board.metrics),
    )


def daemon_metrics(
    config: LlamadConfig,
    *,
    started_at: float,
    entries: Iterable[ModelEntry],
    board: Callable[[ModelEntry], WorkerSnapshot | None],
    counters: Mapping[str, int],
) -> MetricsSnapshot:
    now = time.time()
    return MetricsSnapshot(
        at=now,
        started_at=started_at,
        uptime_s=round(max(0.0, now - started_at), 3),
        models=[model_metrics(e, board(e)) for e in sorted(entries, key=lambda e: e.model_id)],
        cache=dict(counters),
        tiers=tier_usage(config, dict(counters)),
    )
