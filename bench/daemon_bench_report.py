"""bench/daemon_bench.py's results: what one run measured, the tables, and the verdicts.

The measurements (:mod:`bench.daemon_bench`) fill :class:`Round` records of
:class:`Measure`; :func:`report` turns them into the recorded tables and
judges the SPEC bars (P1, P2, P6). Nothing here touches a process, so the
judging is unit-tested (``tests/unit/test_daemon_bench_report.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from bench.common import median, percentile, table
from bench.worker_bench_report import spread, verdict

if TYPE_CHECKING:
    from llamad.model.results import Completion
    from llamad.model.status_board import WorkerSnapshot

SIZES = (512, 1024, 2048)
RAM_BAR_MS = 25.0  # SPEC P1: warm 2048-token TTFT from ram, at most
DISK_BAR_MS = 40.0  # SPEC P2: the same after a full daemon restart, from disk
SPEEDUP_BAR = 200.0  # SPEC P1/P2: each at least this many times faster than cold
AGENTS_SHARE_BAR = 0.05  # SPEC P6: agents 2-8 p50 TTFT / agent 1's, at most
AGENTS = 8
PREFIX_TOKENS = 1024
TAIL_TOKENS = 32

COLD, RAM, DISK_COLD, DISK = "cold", "ram", "cold (disk model)", "disk after restart"
PATHS = (COLD, RAM, DISK_COLD, DISK)
WARM_OF = {RAM: COLD, DISK: DISK_COLD}  # a warm path -> the cold run of its prompt
EXACT, PARTIAL = "exact", "partial"

# Stats fields every worker of issue 8 reports; any other field a newer
# worker adds is shown as it comes (see Measure.extra).
KNOWN_STATS = frozenset(
    {
        "prompt_tokens",
        "completion_tokens",
        "prefill_tokens",
        "queue_ms",
        "restore_ms",
        "prefill_ms",
        "generation_ms",
    }
)


@dataclass(frozen=True)
class Measure:
    """One request: the client's TTFT and the worker's own account of it."""

    ttft_ms: float
    hit: str  # cache_hit_kind
    queue_ms: float
    restore_ms: float
    prefill_ms: float
    prefill_tokens: int
    prompt_tokens: int
    extra: tuple[tuple[str, object], ...] = ()

    @property
    def worker_ms(self) -> float:
        """The worker's time before the first token: queue, restore, prefill."""
        return self.queue_ms + self.restore_ms + self.prefill_ms

    @property
    def transport_ms(self) -> float:
        """What the worker's stats do not account for: the request's way from
        the client to the worker, admission, sampling, and the token event's
        way back."""
        return self.ttft_ms - self.worker_ms

    @property
    def stored_logits(self) -> bool:
        """Whether the first token came from logits stored with the row: an
        exact hit that decoded nothing (without them the held-back last
        prompt token is decoded alone, one prefilled token)."""
        return self.hit == EXACT and self.prefill_tokens == 0


def measure(ttft_ms: float, result: Completion) -> Measure:
    """A :class:`Measure` from the client's TTFT and the request's Completion."""
    stats = msgspec.structs.asdict(result.stats)
    extra = tuple(sorted((k, v) for k, v in stats.items() if k not in KNOWN_STATS))
    return Measure(
        ttft_ms=ttft_ms,
        hit=str(result.cache_hit_kind.value),
        queue_ms=float(stats["queue_ms"]),
        restore_ms=float(stats["restore_ms"]),
        prefill_ms=float(stats["prefill_ms"]),
        prefill_tokens=int(stats["prefill_tokens"]),
        prompt_tokens=int(stats["prompt_tokens"]),
        extra=extra,
    )


@dataclass
class Agents:
    """P6 in one round: agent 1 alone on a fresh prefix, then agents 2-8 at once."""

    first: Measure
    others: list[Measure]

    @property
    def p50_ms(self) -> float:
        return percentile([m.ttft_ms for m in self.others], 50)

    @property
    def p99_ms(self) -> float:
        return percentile([m.ttft_ms for m in self.others], 99)

    @property
    def tail_share(self) -> float:
        """Tokens agents 2-8 prefilled, all together, per token agent 1 prefilled."""
        return sum(m.prefill_tokens for m in self.others) / max(1, self.first.prefill_tokens)

    @property
    def share(self) -> float:
        """Agents 2-8 p50 TTFT as a share of agent 1's (the P6 ratio)."""
        return self.p50_ms / self.first.ttft_ms


@dataclass
class Round:
    ttft: dict[tuple[str, int], Measure] = field(default_factory=dict)
    agents: Agents | None = None


