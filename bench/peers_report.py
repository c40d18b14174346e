"""bench/peers_bench.py's results: what a run measured, its verdicts and its tables.

Measurements are series of per-round values keyed ``scenario/system/variant``
(:class:`Results`). :func:`bars` judges SPEC's P1-P9 and P12 from them; a
ratio bar is judged on the per-round ratios (the systems ran in the same
round, interleaved), so noise shared by both sides cancels and noise that
does not widens the spread. A bar is "met" only when every round clears it,
"within noise" when it lies inside the rounds' spread. Nothing here touches
a process, a plot or a table (those: :mod:`bench.peers.render`), so the
judging is unit-tested (``tests/unit/test_peers_report.py``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.common import median, percentile
from bench.worker_bench_report import verdict

LLAMAD, SERVER, LCPP, LBENCH = "llamad", "llama-server", "llama-cpp-python", "llama-bench"
SIZES = (512, 1024, 2048)
P1_MS, P1_COLD_SPEEDUP, P1_SERVER_RATIO, P1_FLOOR_RATIO = 25.0, 200.0, 0.5, 1.5
P2_MS = 40.0
P3_RATIO, P4_RATIO, P5_RATIO = 1.0, 0.95, 0.95
P6_RATIO, P6_PREFIX_MS = 1.0, 10.0
P7_SHARE, P8_RATIO, P9_MB, P12_RATIO = 0.95, 1.5, 200.0, 0.5
# Issue 19's HTTP bars: P10 (warm TTFT through HTTP against llama-server's
# host-RAM cache hit through its HTTP), P11 (4-stream decode through HTTP), and
# what HTTP adds over the Client path (first token, ms; decode rate, ratio).
P10_RATIO, P11_RATIO, HTTP_FIRST_MS, HTTP_DECODE_RATIO = 0.5, 1.0, 1.0, 0.95
# SPEC P14: single-stream decode beside a CPU hog per core, llamad / llama-server,
# both at their defaults (bench/peers/contention.py).
P14_RATIO = 10.0
P14_ID = "P14"
# P14's thread configurations: (series name, what it is)
P14_CONFIGS = (
    ("default", "default threads (cores)"),
    ("1", "1 thread"),
)
CLIENT_VIA, HTTP_VIA = "client", "http"  # llamad's two ways in
HTTP_ID = "HTTP"
SOURCES = ("live", "ram", "ram_file", "disk", "remote", "computed")
INFO = "information"  # a row shown beside a bar, judged against none

# TTFT paths per system: (series variant, what it is)
TTFT_PATHS: dict[str, tuple[tuple[str, str], ...]] = {
    LLAMAD: (
        ("cold", "cold prefill"),
        ("repeat", "back-to-back repeat (its idle entry, P12)"),
        ("ram", "repeat after n_seq_max other requests (a tier, P1)"),
        ("restart", "first repeat after a daemon restart (P2)"),
    ),
    SERVER: (
        ("cold", "cold prefill"),
        ("repeat", "back-to-back repeat (live slot)"),
        ("ram-cache", "repeat after a filler, host-RAM prompt cache hit"),
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
    # P14: "system/config/phase/round" -> each token's arrival, seconds since sent
    timeline: dict[str, list[float]] = field(default_factory=dict)

    def add(self, value: float, *parts: object) -> None:
        self.series.setdefault(key(*parts), []).append(value)

    def get(self, *parts: object) -> list[float]:
        return self.series.get(key(*parts), [])


def results_data(results: Results) -> dict[str, Any]:
    """What a recorded run keeps of :class:`Results` beside its ``rounds`` and
    ``sizes`` (the parameters): every series, interval, part, setup line and skip."""
    return {
        "series": results.series,
        "itl_ms": results.itl_ms,
        "breakdown": results.breakdown,
        "setup": results.setup,
        "skipped": results.skipped,
        "timeline": results.timeline,
    }


def results_of(params: Mapping[str, Any], data: Mapping[str, Any]) -> Results:
    """:func:`results_data` read back."""
    return Results(
        rounds=int(params["rounds"]),
        sizes=tuple(int(n) for n in params["sizes"]),
        series={k: list(v) for k, v in data["series"].items()},
        itl_ms={k: list(v) for k, v in data["itl_ms"].items()},
        skipped=dict(data["skipped"]),
        breakdown={k: list(v) for k, v in data["breakdown"].items()},
        setup=dict(data["setup"]),
        # Records from before P14 have no timeline.
        timeline={k: list(v) for k, v in data.get("timeline", {}).items()},
    )


@dataclass(frozen=True)
class Bar:
    """One judged row of the bars table."""

    id: str
    what: str
    measured: str
    bar: str
    verdict: str
    size: int | None = None  # the prompt size a per-size row judges


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
    """P6, for information: median TTFT of agents 2-8 as a share of agent 1's."""
    return median(others_ms) / agent1_ms


