"""The daemon's metrics as Prometheus families: what each number is called (issue 19, item 6).

:func:`families` turns one :class:`~llamad.front.wire.MetricsSnapshot` (the
front's ``metrics``) into metric families, and :func:`exposition` into the
text a ``GET /metrics`` or ``llamad metrics`` prints. Every llamad metric is
named ``llamad_*``; where vLLM publishes the same quantity, it is published
again under vLLM's name and type with vLLM's ``model_name`` label, so that
dashboards and routers written for vLLM (llm-d's scorer reads
``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and
``vllm:kv_cache_usage_perc``) read llamad unchanged. The whole catalogue,
with the vLLM mapping, is ``docs/internals/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from llamad.client.exposition import Family, MetricType, Sample, histogram_samples, render
from llamad.front.wire import MetricsSnapshot, ModelMetrics, ModelState

__all__ = ["CACHE_COUNTERS", "VLLM_FINISHED_REASON", "exposition", "families"]

VLLM_FINISHED_REASON: Final = {"stop": "stop", "length": "length", "cancelled": "abort"}
"""``vllm:request_success_total``'s ``finished_reason`` for each llamad outcome
that vLLM counts (vLLM's ``abort`` is a cancel; errors and refusals are only
in ``llamad_requests_total``)."""

_NS: Final = 1e-9

CACHE_COUNTERS: Final[dict[str, tuple[str, tuple[tuple[str, str], ...], float]]] = {
    # counter (llamad.cache.counters.COUNTERS) -> (family, labels, scale)
    "hits_exact": ("llamad_cache_lookups_total", (("result", "exact"),), 1),
    "hits_resume": ("llamad_cache_lookups_total", (("result", "resume"),), 1),
    "hits_longest_prefix": ("llamad_cache_lookups_total", (("result", "longest_prefix"),), 1),
    "misses": ("llamad_cache_lookups_total", (("result", "miss"),), 1),
    "hits_live": ("llamad_cache_live_reuses_total", (), 1),
    "saves_cold": ("llamad_cache_saves_total", (("reason", "cold"),), 1),
    "saves_continued": ("llamad_cache_saves_total", (("reason", "continued"),), 1),
    "saves_finish": ("llamad_cache_saves_total", (("reason", "finish"),), 1),
    "saves_evict": ("llamad_cache_saves_total", (("reason", "evict"),), 1),
    "saves_shutdown": ("llamad_cache_saves_total", (("reason", "shutdown"),), 1),
    "saves_dropped": ("llamad_cache_saves_dropped_total", (), 1),
    "evictions": ("llamad_cache_evictions_total", (), 1),
    "demotions": ("llamad_cache_demotions_total", (), 1),
    "promotions": ("llamad_cache_promotions_total", (), 1),
    "write_behind_copies": ("llamad_cache_write_behind_copies_total", (), 1),
    "moves_linked": ("llamad_cache_moves_linked_total", (), 1),
    "moves_failed": ("llamad_cache_moves_failed_total", (), 1),
    "corrupt_files": ("llamad_cache_corrupt_files_total", (), 1),
    "duplicate_dropped": ("llamad_cache_duplicates_dropped_total", (), 1),
    "pack_total_ns": ("llamad_cache_pack_seconds_total", (), _NS),
    "load_total_ns": ("llamad_cache_load_seconds_total", (), _NS),
    "longest_prefix_ns": ("llamad_cache_longest_prefix_seconds_total", (), _NS),
    "longest_prefix_probes": ("llamad_cache_longest_prefix_probes_total", (), 1),
    "prompt_tokens_live": ("llamad_cache_prompt_tokens_total", (("source", "live"),), 1),
    "prompt_tokens_ram": ("llamad_cache_prompt_tokens_total", (("source", "ram"),), 1),
    "prompt_tokens_ram_file": ("llamad_cache_prompt_tokens_total", (("source", "ram_file"),), 1),
    "prompt_tokens_disk": ("llamad_cache_prompt_tokens_total", (("source", "disk"),), 1),
    "prompt_tokens_remote": ("llamad_cache_prompt_tokens_total", (("source", "remote"),), 1),
    "prompt_tokens_computed": (
        "llamad_cache_prompt_tokens_total",
        (("source", "computed"),),
        1,
    ),
    # The shared remote tier (issue 20; llamad.cache.remote_store).
    "remote_hits": ("llamad_cache_remote_lookups_total", (("result", "hit"),), 1),
    "remote_misses": ("llamad_cache_remote_lookups_total", (("result", "miss"),), 1),
    "remote_skipped": ("llamad_cache_remote_lookups_total", (("result", "skipped"),), 1),
    "remote_evicted": ("llamad_cache_remote_lookups_total", (("result", "evicted"),), 1),
    "remote_damaged": ("llamad_cache_remote_lookups_total", (("result", "damaged"),), 1),
    "remote_errors": ("llamad_cache_remote_errors_total", (), 1),
    "remote_timeouts": ("llamad_cache_remote_timeouts_total", (), 1),
    "remote_reconnects": ("llamad_cache_remote_reconnects_total", (), 1),
    "remote_saves": ("llamad_cache_remote_saves_total", (("result", "stored"),), 1),
    "remote_saves_dropped": ("llamad_cache_remote_saves_total", (("result", "dropped"),), 1),
    "remote_saves_duplicate": (
        "llamad_cache_remote_saves_total",
        (("result", "duplicate"),),
        1,
    ),
    "remote_saves_failed": ("llamad_cache_remote_saves_total", (("result", "failed"),), 1),
    "remote_bytes_written": ("llamad_cache_remote_written_bytes_total", (), 1),
    "remote_evictions": ("llamad_cache_remote_evictions_total", (), 1),
}
"""Where each of the cache's counters (the ``counters`` op's names) is
published; the ``bytes_*`` gauges are ``llamad_cache_bytes``."""

_CACHE_HELP: Final = {
    "llamad_cache_lookups_total": "Cache-meta lookups by result: an exact row, a resumed "
    "session row, a longest-prefix row, or a miss.",
    "llamad_cache_live_reuses_total": "Requests that kept or shared live KV another "
    "request left (no cache row read).",
    "llamad_cache_saves_total": "Rows the cache published, by save reason.",
    "llamad_cache_saves_dropped_total": "Saves dropped (writer at its cap, policy, quota).",
    "llamad_cache_evictions_total": "Rows evicted from the cache's last tier.",
    "llamad_cache_demotions_total": "Rows moved to a lower tier by quota.",
    "llamad_cache_promotions_total": "Rows copied to a higher tier on a hit.",
    "llamad_cache_write_behind_copies_total": "Rows copied to disk behind a RAM save.",
    "llamad_cache_moves_linked_total": "Tier moves made by link(2) instead of a copy.",
    "llamad_cache_moves_failed_total": "Tier moves that failed.",
    "llamad_cache_corrupt_files_total": "Cache files found corrupt (never restored).",
    "llamad_cache_duplicates_dropped_total": "Saves of a row already published, dropped.",
    "llamad_cache_pack_seconds_total": "Seconds spent packing KV state for saves.",
    "llamad_cache_load_seconds_total": "Seconds spent loading KV state for restores.",
    "llamad_cache_longest_prefix_seconds_total": "Seconds cache-meta spent in "
    "longest-prefix walks.",
    "llamad_cache_longest_prefix_probes_total": "Candidate keys probed by longest-prefix walks.",
    "llamad_cache_prompt_tokens_total": "Prompt tokens by where their KV came from, every "
    "worker since the cache started (a worker restart does not reset it).",
    "llamad_cache_remote_lookups_total": "Remote-tier lookups by result: a row restored, "
    "none there, skipped while Redis was failing, a row Redis evicted, a damaged row.",
    "llamad_cache_remote_errors_total": "Remote-tier operations that failed (Redis down, "
    "slow or refusing).",
    "llamad_cache_remote_timeouts_total": "Remote-tier operations past their bound.",
    "llamad_cache_remote_reconnects_total": "Times the remote tier was used again after failing.",
    "llamad_cache_remote_saves_total": "Rows offered to the remote tier, by result.",
    "llamad_cache_remote_written_bytes_total": "Bytes written to the remote tier.",
    "llamad_cache_remote_evictions_total": "Remote rows deleted by llamad's remote quota.",
}

_HISTOGRAMS: Final = (
    # snapshot name, llamad family, vLLM family, help
    (
        "ttft",
        "llamad_time_to_first_token_seconds",
        "vllm:time_to_first_token_seconds",
        "Time to first token in seconds, from when the request was sent (same host) or arrived.",
    ),
    (
        "itl",
        "llamad_inter_token_latency_seconds",
        "vllm:inter_token_latency_seconds",
        "Seconds between two consecutive tokens of one request.",
    ),
    (
        "e2e",
        "llamad_e2e_request_latency_seconds",
        "vllm:e2e_request_latency_seconds",
        "End-to-end request latency in seconds (requests that ended done, cancelled included).",
    ),
    (
        "queue",
        "llamad_request_queue_time_seconds",
        "vllm:request_queue_time_seconds",
        "Seconds from when the request was sent (or arrived) to its admission to a sequence.",
    ),
)


class _Builder:
    """Families in first-use order; a name's type and help are given once."""

    def __init__(self) -> None:
        self._families: dict[str, Family] = {}

    def add(
        self,
        name: str,
        kind: MetricType,
        help_: str,
        labels: Iterable[tuple[str, str]],
        value: float,
    ) -> None:
        self.family(name, kind, help_).samples.append(Sample(tuple(labels), value))

    def family(self, name: str, kind: MetricType, help_: str) -> Family:
        family = self._families.get(name)
        if family is None:
            family = self._families[name] = Family(name, kind, help_)
        return family

    def done(self) -> list[Family]:
        return [f for f in self._families.values() if f.samples]