def judge(
    values: Sequence[float], bar: float, *, at_least: bool, hits: Iterable[str], expected: str
) -> str:
    """:func:`~bench.worker_bench_report.verdict`, unless a request the bar is
    about was not the hit it is meant to measure (a cold "warm" request
    measures nothing of the warm path): then "NOT MEASURED" with the kinds seen."""
    wrong = sorted({h for h in hits if h != expected})
    if wrong:
        return f"NOT MEASURED ({', '.join(wrong)} hit, not {expected})"
    return verdict(values, bar, at_least=at_least)


def _yes_no(values: Iterable[bool]) -> str:
    seen = set(values)
    return "mixed" if len(seen) > 1 else ("yes" if seen == {True} else "no")


def _extra(ms: Sequence[Measure]) -> str:
    """Stats fields a newer worker reports beyond :data:`KNOWN_STATS`: each
    field with the values seen."""
    names = sorted({k for m in ms for k, _ in m.extra})
    parts = []
    for name in names:
        seen = sorted({str(v) for m in ms for k, v in m.extra if k == name})
        parts.append(f"{name}={'/'.join(seen)}")
    return ", ".join(parts) or "-"


def report(rounds: list[Round], settings: str) -> str:
    """The recorded body: TTFT, where the time goes, P6, and the bars."""

    def runs(path: str, n: int) -> list[Measure]:
        return [r.ttft[path, n] for r in rounds]

    def ms(path: str, n: int) -> list[float]:
        return [m.ttft_ms for m in runs(path, n)]

    def speedup(path: str, n: int) -> list[float]:
        return [r.ttft[WARM_OF[path], n].ttft_ms / r.ttft[path, n].ttft_ms for r in rounds]

    last = SIZES[-1]
    ttft_table = table(
        ["path", *(f"TTFT ms, {n} tokens" for n in SIZES), f"speed-up vs its cold, {last}"],
        [
            [
                path,
                *(spread(ms(path, n), ".1f" if path in WARM_OF else ".0f") for n in SIZES),
                spread(speedup(path, last), ".0f") if path in WARM_OF else "-",
            ]
            for path in PATHS
        ],
    )
    where_rows = []
    for path in (RAM, DISK, COLD, DISK_COLD):
        for n in SIZES:
            ms_ = runs(path, n)
            where_rows.append(
                [
                    path,
                    n,
                    f"{median([m.ttft_ms for m in ms_]):.2f}",
                    "/".join(sorted({m.hit for m in ms_})),
                    f"{median([m.queue_ms for m in ms_]):.2f}",
                    spread([m.restore_ms for m in ms_], ".2f"),
                    spread([m.prefill_ms for m in ms_], ".2f"),
                    f"{median([float(m.prefill_tokens) for m in ms_]):.0f}",
                    _yes_no(m.stored_logits for m in ms_),
                    spread([m.transport_ms for m in ms_], ".2f"),
                    _extra(ms_),
                ]
            )
    where_table = table(
        [
            "path",
            "tokens",
            "TTFT ms",
            "cache_hit_kind",
            "queue_ms",
            "restore_ms",
            "prefill_ms",
            "tokens prefilled",
            "first token from stored logits",
            "client TTFT - worker, ms",
            "other worker stats",
        ],
        where_rows,
    )
    body = (
        f"{settings}\n\n### TTFT (SPEC P1, P2)\n\n{ttft_table}\n\n"
        "Where the time goes (medians over rounds; restore and prefill: median (min-max)). "
        "`queue_ms`, `restore_ms` and `prefill_ms` are the worker's own `stats` "
        "(`prefill_ms`: until the first token's logits; on a warm path without stored "
        "logits, the held-back last prompt token decoded alone); first token from stored "
        "logits: an exact hit with nothing prefilled. The last but one column is each "
        "request's client TTFT less those three, median (min-max): the request's way from "
        "the client to the worker (the route is cached: one hop, the front not involved), "
        "any wait for a tick in progress before the worker's loop reads it (its queue_ms "
        "starts there), sampling and the token event's way back:\n\n"
        f"{where_table}\n"
    )
    bars: list[tuple[str, list[float], str, str]] = [
        (
            f"P1: warm {last}-token TTFT from ram, ms (<= {RAM_BAR_MS:g})",
            ms(RAM, last),
            judge(ms(RAM, last), RAM_BAR_MS, at_least=False, hits=_hits(runs(RAM, last)),
                  expected=EXACT),
            ".2f",
        ),
        (
            f"P1: ram speed-up vs cold, {last} tokens (>= {SPEEDUP_BAR:g}x)",
            speedup(RAM, last),
            judge(speedup(RAM, last), SPEEDUP_BAR, at_least=True, hits=_hits(runs(RAM, last)),
                  expected=EXACT),
            ".0f",
        ),
        (
            f"P2: warm {last}-token TTFT after a restart, from disk, ms (<= {DISK_BAR_MS:g})",
            ms(DISK, last),
            judge(ms(DISK, last), DISK_BAR_MS, at_least=False, hits=_hits(runs(DISK, last)),
                  expected=EXACT),
            ".2f",
        ),
        (
            f"P2: disk speed-up vs cold, {last} tokens (>= {SPEEDUP_BAR:g}x)",
            speedup(DISK, last),
            judge(speedup(DISK, last), SPEEDUP_BAR, at_least=True,
                  hits=_hits(runs(DISK, last)), expected=EXACT),
            ".0f",
        ),
    ]  # fmt: skip
    agents = [r.agents for r in rounds if r.agents is not None]
    if agents:
        body += "\n" + agents_section(agents)
        shares = [a.share for a in agents]
        bars.append(
            (
                f"P6: agents 2-{AGENTS} p50 TTFT / agent 1's (<= {AGENTS_SHARE_BAR:g})",
                shares,
                judge(shares, AGENTS_SHARE_BAR, at_least=False,
                      hits=[m.hit for a in agents for m in a.others], expected=PARTIAL),
                ".4f",
            )
        )  # fmt: skip
    bar_table = table(
        ["bar", "median", "spread (rounds, min-max)", "verdict"],
        [
            [what, f"{median(v):{fmt}}", f"{min(v):{fmt}}-{max(v):{fmt}}", said]
            for what, v, said, fmt in bars
        ],
    )
    note = (
        "Verdicts: met only if every round clears the bar; within noise if the bar lies "
        "inside the rounds' spread; NOT MEASURED if a request the bar is about was not the "
        "hit it measures (exact for P1/P2, partial for agents 2-8)."
    )
    return f"{body}\n### Bars\n\n{bar_table}\n\n{note}\n"