def prefix_ms(ttft_ms: float, queue_ms: float, prefill_ms: float) -> float:
    """P6: the prefix's share of one agent's TTFT.

    ``ttft_ms`` is the client's (send to first token event); ``queue_ms`` the
    worker's wait for a free sequence (other agents' tails being prefilled:
    seven agents, ``n_seq_max`` sequences); ``prefill_ms`` the worker's time
    from the agent's resolved start to its first token's logits (its own tail
    prefilled, in batches shared with the other agents' tails). What is left
    is what reusing the prefix cost: ``restore_ms`` (keeping or sharing the
    prefix's live cells, or a lookup and restore, and any wait for another
    agent's prefill of it: ``wait_ms``) plus the request's way in and the
    token's way out (transport, front, admission, sampling, and a tick in
    progress when the request arrived, which no worker clock sees)."""
    return ttft_ms - queue_ms - prefill_ms


def prefix_share_ms(agents: Sequence[Mapping[str, float]]) -> float:
    """P6 in one round: the median over agents 2-8 of :func:`prefix_ms`, each
    agent's ``ttft_ms``, ``queue_ms`` and ``prefill_ms``."""
    if not agents:
        raise ValueError("no agents")
    return median([prefix_ms(a["ttft_ms"], a["queue_ms"], a["prefill_ms"]) for a in agents])


def live_slot_ratios(
    ours: Sequence[float],
    theirs: Sequence[float],
    same_slot: Sequence[float],
    cache_n: Sequence[float],
    n: int,
) -> tuple[list[float], list[int]]:
    """P12: per-round ratios of llamad's back-to-back repeat TTFT to
    llama-server's, and the rounds (1-based) whose server repeat was no
    live-slot hit: served by another slot than its first run's, or with fewer
    than ``n - 1`` prompt tokens reused (``timings.cache_n``; llama-server
    always evaluates a prompt's last token again). Those rounds compare with
    something else than P12's peer and are left out of the ratios."""
    ratios: list[float] = []
    bad: list[int] = []
    for i, (a, b, same, cached) in enumerate(
        zip(ours, theirs, same_slot, cache_n, strict=False), start=1
    ):
        if not same or cached < n - 1 or b <= 0:
            bad.append(i)
        else:
            ratios.append(a / b)
    return ratios, bad


def not_exact(computed: Sequence[float], tolerance: float = 0.0) -> int:
    """Rounds whose repeat computed more prompt tokens than ``tolerance`` (the
    cache did not supply the whole prompt)."""
    return sum(1 for c in computed if c > tolerance)


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


def _rounds(rounds: Sequence[int]) -> str:
    return ", ".join(str(r) for r in rounds)


