"""What the ``llamad`` command prints, from hand-made results (no daemon)."""

from __future__ import annotations

import io
import json

import msgspec
import pytest

from llamad.cli.render import (
    ProgressBar,
    completion_summary,
    human_bytes,
    human_duration,
    idle_entries_text,
    model_status_text,
    model_text,
    models_table,
    sources_text,
    status_text,
    table,
    to_json,
    turn_summary,
)
from llamad.front.wire import (
    DaemonStatus,
    KvEventsAddress,
    ModelInfo,
    ModelState,
    ModelStatus,
    SupervisedChild,
    SupervisorStatus,
    TierUsage,
)
from llamad.model.results import (
    CacheDelta,
    CacheHitKind,
    Completion,
    FinishReason,
    IdleEntry,
    Stats,
    TokenSources,
    WorkerPhase,
    WorkerStatus,
)
from llamad.model.wire import WorkerSnapshot

pytestmark = pytest.mark.timeout(30)


def _completion(**kw: object) -> Completion:
    values: dict[str, object] = {
        "reply": "Paris.",
        "generated": [1, 2],
        "context_tokens": [5, 6, 7, 1, 2],
        "committed_tokens": 4,
        "cache_hit_kind": CacheHitKind.PARTIAL,
        "finish_reason": FinishReason.STOP,
        "stats": Stats(prompt_tokens=80, completion_tokens=2, prefill_tokens=20, restore_ms=3.25),
        "cache_delta": CacheDelta(
            read=60, created=22, sources=TokenSources(live=40, ram_file=20, computed=20)
        ),
        "finish_key": bytes(range(32)),
    }
    values.update(kw)
    return Completion(**values)  # type: ignore[arg-type]


def test_json_writes_cache_keys_as_hex_and_enums_as_values() -> None:
    body = json.loads(to_json(_completion()))
    assert body["finish_key"] == bytes(range(32)).hex()
    assert body["cache_hit_kind"] == "partial"
    assert body["stats"]["restore_ms"] == 3.25
    assert to_json([1]).endswith("\n")


def test_table_aligns_columns_and_prints_none_as_a_dash() -> None:
    text = table(("A", "LONGER"), [("x", None), ("yyyy", 2)])
    assert text.splitlines() == ["A     LONGER", "x     -", "yyyy  2"]


def test_sizes_and_durations_for_people() -> None:
    assert human_bytes(512) == "512 B"
    assert human_bytes(3 << 20) == "3.0 MiB"
    assert human_duration(12.34) == "12.3s"
    assert human_duration(3723) == "1h 02m 03s"


def test_summaries_name_the_hit_and_where_every_prompt_token_came_from() -> None:
    line = turn_summary(2, _completion())
    assert line.startswith(
        "[turn 2: cache partial, 60 of 80 prompt tokens reused "
        "(75%: live 40, ram_file 20, computed 20), 20 prefilled"
    )
    assert completion_summary(_completion()).startswith(
        "[partial: 80 prompt tokens (live 40, ram_file 20, computed 20), 20 prefilled | 2 generated"
    )
    assert sources_text(TokenSources()) == "none"


def test_progress_on_a_terminal_redraws_one_line() -> None:
    out = io.StringIO()
    bar = ProgressBar("loading m", out, terminal=True, width=10)
    for f in (0.0, 0.5, 1.0):
        bar.update(f)
    bar.finish("loaded m")
    text = out.getvalue()
    assert "\n" not in text[: text.index("loaded m")].replace("\r\x1b[K", "")
    assert "[#####.....]  50.0%" in text and "[##########] 100.0%" in text
    assert text.endswith("loaded m\n")


def test_progress_in_a_pipe_prints_a_line_per_tenth() -> None:
    out = io.StringIO()
    bar = ProgressBar("loading m", out, terminal=False)
    for i in range(101):
        bar.update(i / 100)
    bar.finish("loaded m")
    lines = out.getvalue().splitlines()
    assert lines == [f"loading m: {p}%" for p in range(0, 101, 10)] + ["loaded m"]


def test_status_shows_models_processes_restarts_and_tiers() -> None:
    info = ModelInfo("smol", "/m.gguf", ModelState.READY, n_ctx=2048, n_seq_max=4, restarts=1)
    status = DaemonStatus(
        pid=42,
        uptime_s=75.0,
        models=[ModelStatus(info)],
        tiers={"ram": TierUsage(bytes=1 << 20, quota=4 << 20), "ram_file": TierUsage(0, 0)},
        restarts=1,
        supervisors=[
            SupervisorStatus(
                "model_sup",
                [SupervisedChild("model.smol", 7, "ready", 1, "signal SIGKILL")],
            ),
            SupervisorStatus("cache_sup", error="busy"),
        ],
        endpoint="ipc:///x",
    )
    text = status_text(status)
    assert text.startswith("daemon  pid 42, up 1m 15s, 1 restart by its supervisors")
    assert "smol   ready" in text
    assert "model_sup   model.smol  7    ready  1         signal SIGKILL" in text
    assert "no answer: busy" in text
    assert "ram       1.0 MiB  4.0 MiB  25.0%" in text
    assert "ram_file  0 B      off" in text
    assert models_table([info]).splitlines()[1].split()[:5] == [
        "smol",
        "ready",
        "2048",
        "4",
        "default",
    ]
    assert "kv events" not in text
    published = msgspec.structs.replace(status, kv_events=KvEventsAddress("ipc:///x/kv.sock"))
    assert ", kv events ipc:///x/kv.sock" in status_text(published).splitlines()[0]
    chosen = msgspec.structs.replace(info, deterministic=True)
    assert models_table([chosen]).splitlines()[1].split()[4] == "deterministic"
    assert "numerics deterministic" in model_text(chosen)


def test_status_lists_each_models_idle_entries() -> None:
    info = ModelInfo("smol", "/m.gguf", ModelState.READY, n_ctx=2048, n_seq_max=4)
    worker = WorkerStatus(
        phase=WorkerPhase.IDLE,
        pending_len=0,
        queue_depth=0,
        active_sequences=0,
        free_sequences=4,
        sessions=0,
        kv_cells_used=700,
        ticks=9,
        idle_entries=(IdleEntry(0, 647, 600, 75.0, True), IdleEntry(2, 53, 53, 2.5)),
        idle_count=2,
        live_hits=3,
        idle_released=2,
        idle_moved=1,
        kv_cells_end=760,
    )
    snap = WorkerSnapshot("smol", 7, "i", 1, 0.0, worker)
    model = ModelStatus(info, worker=snap)
    status = DaemonStatus(pid=42, uptime_s=5.0, models=[model], tiers={}, restarts=0)
    text = status_text(status)
    assert "2 (700 tok)" in text
    assert "smol   0    647     600        1m 15s    yes" in text
    assert "smol   2    53      53         2.5s      no" in text
    one = model_status_text(model)
    assert "kv cells in use 700 (up to cell 760), live hits 3" in one
    assert "idle entries released 2, moved down 1" in one
    assert "smol   0    647" in one
    empty = WorkerStatus(WorkerPhase.IDLE, 0, 0, 0, 4, 0, 0, 0)
    assert "(none)" in idle_entries_text(
        [ModelStatus(info, worker=WorkerSnapshot("smol", 7, "i", 1, 0.0, empty))]
    )