def _hits(ms: Iterable[Measure]) -> list[str]:
    return [m.hit for m in ms]


def agents_section(agents: list[Agents]) -> str:
    """P6: agent 1's TTFT, agents 2-8 p50/p99 per round, and the worker's stats."""
    firsts = [a.first.ttft_ms for a in agents]
    others = [m for a in agents for m in a.others]
    pooled = [m.ttft_ms for m in others]
    rows = [
        ["agent 1, TTFT ms", spread(firsts, ".0f")],
        ["agent 1, cache_hit_kind / tokens prefilled",
         f"{'/'.join(sorted({a.first.hit for a in agents}))} / "
         f"{median([float(a.first.prefill_tokens) for a in agents]):.0f}"],
        [f"agents 2-{AGENTS}, p50 TTFT ms (per round)", spread([a.p50_ms for a in agents], ".1f")],
        [f"agents 2-{AGENTS}, p99 TTFT ms (per round)", spread([a.p99_ms for a in agents], ".1f")],
        [f"agents 2-{AGENTS}, all rounds pooled: p10 / p50 / p90 / p99 TTFT ms",
         " / ".join(f"{percentile(pooled, q):.1f}" for q in (10, 50, 90, 99))],
        [f"agents 2-{AGENTS}, p50 / agent 1 (per round)", spread([a.share for a in agents], ".4f")],
        [f"agents 2-{AGENTS}, cache_hit_kind", "/".join(sorted({m.hit for m in others}))],
        [f"agents 2-{AGENTS}, restore_ms / prefill_ms / queue_ms (medians)",
         f"{median([m.restore_ms for m in others]):.2f} / "
         f"{median([m.prefill_ms for m in others]):.2f} / "
         f"{median([m.queue_ms for m in others]):.2f}"],
        [f"agents 2-{AGENTS}, tokens prefilled (median)",
         f"{median([float(m.prefill_tokens) for m in others]):.0f}"],
        [f"agents 2-{AGENTS}, tokens prefilled together / agent 1's (per round; about the "
         "least their p50 share can be while their tails prefill in the same batches)",
         spread([a.tail_share for a in agents], ".4f")],
        [f"agents 2-{AGENTS}, client TTFT - worker, ms (median; includes waiting for the "
         "tick in progress before the worker reads the request)",
         f"{median([m.transport_ms for m in others]):.2f}"],
    ]  # fmt: skip
    return (
        f"### {AGENTS} agents sharing a {PREFIX_TOKENS}-token prefix (SPEC P6)\n\n"
        + table(["", "median (min-max over rounds)"], rows)
        + "\n"
    )


def logits_note(snaps: Mapping[str, WorkerSnapshot]) -> str:
    """The workers' own count of first tokens sampled from logits kept with a
    row, since the last start (a worker that does not count them says so)."""
    parts = []
    for name, snap in snaps.items():
        n = getattr(snap.status, "stored_logits_hits", None)
        parts.append(f"`{name}` {'not reported' if n is None else n}")
    return (
        "First tokens sampled from logits stored with the row, by the workers' own count "
        f"(`stored_logits_hits`, the last daemon start only): {', '.join(parts)}."
    )