def _model(b: _Builder, m: ModelMetrics) -> None:
    model = (("model_name", m.model_id),)
    for state in ModelState:
        b.add(
            "llamad_model_state",
            "gauge",
            "1 for the state each model is in (loading, ready, unloading, unloaded, failed).",
            (*model, ("state", state.value)),
            1 if m.state is state else 0,
        )
    b.add(
        "llamad_worker_restarts_total",
        "counter",
        "Restarts of the model's worker after a crash since it was loaded.",
        model,
        m.restarts,
    )
    b.add(
        "llamad_kv_cells", "gauge", "The model's context size (n_ctx), in KV cells.", model, m.n_ctx
    )
    status = m.status
    if status is None:
        return  # no worker running: nothing it counted is there to read
    running = status.active_sequences
    waiting = status.queue_depth
    b.add("llamad_requests_running", "gauge", "Requests holding a sequence.", model, running)
    b.add("llamad_requests_waiting", "gauge", "Requests queued for a sequence.", model, waiting)
    b.add(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        model,
        running,
    )
    b.add(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        model,
        waiting,
    )
    b.add(
        "llamad_kv_cells_used",
        "gauge",
        "KV cells in use (live requests and idle entries).",
        model,
        status.kv_cells_used,
    )
    if status.kv_cells_end >= 0:
        b.add(
            "llamad_kv_cells_end",
            "gauge",
            "One past the highest KV cell in use: the span every decode attends over.",
            model,
            status.kv_cells_end,
        )
    usage = status.kv_cells_used / m.n_ctx if m.n_ctx > 0 else 0.0
    b.add(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        model,
        usage,
    )
    b.add("llamad_sessions", "gauge", "Sessions the worker holds.", model, status.sessions)
    b.add(
        "llamad_idle_entries",
        "gauge",
        "Finished requests' KV kept live for reuse.",
        model,
        status.idle_count,
    )
    b.add(
        "llamad_idle_entries_released_total",
        "counter",
        "Idle entries cleared because a tier holds their rows (release_saved_idle).",
        model,
        status.idle_released,
    )
    b.add(
        "llamad_idle_entries_moved_total",
        "counter",
        "Idle entries moved down from above freed KV cells, their KV unchanged.",
        model,
        status.idle_moved,
    )
    b.add(
        "llamad_decode_steps_total",
        "counter",
        "llama_decode steps since the worker started.",
        model,
        status.ticks,
    )
    threads = m.threads
    if threads is not None:
        b.add(
            "llamad_worker_threads",
            "gauge",
            "Threads the worker's last decode step ran on.",
            model,
            threads.threads,
        )
        b.add(
            "llamad_worker_thread_budget",
            "gauge",
            "Threads the daemon-wide budget allows the worker now.",
            model,
            threads.budget,
        )
        b.add(
            "llamad_worker_thread_ceiling",
            "gauge",
            "Threads collapse fallback allows the worker now.",
            model,
            threads.ceiling,
        )
        b.add(
            "llamad_thread_fallbacks_total",
            "counter",
            "Times the thread governor lowered the worker's thread ceiling.",
            model,
            threads.fallbacks,
        )
        b.add(
            "llamad_thread_collapses_total",
            "counter",
            "Decode steps the thread governor judged collapsed.",
            model,
            threads.collapses,
        )
        b.add(
            "llamad_thread_quiet_probes_total",
            "counter",
            "Probes back up made before their cool-down ended, other processes "
            "having left the cores free.",
            model,
            threads.quiet_probes,
        )
    counts = m.counts
    if counts is None:
        return
    for outcome, n in counts.outcomes.items():
        b.add(
            "llamad_requests_total",
            "counter",
            "Requests by how they ended: stop, length, cancelled, error (after "
            "admission), refused (before).",
            (*model, ("outcome", outcome)),
            n,
        )
        reason = VLLM_FINISHED_REASON.get(outcome)
        if reason is not None:
            b.add(
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                (*model, ("finished_reason", reason)),
                n,
            )
    prompt = sum(counts.prompt_tokens.values())
    for source, n in counts.prompt_tokens.items():
        b.add(
            "llamad_prompt_tokens_total",
            "counter",
            "Prompt tokens by where their KV came from: live, ram, ram_file, disk, "
            "remote, computed (prefilled).",
            (*model, ("source", source)),
            n,
        )
    b.add(
        "vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", model, prompt
    )
    b.add(
        "llamad_generation_tokens_total",
        "counter",
        "Tokens sampled.",
        model,
        counts.generation_tokens,
    )
    b.add(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        model,
        counts.generation_tokens,
    )
    queries = sum(counts.cache_hits.values())
    b.add(
        "llamad_cache_queries_total",
        "counter",
        "Requests that resolved where to start (each asks live KV and the cache once).",
        model,
        queries,
    )
    for kind, n in counts.cache_hits.items():
        if kind != "cold":
            b.add(
                "llamad_cache_hits_total",
                "counter",
                "Requests that started from kept state, by kind: exact, partial, "
                "sticky, continuation (queries minus these were cold).",
                (*model, ("kind", kind)),
                n,
            )
    reused = prompt - counts.prompt_tokens.get("computed", 0)
    b.add(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        model,
        prompt,
    )
    b.add(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        model,
        reused,
    )
    for key, name, vllm_name, help_ in _HISTOGRAMS:
        h = m.histograms.get(key)
        if h is None:
            continue
        for family in (name, vllm_name):
            b.family(family, "histogram", help_).samples.extend(
                histogram_samples(model, h.bounds, h.counts, h.sum)
            )


