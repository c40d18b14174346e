"""bench/worker_bench.py's results: what one run measured, and the report with its verdicts.

The measurements (:mod:`bench.worker_bench`) fill :class:`Round` records; :func:`report`
turns them into the recorded tables and judges the bars (:func:`verdict`).
Nothing here touches a process, so the judging is unit-tested
(``tests/unit/test_worker_bench.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.common import median, table

if TYPE_CHECKING:
    from llamad.model.results import Completion
    from llamad.model.status_board import WorkerSnapshot

SIZES = (512, 1024, 2048)
TTFT_BAR_MS = 25.0  # warm 2048-token TTFT from ram, at most
STREAMS_BAR = 1.6  # 4 streams' aggregate decode / one stream, at least
PAIR_BAR = 0.9  # two busy workers' total / one worker alone, at least
HOGS_BAR = 0.25  # decode beside a hog per core / quiet, at least
P1_SPEEDUP = 200.0  # SPEC P1: warm ram TTFT >= 200x faster than cold (info)
P2_DISK_MS = 40.0  # SPEC P2: warm disk TTFT after a restart (info)
WARM_PATHS = ("ram", "ram again", "disk", "disk, pages dropped")
TTFT_PATHS = ("cold", *WARM_PATHS[:2], "cold (disk worker)", *WARM_PATHS[2:])
SCENARIOS = ("alone", "4 streams", "two workers", "hogs")


def verdict(values: Sequence[float], bar: float, *, at_least: bool) -> str:
    """Met only if every round clears the bar; "within noise" if the bar is
    inside the rounds' spread; else below (``at_least``) or above the bar."""
    lo, hi = min(values), max(values)
    if at_least:
        return "met" if lo >= bar else ("BELOW BAR" if hi < bar else "within noise")
    return "met" if hi <= bar else ("ABOVE BAR" if lo > bar else "within noise")


def steady_rate(arrivals: Sequence[Sequence[float]]) -> float:
    """Aggregate tokens per second while every stream decodes.

    ``arrivals``: each stream's token arrival times. The window runs from the
    latest first token (every stream has prefilled and decodes from then) to
    the earliest last token; each token arriving inside it counts once.
    """
    if not arrivals or any(len(a) < 2 for a in arrivals):
        raise ValueError("every stream needs at least two tokens")
    start = max(a[0] for a in arrivals)
    end = min(a[-1] for a in arrivals)
    if end <= start:
        raise ValueError("the streams never decoded at the same time")
    n = sum(1 for a in arrivals for t in a if start < t <= end)
    return n / (end - start)


def spread(values: Sequence[float], fmt: str) -> str:
    """``median (min-max)``."""
    return f"{median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


@dataclass
class Ttft:
    """One request's TTFT on the client, its stats, and its last decode's time."""

    ms: float
    result: Completion
    last_decode_ms: float  # 0.0: the request decoded nothing
    threads: int | None  # of that decode (None: not governed, or no decode)
    from_logits: bool = False
    """The first token was sampled from the logits the restored row keeps."""


@dataclass
class Decode:
    """One scenario's streams: token arrival times, finish reasons, and each
    worker's decode threads at the end (``None``: not governed)."""

    arrivals: list[list[float]]
    finish: list[str]
    threads: dict[str, int | None]

    @property
    def tok_s(self) -> float:
        return steady_rate(self.arrivals)


def threads_of(snap: WorkerSnapshot) -> int | None:
    """The thread count of the worker's last decode, if its threads are governed."""
    status = getattr(snap, "threads", None)  # absent before the M14 wiring
    return None if status is None else int(status.threads)


def first_token_source(runs: Sequence[Ttft]) -> str:
    """``yes``, ``no``, or in how many rounds the first token was sampled from
    the logits its restored row keeps (no decode before it)."""
    n = sum(t.from_logits for t in runs)
    return "yes" if n == len(runs) else "no" if n == 0 else f"{n}/{len(runs)} rounds"


@dataclass
class Round:
    ttft: dict[tuple[str, int], Ttft] = field(default_factory=dict)
    decode: dict[str, Decode] = field(default_factory=dict)


