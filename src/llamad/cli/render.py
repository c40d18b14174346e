"""What the ``llamad`` command prints: tables, summaries, JSON and the load progress bar.

Pure functions of the client's result types (no sockets, no daemon), so the
layout is tested in ``tests/unit/cli`` and the commands only fetch and print.
Results go to stdout; progress and per-request summaries go to stderr, so
``llamad complete ... > reply.txt`` holds the reply alone.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TextIO

import msgspec

from llamad.front.wire import DaemonStatus, GcReport, ModelInfo, ModelStatus
from llamad.model.results import Completion, TokenSources, WorkerStatus

__all__ = [
    "ProgressBar",
    "completion_summary",
    "counters_text",
    "embedding_text",
    "gc_text",
    "human_bytes",
    "human_duration",
    "idle_entries_text",
    "model_status_text",
    "model_text",
    "models_table",
    "sources_text",
    "status_text",
    "table",
    "to_json",
    "turn_summary",
]


def to_json(value: Any) -> str:
    """``value`` (msgspec Structs, lists, dicts...) as indented JSON, one
    document and a newline. Bytes (cache keys) become hex strings, as a
    ``--parent-key`` argument takes them back."""
    plain = msgspec.to_builtins(value, builtin_types=(bytes,))
    return json.dumps(_hex_bytes(plain), indent=2, ensure_ascii=False) + "\n"


def _hex_bytes(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {k: _hex_bytes(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_hex_bytes(v) for v in value]
    return value


def human_bytes(n: int) -> str:
    """``n`` bytes for a person: ``"116.7 MiB"``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024.0:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024.0
    return f"{size:.1f} TiB"


def human_duration(seconds: float) -> str:
    """``3723.4`` → ``"1h 02m 03s"``; under a minute, ``"12.3s"``."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """An aligned text table (columns two spaces apart; ``None`` prints ``-``)."""
    cells = [[str(h) for h in headers]]
    cells += [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines) + "\n"


# -- models and status ---------------------------------------------------------------


def models_table(models: Sequence[ModelInfo]) -> str:
    """``llamad models``: one row per model the daemon knows."""
    if not models:
        return "no models (load one with `llamad load MODEL PATH`)\n"
    rows = [
        (
            m.model_id,
            m.state.value,
            m.n_ctx,
            m.n_seq_max,
            _numerics(m),
            m.restarts,
            m.pid,
            m.path + (f"  ({m.error})" if m.error else ""),
        )
        for m in sorted(models, key=lambda m: m.model_id)
    ]
    headers = ("MODEL", "STATE", "N_CTX", "SEQS", "NUMERICS", "RESTARTS", "PID", "PATH")
    return table(headers, rows)


def _numerics(info: ModelInfo) -> str:
    """``deterministic`` when the model runs with that option, ``default`` otherwise."""
    return "deterministic" if info.deterministic else "default"


def model_text(info: ModelInfo) -> str:
    """One model after ``llamad load``."""
    return (
        f"{info.model_id}: {info.state.value}, n_ctx {info.n_ctx}, n_seq_max {info.n_seq_max}, "
        f"numerics {_numerics(info)}, pid {info.pid if info.pid is not None else '-'}\n"
        f"  {info.path}\n"
    )


_WORKER_HEADERS = (
    "MODEL",
    "STATE",
    "SEQS",
    "QUEUED",
    "IDLE KV",
    "REQUESTS",
    "TOK/S",
    "LAST HIT",
    "RESTARTS",
)


def _idle_summary(s: WorkerStatus) -> str:
    """``2 (1300 tok)``: idle entries and the tokens they hold."""
    tokens = sum(e.tokens for e in s.idle_entries)
    return f"{s.idle_count} ({tokens} tok)" if s.idle_count else "0"


def _worker_row(model: ModelStatus) -> tuple[object, ...]:
    info, snap = model.info, model.worker
    if snap is None:
        return (info.model_id, info.state.value, None, None, None, None, None, None, info.restarts)
    s = snap.status
    hit = s.last_cache_hit.value if s.last_cache_hit is not None else None
    return (
        info.model_id,
        info.state.value if info.state.value != "ready" else s.phase.value,
        f"{s.active_sequences}/{s.active_sequences + s.free_sequences}",
        s.queue_depth,
        _idle_summary(s),
        snap.requests_total,
        f"{snap.generated_per_s:.1f}",
        hit,
        info.restarts,
    )


def idle_entries_text(models: Sequence[ModelStatus]) -> str:
    """The idle entries of every model's worker (SPEC M18): the KV finished
    requests left, which the next request sharing a prefix reuses at once."""
    rows = [
        (
            m.info.model_id,
            e.seq,
            e.tokens,
            e.cells,
            human_duration(e.age_s),
            "yes" if e.logits else "no",
        )
        for m in sorted(models, key=lambda m: m.info.model_id)
        if m.worker is not None
        for e in m.worker.status.idle_entries
    ]
    if not rows:
        return "(none)\n"
    return table(("MODEL", "SEQ", "TOKENS", "OWN CELLS", "IDLE FOR", "LOGITS"), rows)


def model_status_text(model: ModelStatus) -> str:
    """``llamad status MODEL``: the model and its worker's published snapshot."""
    out = [model_text(model.info)]
    out.append(table(_WORKER_HEADERS, [_worker_row(model)]))
    if model.worker is not None:
        s = model.worker.status
        out.append(
            f"kv cells in use {s.kv_cells_used} (up to cell {s.kv_cells_end}), "
            f"live hits {s.live_hits}, "
            f"first tokens from stored logits {s.stored_logits_hits}, "
            f"idle entries released {s.idle_released}, moved down {s.idle_moved}\n"
        )
        out.append("\nidle entries\n")
        out.append(idle_entries_text([model]))
    if model.info.last_exit:
        out.append(f"last exit: {model.info.last_exit}\n")
    return "".join(out)