def bars(results: Results) -> list[Bar]:
    """SPEC P1-P9 and P12 judged on this run (the largest prompt size measured)."""
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
        unless: str | None = None,
        size: int | None = None,
    ) -> None:
        """A judged row; ``unless`` (a reason) overrides the verdict: the
        measurement is not the one the bar is about, or misses a condition."""
        measured, v = _judge(vals, bar, at_least=at_least, missing=missing)
        if unless is not None:
            v = unless
        rows.append(Bar(id_, what, measured, bar_text, v, size))

    ram = r.get("ttft", LLAMAD, "ram", size)
    live = r.get("sources", LLAMAD, "ram", size, "live")
    served_live = sum(1 for x in live if x > 0)
    displaced = (
        None
        if not served_live
        else f"NOT MEASURED (served live in {served_live} of {len(live)} rounds: "
        "its idle entry was not displaced)"
    )
    row(
        "P1",
        f"warm TTFT from a tier (after n_seq_max other requests), ms{at}",
        ram,
        P1_MS,
        f"<= {P1_MS:g} ms",
        at_least=False,
        missing=_why(r, LLAMAD),
        unless=displaced,
    )
    row(
        "P1",
        f"llamad from a tier / llama-server host-RAM cache hit{at}",
        paired(ram, r.get("ttft", SERVER, "ram-cache", size)),
        P1_SERVER_RATIO,
        f"<= {P1_SERVER_RATIO:g}x",
        at_least=False,
        missing=_why(r, LLAMAD, SERVER),
        unless=displaced,
    )
    row(
        "P1",
        f"cold / warm from a tier (speed-up){at}",
        paired(r.get("ttft", LLAMAD, "cold", size), ram),
        P1_COLD_SPEEDUP,
        f">= {P1_COLD_SPEEDUP:g}x",
        at_least=True,
        missing=_why(r, LLAMAD),
        unless=displaced,
    )
    floor = floor_parts(r).get(FLOOR_TOTAL, [])
    row(
        "P1",
        f"warm from a tier / the floor (one copy of the row + one sample){at}",
        paired(r.breakdown.get(TOTAL, []), floor),
        P1_FLOOR_RATIO,
        f"<= {P1_FLOOR_RATIO:g}x",
        at_least=False,
        missing=_why(r, LLAMAD) if not ram else "the row's size was not found",
        unless=displaced,
    )
    restart = r.get("ttft", LLAMAD, "restart", size)
    cold_after = not_exact(r.get("sources", LLAMAD, "restart", size, "computed"), 1.0)
    row(
        "P2",
        f"first repeat after a restart (SIGTERM, default config), ms{at}",
        restart,
        P2_MS,
        f"exact, <= {P2_MS:g} ms",
        at_least=False,
        missing=_why(r, LLAMAD),
        unless=None
        if not cold_after
        else f"NOT MET (not exact in {cold_after} of {len(restart)} rounds)",
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
        "8 agents: agents 2-8 p50 TTFT, llamad / llama-server",
        paired(r.get("p6", LLAMAD, "others"), r.get("p6", SERVER, "others")),
        P6_RATIO,
        f"<= {P6_RATIO:g}x",
        at_least=False,
        missing=_why(r, LLAMAD, SERVER, "P6"),
    )
    row(
        "P6",
        "8 agents: the prefix's share of agents 2-8 TTFT (TTFT - queue - tail prefill), p50, ms",
        r.get("p6", LLAMAD, "prefix_ms"),
        P6_PREFIX_MS,
        f"<= {P6_PREFIX_MS:g} ms",
        at_least=False,
        missing=_why(r, LLAMAD, "P6"),
    )
    row(
        "P7",
        "chat back to back: reused / reusable prompt tokens, turns 2 on",
        r.get("p7", LLAMAD, "share"),
        P7_SHARE,
        f">= {P7_SHARE:.0%}",
        at_least=True,
        missing=_why(r, LLAMAD, "P7"),
    )
    beside = r.get("p7", LLAMAD, "share of prompt")
    rows.append(
        Bar(
            "P7",
            "chat back to back: reused / all prompt tokens, turns 2 on",
            spread(beside, ".3g"),
            "-",
            INFO if beside else f"not measured ({_why(r, LLAMAD, 'P7')})",
        )
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
    for n in r.sizes:
        p12, bad = live_slot_ratios(
            r.get("ttft", LLAMAD, "repeat", n),
            r.get("ttft", SERVER, "repeat", n),
            r.get("same-slot", SERVER, "repeat", n),
            r.get("cached", SERVER, "repeat", n),
            n,
        )
        row(
            "P12",
            f"back-to-back repeat of {n} tokens: llamad / llama-server live-slot hit",
            p12,
            P12_RATIO,
            f"<= {P12_RATIO:g}x",
            at_least=False,
            missing=_why(r, LLAMAD, SERVER),
            unless=None
            if not bad
            else f"NOT MEASURED (llama-server's repeat was no live-slot hit in round(s) "
            f"{_rounds(bad)})",
            size=n,
        )
    if any(k.startswith("http-") for k in r.series) or HTTP_ID in r.skipped:
        rows += http_bars(r)
    if has_p14(r):
        rows += p14_bars(r)
    if r.get("p9", LLAMAD, "gateway"):
        rows.append(
            Bar(
                "P9",
                "of it the HTTP gateway's process (RSS, counted in the row above), MB",
                spread(r.get("p9", LLAMAD, "gateway"), ".3g"),
                "-",
                INFO,
            )
        )
    return rows


def differences(a: Sequence[float], b: Sequence[float]) -> list[float]:
    """Per-round differences a - b of rounds both measured."""
    return [x - y for x, y in zip(a, b, strict=False)]


def not_warm(cached: Sequence[float], n: int) -> list[int]:
    """The rounds (1-based) whose repeat reused fewer than ``n - 1`` prompt tokens."""
    return [i for i, c in enumerate(cached, start=1) if c < n - 1]


def http_bars(results: Results) -> list[Bar]:
    """Issue 19's HTTP bars at the largest size (bench/peers/http_round.py):
    P10, P11, and HTTP's cost over llamad's Client path, every one paired by
    round (the two ways in ran in the same round, back to back)."""
    r = results
    n = max(r.sizes)
    at = "" if n == 2048 else f" (at {n} tokens; issue 19: 2048)"
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
        unless: str | None = None,
    ) -> None:
        measured, v = _judge(vals, bar, at_least=at_least, missing=missing)
        rows.append(Bar(id_, what, measured, bar_text, unless if unless and vals else v))

    ours = r.get("http-ttft", LLAMAD, HTTP_VIA, "ram", n)
    cold = not_warm(r.get("http-cached", LLAMAD, HTTP_VIA, "ram", n), n)
    # HTTP's usage does not say live from tier; the Client's repeat after the
    # same fillers in the same round does: served live, they displaced nothing.
    live = [
        i for i, x in enumerate(r.get("http-live", LLAMAD, CLIENT_VIA, "ram", n), start=1) if x > 0
    ]
    unless = None
    if cold:
        unless = f"NOT MEASURED (llamad's repeat was not warm in round(s) {_rounds(cold)})"
    elif live:
        unless = (
            f"NOT MEASURED (the Client's repeat after the same fillers was served live in "
            f"round(s) {_rounds(live)}: the idle entry was not displaced)"
        )
    row(
        "P10",
        f"warm TTFT through HTTP (streamed, client-observed): llamad's gateway / "
        f"llama-server's host-RAM cache hit through its HTTP{at}",
        paired(ours, r.get("http-ttft", SERVER, HTTP_VIA, "ram-cache", n)),
        P10_RATIO,
        f"<= {P10_RATIO:g}x",
        at_least=False,
        missing=_why(r, LLAMAD, SERVER, HTTP_ID),
        unless=unless,
    )
    row(
        "P11",
        "aggregate decode, 4 streams through HTTP: llamad's gateway / llama-server",
        paired(
            r.get("http-decode", LLAMAD, HTTP_VIA, 4), r.get("http-decode", SERVER, HTTP_VIA, 4)
        ),
        P11_RATIO,
        f">= {P11_RATIO:g}x",
        at_least=True,
        missing=_why(r, LLAMAD, SERVER, HTTP_ID),
    )
    row(
        HTTP_ID,
        f"first token, back-to-back repeats (median of each way's run): HTTP - Client, ms{at}",
        differences(
            r.get("http-run", LLAMAD, HTTP_VIA, n), r.get("http-run", LLAMAD, CLIENT_VIA, n)
        ),
        HTTP_FIRST_MS,
        f"<= {HTTP_FIRST_MS:g} ms",
        at_least=False,
        missing=_why(r, LLAMAD, HTTP_ID),
    )
    first = differences(
        r.get("http-ttft", LLAMAD, HTTP_VIA, "repeat", n),
        r.get("http-ttft", LLAMAD, CLIENT_VIA, "repeat", n),
    )
    rows.append(
        Bar(
            HTTP_ID,
            f"first token, the first repeat after the cold reply: HTTP - Client, ms{at}",
            spread(first, ".3g"),
            "-",
            INFO if first else f"not measured ({_why(r, LLAMAD, HTTP_ID)})",
        )
    )
    tier = differences(ours, r.get("http-ttft", LLAMAD, CLIENT_VIA, "ram", n))
    rows.append(
        Bar(
            HTTP_ID,
            f"first token, repeat from a tier: HTTP - Client, ms{at}",
            spread(tier, ".3g"),
            "-",
            INFO if tier else f"not measured ({_why(r, LLAMAD, HTTP_ID)})",
        )
    )
    for streams in (1, 4):
        row(
            HTTP_ID,
            f"decode rate, {streams} stream(s): HTTP / Client",
            paired(
                r.get("http-decode", LLAMAD, HTTP_VIA, streams),
                r.get("http-decode", LLAMAD, CLIENT_VIA, streams),
            ),
            HTTP_DECODE_RATIO,
            f">= {HTTP_DECODE_RATIO:g}x",
            at_least=True,
            missing=_why(r, LLAMAD, HTTP_ID),
        )
    return rows


