"""bench/peers_bench.py's results: what a run measured, its verdicts and its tables.

Measurements are series of per-round values keyed ``scenario/system/variant``
(:class:`Results`). :func:`bars` judges SPEC's P1-P9 from them; a ratio bar
is judged on the per-round ratios (the systems ran in the same round,
interleaved), so noise shared by both sides cancels and noise that does not
widens the spread. Nothing here touches a process, a plot or a table (those:
:mod:`bench.peers.render`), so the judging is unit-tested
(``tests/unit/test_peers_report.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.common import median, percentile
from bench.worker_bench_report import verdict

LLAMAD, SERVER, LCPP, LBENCH = "llamad", "llama-server", "llama-cpp-python", "llama-bench"
SIZES = (512, 1024, 2048)
P1_MS, P1_COLD_SPEEDUP, P2_MS = 25.0, 200.0, 40.0
P3_RATIO, P4_RATIO, P5_RATIO = 1.0, 0.95, 0.95
P6_SHARE, P7_SHARE, P8_RATIO, P9_MB = 0.05, 0.95, 1.5, 200.0

# TTFT paths per system: (series variant, what it is)
TTFT_PATHS: dict[str, tuple[tuple[str, str], ...]] = {
    LLAMAD: (
        ("cold", "cold prefill"),
        ("ram", "warm, restored from ram"),
        ("disk-restart", "after a daemon restart, from disk"),
        ("disk-dropped", "the same, the row's pages dropped first"),
    ),
    SERVER: (
        ("cold", "cold prefill"),
        ("ram-cache", "warm, host-RAM prompt cache hit"),
        ("restart", "after a server restart"),
    ),
    LCPP: (
        ("cold", "cold prefill"),
        ("ram-cache", "warm, LlamaRAMCache hit"),
        ("disk-restart", "after a restart, LlamaDiskCache hit"),
    ),
}


def key(*parts: object) -> str:
    return "/".join(str(p) for p in parts)


@dataclass
class Results:
    """One run: per-round series, the samples behind the plots, and skip reasons."""

    rounds: int
    sizes: tuple[int, ...]
    series: dict[str, list[float]] = field(default_factory=dict)
    itl_ms: dict[str, list[float]] = field(default_factory=dict)  # "saves"/"no saves"
    skipped: dict[str, str] = field(default_factory=dict)  # system or scenario -> why
    breakdown: dict[str, list[float]] = field(default_factory=dict)  # warm path part -> ms
    setup: dict[str, str] = field(default_factory=dict)

    def add(self, value: float, *parts: object) -> None:
        self.series.setdefault(key(*parts), []).append(value)

    def get(self, *parts: object) -> list[float]:
        return self.series.get(key(*parts), [])


@dataclass(frozen=True)
class Bar:
    """One judged row of the bars table."""

    id: str
    what: str
    measured: str
    bar: str
    verdict: str


def spread(values: Sequence[float], fmt: str = ".1f") -> str:
    """``median (min-max)``, or the value alone for one round."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:{fmt}}"
    return f"{median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def paired(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round ratios a/b of rounds both measured (a zero denominator skipped)."""
    return [x / y for x, y in zip(a, b, strict=False) if y]


def p50_ratio(agent1_ms: float, others_ms: Sequence[float]) -> float:
    """P6: median TTFT of agents 2-8 as a share of agent 1's."""
    return median(others_ms) / agent1_ms


def reuse_share(of: Sequence[int], reused: Sequence[int]) -> float:
    """P7: tokens reused over ``of`` (each turn's prompt tokens, or those it
    could have reused), summed over turns 2 on; a turn's reuse counts at most
    its ``of``."""
    total = sum(of)
    if total <= 0:
        raise ValueError("nothing to reuse")
    return sum(min(r, p) for r, p in zip(reused, of, strict=True)) / total


def intervals_ms(arrivals: Sequence[float]) -> list[float]:
    """Inter-token latencies (ms) of one stream's arrival times (seconds)."""
    return [(b - a) * 1e3 for a, b in itertools.pairwise(arrivals)]


def itl_p(itl: Sequence[float], q: float) -> float:
    return percentile(itl, q)


def _judge(values: Sequence[float], bar: float, *, at_least: bool, missing: str) -> tuple[str, str]:
    if not values:
        return "-", f"not measured ({missing})"
    return spread(values, ".3g"), verdict(values, bar, at_least=at_least)


def _why(results: Results, *names: str) -> str:
    for n in names:
        if n in results.skipped:
            return f"{n}: {results.skipped[n]}"
    return "not in this run"