def status_text(status: DaemonStatus, *, now: float | None = None) -> str:
    """``llamad status``: the daemon, its models' workers, its supervisors'
    children and the cache tiers, as tables."""
    now = time.time() if now is None else now
    out = [
        f"daemon  pid {status.pid}, up {human_duration(status.uptime_s)}, "
        f"{status.restarts} restart{'s' if status.restarts != 1 else ''} "
        f"by its supervisors, endpoint {status.endpoint or '-'}"
        + (f", http {status.http}" if status.http else "")
        + (f", kv events {status.kv_events.endpoint}" if status.kv_events else "")
        + "\n",
        "\nmodels\n",
    ]
    if status.models:
        out.append(
            table(
                _WORKER_HEADERS,
                (_worker_row(m) for m in sorted(status.models, key=lambda m: m.info.model_id)),
            )
        )
        out.append("\nidle entries (live KV kept for the next request)\n")
        out.append(idle_entries_text(status.models))
    else:
        out.append("(none)\n")
    out.append("\nprocesses\n")
    rows: list[tuple[object, ...]] = []
    for sup in status.supervisors:
        if sup.error is not None:
            rows.append((sup.name, None, None, None, None, f"no answer: {sup.error}"))
        for child in sup.children:
            rows.append(
                (sup.name, child.id, child.pid, child.state, child.restarts, child.last_exit)
            )
    out.append(table(("SUPERVISOR", "CHILD", "PID", "STATE", "RESTARTS", "LAST EXIT"), rows))
    out.append("\ncache tiers\n")
    tier_rows = [
        (
            name,
            human_bytes(t.bytes),
            human_bytes(t.quota) if t.quota else "off",
            f"{100.0 * t.bytes / t.quota:.1f}%" if t.quota else None,
        )
        for name, t in status.tiers.items()
    ]
    out.append(table(("TIER", "USED", "QUOTA", "USE"), tier_rows))
    return "".join(out)