# -- P14: decode beside a CPU hog per core -------------------------------------------------


def has_p14(results: Results) -> bool:
    """The run measured P14 (older records did not: they render as they were)."""
    return any(k.startswith("p14/") for k in results.series) or P14_ID in results.skipped


def p14_rates(results: Results, system: str, config: str, phase: str) -> list[float]:
    """Per-round decode rates (tok/s): tokens after the first over the seconds
    from the first token to the stream's end or its budget's."""
    tokens = results.get("p14", system, config, phase, "tokens")
    seconds = results.get("p14", system, config, phase, "seconds")
    return [t / s if s > 0 else 0.0 for t, s in zip(tokens, seconds, strict=False)]


def p14_ratios(results: Results, config: str) -> tuple[list[float], list[int]]:
    """Per-round llamad / llama-server decode rates beside the hogs, and the
    rounds (1-based) where llama-server decoded no token in its window: its
    rate there is taken as one token over that window, more than it did, so
    the round's ratio is a lower bound (never a division by zero)."""
    ours = p14_rates(results, LLAMAD, config, "hogs")
    tokens = results.get("p14", SERVER, config, "hogs", "tokens")
    seconds = results.get("p14", SERVER, config, "hogs", "seconds")
    ratios: list[float] = []
    bounded: list[int] = []
    for i, (a, t, s) in enumerate(zip(ours, tokens, seconds, strict=False), start=1):
        if s <= 0:
            continue
        if t <= 0:
            bounded.append(i)
        ratios.append(a / (max(t, 1.0) / s))
    return ratios, bounded