def bars(results: Results) -> list[Bar]:
    """SPEC P1-P9 judged on this run (the largest prompt size measured)."""
    r = results
    size = max(r.sizes)
    at = "" if size == 2048 else f" (at {size} tokens; SPEC: 2048)"
    rows: list[Bar] = []

    def row(
        id_: str,
        what: str,
        vals: Sequence[float],
        bar: float,
        bar_text: str,
        *,
        at_least: bool,
        missing: str,
    ) -> None:
        measured, v = _judge(vals, bar, at_least=at_least, missing=missing)
        rows.append(Bar(id_, what, measured, bar_text, v))

    ram = r.get("ttft", LLAMAD, "ram", size)
    row(
        "P1",
        f"warm TTFT from ram, ms{at}",
        ram,
        P1_MS,
        f"<= {P1_MS:g} ms",
        at_least=False,
        missing=_why(r, LLAMAD),
    )
    row(
        "P1",
        f"llamad ram / llama-server RAM-cache hit{at}",
        paired(ram, r.get("ttft", SERVER, "ram-cache", size)),
        1.0,
        "< 1.0x",
        at_least=False,
        missing=_why(r, LLAMAD, SERVER),
    )
    row(
        "P1",
        f"cold / warm ram TTFT (speed-up){at}",
        paired(r.get("ttft", LLAMAD, "cold", size), ram),
        P1_COLD_SPEEDUP,
        f">= {P1_COLD_SPEEDUP:g}x",
        at_least=True,
        missing=_why(r, LLAMAD),
    )
    row(
        "P2",
        f"TTFT after a daemon restart, from disk, ms{at}",
        r.get("ttft", LLAMAD, "disk-restart", size),
        P2_MS,
        f"<= {P2_MS:g} ms",
        at_least=False,
        missing=_why(r, LLAMAD),
    )
    row(
        "P3",
        "aggregate decode, 4 streams: llamad / llama-server",
        paired(r.get("decode", LLAMAD, 4), r.get("decode", SERVER, 4)),
        P3_RATIO,
        f">= {P3_RATIO:g}x",
        at_least=True,
        missing=_why(r, LLAMAD, SERVER),
    )
    row(
        "P4",
        "single-stream decode: llamad / llama-server",
        paired(r.get("decode", LLAMAD, 1), r.get("decode", SERVER, 1)),
        P4_RATIO,
        f">= {P4_RATIO:g}x",
        at_least=True,
        missing=_why(r, LLAMAD, SERVER),
    )
    row(
        "P5",
        f"cold prefill tok/s: llamad / llama-bench pp{at}",
        paired(r.get("prefill", LLAMAD, size), r.get("prefill", LBENCH, size)),
        P5_RATIO,
        f">= {P5_RATIO:g}x",
        at_least=True,
        missing=_why(r, LLAMAD, LBENCH),
    )
    row(
        "P6",
        "8 agents: p50 TTFT of agents 2-8 / agent 1",
        r.get("p6", LLAMAD, "share"),
        P6_SHARE,
        f"<= {P6_SHARE:.0%}",
        at_least=False,
        missing=_why(r, LLAMAD, "P6"),
    )
    row(
        "P7",
        "chat: reused / reusable prompt tokens, turns 2 on",
        r.get("p7", LLAMAD, "share"),
        P7_SHARE,
        f">= {P7_SHARE:.0%}",
        at_least=True,
        missing=_why(r, LLAMAD, "P7"),
    )
    fired = r.get("p8", LLAMAD, "saves", "saves_continued")
    p8 = paired(r.get("p8", LLAMAD, "saves", "p99"), r.get("p8", LLAMAD, "no saves", "p99"))
    row(
        "P8",
        "p99 inter-token latency, saves firing / saves off",
        p8 if fired and min(fired) > 0 else [],
        P8_RATIO,
        f"<= {P8_RATIO:g}x",
        at_least=False,
        missing=_why(r, LLAMAD, "P8") if not p8 else "no continued save fired in a round",
    )
    row(
        "P9",
        "idle RSS of all llamad processes less weights and KV, MB",
        r.get("p9", LLAMAD, "mb"),
        P9_MB,
        f"<= {P9_MB:g} MB",
        at_least=False,
        missing=_why(r, LLAMAD, "P9"),
    )
    return rows


TOTAL = "client TTFT (total)"
CLIENT = "client, transport and front (TTFT less the worker's times)"
QUEUE = "worker queue"
RESTORE = "cache lookup + load + unpack (worker restore_ms)"
PRIMER = "primer decode to the first token (worker prefill_ms)"
COPY_FLOOR = "floor: copying the row's KV bytes once"
STEP_FLOOR = "floor: one decode step (1 / single-stream decode rate)"


def floor_parts(results: Results) -> dict[str, list[float]]:
    """The warm path's parts plus the physical floor, round by round: copying the
    row's KV bytes once and one decode step (from llamad's single-stream rate)."""
    parts = {k: list(v) for k, v in results.breakdown.items() if v}
    step = [1e3 / rate for rate in results.get("decode", LLAMAD, 1) if rate > 0]
    copy = parts.get(COPY_FLOOR, [])
    if step:
        parts[STEP_FLOOR] = step
    if copy and step:
        parts["floor total"] = [c + s for c, s in zip(copy, step, strict=False)]
        total = parts.get(TOTAL, [])
        if total:
            parts["gap to the floor (TTFT less floor total)"] = [
                t - f for t, f in zip(total, parts["floor total"], strict=False)
            ]
    return parts