def counters_text(counters: Mapping[str, int]) -> str:
    """``llamad counters``: every counter, sizes also in binary units, times in ms."""
    rows = []
    for name in sorted(counters):
        value = counters[name]
        if name.startswith("bytes_"):
            shown = f"{value}  ({human_bytes(value)})"
        elif name.endswith("_ns"):
            shown = f"{value}  ({value / 1e6:.3f} ms)"
        else:
            shown = str(value)
        rows.append((name, shown))
    return table(("COUNTER", "VALUE"), rows)


def gc_text(report: GcReport) -> str:
    return (
        f"gc: {report.evicted} rows evicted, {human_bytes(report.bytes_freed)} freed, "
        f"{report.missing} missing files dropped, {report.reaped} reservations reaped\n"
    )


def embedding_text(vector: Sequence[float], shown: int = 8) -> str:
    """An embedding for a person: its size, norm and first values."""
    norm = math.sqrt(sum(v * v for v in vector))
    head = ", ".join(f"{v:.4f}" for v in vector[:shown])
    more = ", ..." if len(vector) > shown else ""
    return f"{len(vector)} dimensions, norm {norm:.4f}: [{head}{more}]\n"


# -- requests ------------------------------------------------------------------------


def sources_text(sources: TokenSources) -> str:
    """``live 2047, computed 1``: where a prompt's tokens came from, the sources
    that supplied any (``none`` for an empty prompt)."""
    parts = [f"{name} {n}" for name, n in sources.as_dict().items() if n]
    return ", ".join(parts) if parts else "none"


def completion_summary(c: Completion) -> str:
    """One line after ``llamad complete`` (on stderr): how the prompt was served."""
    s = c.stats
    return (
        f"[{c.cache_hit_kind.value}: {s.prompt_tokens} prompt tokens "
        f"({sources_text(c.cache_delta.sources)}), {s.prefill_tokens} prefilled | "
        f"{s.completion_tokens} generated | restore {s.restore_ms:.1f} ms, "
        f"prefill {s.prefill_ms:.1f} ms, generation {s.generation_ms:.1f} ms | "
        f"finish {c.finish_reason.value}]\n"
    )


def turn_summary(turn: int, c: Completion) -> str:
    """One line after each ``llamad chat`` turn: the cache hit and the tokens it reused."""
    s = c.stats
    share = 100.0 * c.cache_delta.read / s.prompt_tokens if s.prompt_tokens else 0.0
    return (
        f"[turn {turn}: cache {c.cache_hit_kind.value}, {c.cache_delta.read} of "
        f"{s.prompt_tokens} prompt tokens reused ({share:.0f}%: "
        f"{sources_text(c.cache_delta.sources)}), {s.prefill_tokens} prefilled | "
        f"restore {s.restore_ms:.1f} ms, prefill {s.prefill_ms:.1f} ms | "
        f"{s.completion_tokens} tokens generated]\n"
    )


# -- load progress -------------------------------------------------------------------


class ProgressBar:
    """The ``load_model`` progress stream, drawn on ``out``.

    On a terminal, one line redrawn in place (``\\r``); elsewhere (a pipe, a
    log) a plain line at each tenth, so a log holds a dozen lines, not a
    hundred redraws.
    """

    def __init__(self, label: str, out: TextIO, *, terminal: bool, width: int = 30) -> None:
        self.label = label
        self.out = out
        self.terminal = terminal
        self.width = width
        self.fraction = 0.0
        self._tenths = -1

    def update(self, fraction: float) -> None:
        fraction = min(1.0, max(0.0, fraction))
        self.fraction = fraction
        if self.terminal:
            filled = round(fraction * self.width)
            bar = "#" * filled + "." * (self.width - filled)
            self.out.write(f"\r{self.label} [{bar}] {fraction * 100:5.1f}%")
        else:
            tenths = math.floor(fraction * 10 + 1e-9)
            if tenths <= self._tenths:
                return
            self._tenths = tenths
            self.out.write(f"{self.label}: {tenths * 10}%\n")
        self.out.flush()

    def finish(self, message: str) -> None:
        """End the bar with ``message`` on its own line."""
        if self.terminal:
            self.out.write("\r\x1b[K")
        self.out.write(message + "\n")
        self.out.flush()