def p14_fraction(results: Results, system: str, config: str) -> list[float]:
    """Per round: the decode rate beside the hogs as a share of the same
    system's quiet rate in the same round."""
    return paired(
        p14_rates(results, system, config, "hogs"), p14_rates(results, system, config, "quiet")
    )


def p14_bars(results: Results) -> list[Bar]:
    """P14 at the defaults, judged; the 1-thread pair beside it, information."""
    r = results
    rows: list[Bar] = []
    for config, what in P14_CONFIGS:
        ratios, bounded = p14_ratios(r, config)
        if config == "default":
            measured, v = _judge(
                ratios, P14_RATIO, at_least=True, missing=_why(r, LLAMAD, SERVER, P14_ID)
            )
            bar = f">= {P14_RATIO:g}x"
        else:
            measured = spread(ratios, ".3g")
            v = INFO if ratios else f"not measured ({_why(r, LLAMAD, SERVER, P14_ID)})"
            bar = "-"
        if bounded:
            measured = (
                f">= {measured} (llama-server decoded no token in round(s) {_rounds(bounded)})"
            )
        rows.append(
            Bar(
                P14_ID,
                f"decode tok/s beside a CPU hog per core, llamad / llama-server, {what}",
                measured,
                bar,
                v,
            )
        )
    return rows