def _cache(b: _Builder, snap: MetricsSnapshot) -> None:
    for tier, usage in snap.tiers.items():
        tier_label = (("tier", str(tier)),)
        b.add(
            "llamad_cache_bytes", "gauge", "Bytes each cache tier holds.", tier_label, usage.bytes
        )
        b.add(
            "llamad_cache_quota_bytes",
            "gauge",
            "Each cache tier's byte quota.",
            tier_label,
            usage.quota,
        )
    for counter, (name, labels, scale) in CACHE_COUNTERS.items():
        if counter in snap.cache:
            value = snap.cache[counter]
            # Times are kept in ns: published in seconds, as Prometheus names them.
            b.add(
                name, "counter", _CACHE_HELP[name], labels, value * scale if scale != 1 else value
            )


def families(snap: MetricsSnapshot) -> list[Family]:
    """Every family of one snapshot, families without samples left out."""
    b = _Builder()
    b.add(
        "llamad_start_time_seconds",
        "gauge",
        "When the daemon started, seconds since the epoch.",
        (),
        snap.started_at,
    )
    b.add("llamad_uptime_seconds", "gauge", "Seconds since the daemon started.", (), snap.uptime_s)
    for m in snap.models:
        _model(b, m)
    _cache(b, snap)
    return b.done()


def exposition(snap: MetricsSnapshot, *, select: Callable[[Family], bool] | None = None) -> str:
    """The Prometheus text (format 0.0.4) of one snapshot; ``select`` keeps some families."""
    found = families(snap)
    return render(found if select is None else [f for f in found if select(f)])