def report(rounds: list[Round], settings: str) -> str:
    def ms(path: str, n: int) -> list[float]:
        return [r.ttft[path, n].ms for r in rounds]

    def speedup(path: str, n: int) -> list[float]:
        cold = "cold" if path.startswith("ram") else "cold (disk worker)"
        return [r.ttft[cold, n].ms / r.ttft[path, n].ms for r in rounds]

    ttft_rows = [
        [
            path,
            *(spread(ms(path, n), ".1f" if path.startswith("cold") else ".2f") for n in SIZES),
            "-" if path.startswith("cold") else spread(speedup(path, SIZES[-1]), ".0f"),
        ]
        for path in TTFT_PATHS
    ]
    ttft_table = table(
        ["path", *(f"TTFT ms, {n} tokens" for n in SIZES), f"speed-up vs cold, {SIZES[-1]}"],
        ttft_rows,
    )

    def stat(path: str, n: int, name: str) -> float:
        return median([float(getattr(r.ttft[path, n].result.stats, name)) for r in rounds])

    where_rows = []
    for path in (*WARM_PATHS, "cold"):
        for n in SIZES:
            total = median(ms(path, n))
            parts = [stat(path, n, k) for k in ("queue_ms", "restore_ms", "prefill_ms")]
            runs = [r.ttft[path, n] for r in rounds]
            decodes = [t.last_decode_ms for t in runs if not t.from_logits]
            threads = sorted({str(t.threads) for t in runs if not t.from_logits})
            prefill = [float(t.result.stats.prefill_tokens) for t in runs]
            where_rows.append(
                [
                    path,
                    n,
                    f"{total:.2f}",
                    *(f"{p:.2f}" for p in parts),
                    f"{median(decodes):.2f}" if decodes else "-",
                    "/".join(threads).replace("None", "-") or "-",
                    f"{median(prefill):.0f}",
                    first_token_source(runs),
                    f"{total - sum(parts):.2f}",
                ]
            )
    where_table = table(
        [
            "path",
            "tokens",
            "TTFT ms",
            "queue_ms",
            "restore_ms",
            "prefill_ms",
            "of which the first token's decode, ms",
            "its threads",
            "tokens prefilled",
            "first token from stored logits",
            "rest, ms",
        ],
        where_rows,
    )

    def tok_s(s: str) -> list[float]:
        return [r.decode[s].tok_s for r in rounds]

    def seen(s: str) -> str:
        counts = sorted({f"{w} {t}" for r in rounds for w, t in r.decode[s].threads.items()})
        return ", ".join(counts).replace("None", "not governed")

    finishes = {s: sorted({f for r in rounds for f in r.decode[s].finish}) for s in SCENARIOS}
    decode_table = table(
        [
            "scenario",
            "decode tok/s, all streams (range)",
            "streams",
            "finish reasons",
            "threads at the end (worker: counts seen)",
        ],
        [
            [
                s,
                spread(tok_s(s), ".1f"),
                len(rounds[0].decode[s].arrivals),
                ", ".join(finishes[s]),
                seen(s),
            ]
            for s in SCENARIOS
        ],
    )

    def ratio(s: str) -> list[float]:
        return [r.decode[s].tok_s / r.decode["alone"].tok_s for r in rounds]

    ram2048 = ms("ram", SIZES[-1])
    bars = [
        (f"warm {SIZES[-1]}-token TTFT from ram, ms (bar <= {TTFT_BAR_MS:g})", ram2048,
         TTFT_BAR_MS, False, ".2f"),
        (f"4 streams / one stream (bar >= {STREAMS_BAR})", ratio("4 streams"), STREAMS_BAR,
         True, ".3f"),
        (f"two busy workers / one alone (bar >= {PAIR_BAR})", ratio("two workers"), PAIR_BAR,
         True, ".3f"),
        (f"beside a hog per core / quiet (bar >= {HOGS_BAR})", ratio("hogs"), HOGS_BAR, True,
         ".3f"),
    ]  # fmt: skip
    bar_rows = [
        [what, f"{median(v):{fmt}}", f"{min(v):{fmt}}-{max(v):{fmt}}", verdict(v, bar, at_least=up)]
        for what, v, bar, up, fmt in bars
    ]
    p1 = speedup("ram", SIZES[-1])
    disk = ms("disk, pages dropped", SIZES[-1])
    bar_rows += [
        [
            f"info, SPEC P1: ram speed-up vs cold at {SIZES[-1]} (>= {P1_SPEEDUP:g}x)",
            f"{median(p1):.0f}",
            f"{min(p1):.0f}-{max(p1):.0f}",
            verdict(p1, P1_SPEEDUP, at_least=True),
        ],
        [
            f"info, SPEC P2: disk, pages dropped, {SIZES[-1]} tokens, ms "
            f"(<= {P2_DISK_MS:g}; no restart here)",
            f"{median(disk):.2f}",
            f"{min(disk):.2f}-{max(disk):.2f}",
            verdict(disk, P2_DISK_MS, at_least=False),
        ],
    ]
    bar_table = table(["bar", "median", "spread (rounds)", "verdict"], bar_rows)
    return (
        f"{settings}\n\n### TTFT\n\n{ttft_table}\n\n"
        "Where the time goes (medians over rounds). `queue_ms`, `restore_ms` (lookup, read, "
        "unpack, truncate) and `prefill_ms` (until the first token's logits: on a warm "
        "path the held-back last prompt token decoded alone, or nothing when the row keeps "
        "the logits of the prompt's end and the first token is sampled from them, on the "
        "cold path the whole prefill) are the worker's own `stats`; the first token's decode "
        "is the last `llama_decode` of the request, read from the worker's status board "
        "(`-`: the request decoded nothing); rest = client "
        "TTFT less the three stats (sending, admission, sampling, delivering the event); each "
        "column is its own median over rounds, so a row need not add up exactly:\n\n"
        f"{where_table}\n\n### Decode\n\n{decode_table}\n\n### Bars\n\n{bar_table}\n"
    )


def governor_note(snaps: dict[str, WorkerSnapshot]) -> str:
    """What the M14 thread governor did in each worker, read from its status."""
    lines = []
    for name, snap in snaps.items():
        spin = getattr(getattr(snap, "spin", None), "value", "unknown")
        status = getattr(snap, "threads", None)
        if status is None:
            lines.append(f"`{name}` not governed (fixed n_threads; spin {spin})")
            continue
        lines.append(
            f"`{name}` governed (spin {spin}), {status.threads} threads at the end "
            f"(budget {status.budget}, ceiling {status.ceiling}), collapses "
            f"{status.collapses}, fallbacks {status.fallbacks}, probes {status.probes} "
            f"({status.probes_kept} kept), explorations {status.explorations} "
            f"({status.explorations_kept} kept)"
        )
    return "Thread governor (SPEC M14), over the whole run: " + "; ".join(lines) + "."