def window_rates(times: Sequence[float], end: float, width: float = 1.0) -> list[float]:
    """Tokens per second in consecutive ``width``-second windows from 0 to
    ``end`` (``times``: arrivals in seconds from the same origin); the last
    window, if shorter, is divided by its own width; a time on a boundary
    counts in the later window; times past ``end`` are left out."""
    if width <= 0:
        raise ValueError("width must be > 0")
    if end <= 0:
        return []
    n = math.ceil(end / width)
    counts = [0] * n
    for t in times:
        if 0 <= t <= end:
            counts[min(int(t // width), n - 1)] += 1
    last = end - (n - 1) * width
    return [c / (last if i == n - 1 else width) for i, c in enumerate(counts)]


TOTAL = "client TTFT (total)"
CLIENT = "client, transport and front (TTFT less the worker's times)"
QUEUE = "worker queue"
RESTORE = "cache lookup + load + unpack (worker restore_ms)"
WAIT = "of the restore, waiting for the row's save still in flight (worker wait_ms)"
PRIMER = "first token from the row's kept logits (worker prefill_ms)"
LOOKUP = "of the restore, the cache lookup (worker lookup_ms)"
LOAD = "of the restore, the row's validated read + unpack into the KV (worker load_ms)"
RESTORE_REST = "of the restore, the rest (restore_ms less lookup_ms and load_ms)"
COPY_FLOOR = "floor: copying the row's KV bytes once"
FLOOR_TOTAL = "floor total (the copy + the first token's sampling)"
COPY_PAST_CACHE = "information: the same copy, its stores past the cache (as in a worker)"
FLOOR_PAST_CACHE = "information: that copy + the first token's sampling"
TOTAL_PAST_CACHE = "client TTFT (total), against the copy past the cache"
"""The floor copies through the cache (glibc's default for its size on the
recording machine, where that is below the non-temporal threshold); a worker
stores its restore's copies past it (``llamad.model.worker_spec.NT_THRESHOLD``),
which can beat that floor. The same copy made as a worker makes it is shown
beside it, and the TTFT against it, so the bar's floor is never the only one."""


def floor_parts(results: Results) -> dict[str, list[float]]:
    """P1's warm path part by part, round by round, and its floor (SPEC P1):
    copying the row's KV bytes once plus one sample (the worker's own time
    from the restored start to the first token: ``prefill_ms``, which samples
    the row's kept logits where the row has them)."""
    parts = {k: list(v) for k, v in results.breakdown.items() if v}
    lookup, load = parts.get(LOOKUP, []), parts.get(LOAD, [])
    if lookup and load and parts.get(RESTORE):
        # What the restore's clock holds beyond its lookup and its load: the
        # admission, the live-KV search, the checkin, the truncate.
        parts[RESTORE_REST] = [
            r - a - b for r, a, b in zip(parts[RESTORE], lookup, load, strict=False)
        ]
    copy = parts.get(COPY_FLOOR, [])
    sample = parts.get(PRIMER, [])
    if copy and sample:
        parts[FLOOR_TOTAL] = [c + s for c, s in zip(copy, sample, strict=False)]
    past = parts.pop(COPY_PAST_CACHE, [])
    if past and sample:
        parts[COPY_PAST_CACHE] = past
        parts[FLOOR_PAST_CACHE] = [c + s for c, s in zip(past, sample, strict=False)]
    total, floor = parts.get(TOTAL, []), parts.get(FLOOR_TOTAL, [])
    if total and floor:
        # Last, after the past-cache rows (the breakdown's order).
        parts[GAP] = [t - f for t, f in zip(total, floor, strict=False)]
    return parts


GAP = "gap to the floor (TTFT less floor total)"

# The parts set against the floor, each round's part over that round's floor
# (issue 21): what one copy of the row plus one sample bounds from below.
AGAINST_FLOOR = (
    (TOTAL, FLOOR_TOTAL),
    (RESTORE, COPY_FLOOR),
    (LOAD, COPY_FLOOR),
    (LOOKUP, FLOOR_TOTAL),
    (RESTORE_REST, FLOOR_TOTAL),
    (PRIMER, FLOOR_TOTAL),
    (CLIENT, FLOOR_TOTAL),
)


def against_floor(results: Results) -> dict[str, tuple[str, list[float]]]:
    """Each part of the warm path over the floor it is compared with, round by
    round: the whole TTFT over the floor total, the restore and its load over
    the copy, the rest over the floor total. Empty for runs recorded before
    the worker reported its restore's parts (``load_ms``)."""
    parts = floor_parts(results)
    if not parts.get(LOAD):
        return {}
    out: dict[str, tuple[str, list[float]]] = {}
    for part, floor in AGAINST_FLOOR:
        values, base = parts.get(part, []), parts.get(floor, [])
        ratios = [v / b for v, b in zip(values, base, strict=False) if b > 0]
        if ratios:
            out[part] = (floor, ratios)
    total, past = parts.get(TOTAL, []), parts.get(FLOOR_PAST_CACHE, [])
    ratios = [v / b for v, b in zip(total, past, strict=False) if b > 0]
    if ratios:
        out[TOTAL_PAST_CACHE] = (FLOOR_PAST_CACHE, ratios)
    return out
