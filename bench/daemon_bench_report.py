"""bench/daemon_bench.py's results: what one run measured, the tables, and the verdicts.

The measurements (:mod:`bench.daemon_bench`) fill :class:`Round` records of
:class:`Measure`; :func:`report` turns them into the recorded tables and
judges the SPEC bars it can judge alone (P1's TTFT and speed-up, P2, P6's
prefix share; the bars against llama-server are bench/peers_bench.py's).
:func:`render` does the same from a recorded JSON (``daemon-<date>.json``):
:func:`round_data` is one round as recorded (every request's client TTFT
and the worker's own account of it), :func:`round_of` reads it back.
Nothing here touches a process, so the judging is unit-tested
(``tests/unit/test_daemon_bench_report.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from bench.common import median, percentile, table
from bench.peers_report import prefix_ms
from bench.worker_bench_report import governor_note, spread, verdict

if TYPE_CHECKING:
    from llamad.model.results import Completion
    from llamad.model.status_board import WorkerSnapshot

SIZES = (512, 1024, 2048)
TIER_BAR_MS = 25.0  # SPEC P1: warm 2048-token TTFT from a tier (ram), at most
RESTART_BAR_MS = 40.0  # SPEC P2: the first repeat after a full daemon restart, at most
SPEEDUP_BAR = 200.0  # SPEC P1: at least this many times faster than cold
PREFIX_BAR_MS = 10.0  # SPEC P6: the prefix's share of agents 2-8 TTFT, at most
AGENTS = 8
PREFIX_TOKENS = 1024
TAIL_TOKENS = 32

COLD = "cold"
REPEAT = "repeat, back to back"
TIER = "repeat after 8 other requests"
RESTART = "first repeat after a restart"
PATHS = (COLD, REPEAT, TIER, RESTART)
WARM_OF = {REPEAT: COLD, TIER: COLD, RESTART: COLD}  # a warm path -> its prompt's cold run
EXACT, PARTIAL = "exact", "partial"
SOURCES = ("live", "ram", "ram_file", "disk", "remote", "computed")

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
        "wait_ms",
        # Parts of restore_ms (issue 21), broken down by the peers report.
        "lookup_ms",
        "load_ms",
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
    wait_ms: float = 0.0
    sources: tuple[tuple[str, int], ...] = ()  # cache_delta.sources, the sources used

    def source(self, name: str) -> int:
        """Prompt tokens from ``name`` (live, ram, ram_file, disk, remote, computed)."""
        return dict(self.sources).get(name, 0)

    @property
    def where(self) -> str:
        """``live 2048`` or ``ram 2047 + computed 1``: where its prompt came from."""
        return " + ".join(f"{k} {v}" for k, v in self.sources if v) or "-"

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
    got = msgspec.structs.asdict(result.cache_delta.sources)
    return Measure(
        ttft_ms=ttft_ms,
        hit=str(result.cache_hit_kind.value),
        queue_ms=float(stats["queue_ms"]),
        restore_ms=float(stats["restore_ms"]),
        prefill_ms=float(stats["prefill_ms"]),
        prefill_tokens=int(stats["prefill_tokens"]),
        prompt_tokens=int(stats["prompt_tokens"]),
        extra=extra,
        wait_ms=float(stats.get("wait_ms", 0.0)),
        sources=tuple((k, int(got[k])) for k in SOURCES if k in got),
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
        """Agents 2-8 p50 TTFT as a share of agent 1's (information: SPEC P6's
        bars are the ratio to llama-server's and the prefix's share)."""
        return self.p50_ms / self.first.ttft_ms

    @property
    def prefix_ms(self) -> float:
        """SPEC P6: the prefix's share of agents 2-8 TTFT, the median over the
        agents of TTFT less ``queue_ms`` and ``prefill_ms``
        (:func:`bench.peers_report.prefix_ms` says what each term is)."""
        return median([prefix_ms(m.ttft_ms, m.queue_ms, m.prefill_ms) for m in self.others])


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


def not_exact(ms: Iterable[Measure]) -> int:
    """Requests the cache did not supply whole: a token computed beyond the
    held-back last one (decoded alone when the row keeps no logits)."""
    return sum(1 for m in ms if m.source("computed") > 1)


def report(rounds: list[Round], settings: str) -> str:
    """The recorded body: TTFT, where the time goes and where the tokens came
    from, P6, and the bars."""

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
    for path in (REPEAT, TIER, RESTART, COLD):
        for n in SIZES:
            ms_ = runs(path, n)
            where_rows.append(
                [
                    path,
                    n,
                    f"{median([m.ttft_ms for m in ms_]):.2f}",
                    "/".join(sorted({m.hit for m in ms_})),
                    "; ".join(sorted({m.where for m in ms_})),
                    f"{median([m.queue_ms for m in ms_]):.2f}",
                    spread([m.restore_ms for m in ms_], ".2f"),
                    spread([m.wait_ms for m in ms_], ".2f"),
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
            "prompt tokens from (cache_delta.sources, each round's)",
            "queue_ms",
            "restore_ms",
            "of it wait_ms",
            "prefill_ms",
            "tokens prefilled",
            "first token from stored logits",
            "client TTFT - worker, ms",
            "other worker stats",
        ],
        where_rows,
    )
    body = (
        f"{settings}\n\n### TTFT (SPEC P1, P2, P12)\n\n{ttft_table}\n\n"
        "Where the time goes (medians over rounds; restore, wait and prefill: median "
        "(min-max)) and where every prompt token came from (`cache_delta.sources`: live KV, "
        "a tier, or computed here). `queue_ms`, `restore_ms`, `wait_ms` and `prefill_ms` are "
        "the worker's own `stats` (`restore_ms` includes `wait_ms`: waiting for a save of "
        "this prompt still in flight, or for another request's prefill of a shared prefix; "
        "`prefill_ms`: until the first token's logits; on a warm path without stored "
        "logits, the held-back last prompt token decoded alone); first token from stored "
        "logits: an exact hit with nothing prefilled. The last but one column is each "
        "request's client TTFT less queue, restore and prefill, median (min-max): the "
        "request's way from the client to the worker (the route is cached: one hop, the "
        "front not involved), any wait for a tick in progress before the worker's loop "
        "reads it (its queue_ms starts there), sampling and the token event's way back:\n\n"
        f"{where_table}\n"
    )
    tier = runs(TIER, last)
    served_live = sum(1 for m in tier if m.source("live") > 0)
    displaced = (
        f"NOT MEASURED (served live in {served_live} of {len(tier)} rounds: its idle entry "
        "was not displaced)"
        if served_live
        else None
    )
    restart = runs(RESTART, last)
    cold_after = not_exact(restart)
    bars: list[tuple[str, list[float], str, str]] = [
        (
            f"P1: warm {last}-token TTFT from a tier (after {AGENTS} other requests), ms "
            f"(<= {TIER_BAR_MS:g})",
            ms(TIER, last),
            displaced or judge(ms(TIER, last), TIER_BAR_MS, at_least=False, hits=_hits(tier),
                               expected=EXACT),
            ".2f",
        ),
        (
            f"P1: its speed-up vs cold, {last} tokens (>= {SPEEDUP_BAR:g}x)",
            speedup(TIER, last),
            displaced or judge(speedup(TIER, last), SPEEDUP_BAR, at_least=True,
                               hits=_hits(tier), expected=EXACT),
            ".0f",
        ),
        (
            f"P2: first repeat of a {last}-token prompt after a restart (SIGTERM, default "
            f"config), exact, ms (<= {RESTART_BAR_MS:g})",
            ms(RESTART, last),
            f"NOT MET (not exact in {cold_after} of {len(restart)} rounds)"
            if cold_after
            else verdict(ms(RESTART, last), RESTART_BAR_MS, at_least=False),
            ".2f",
        ),
    ]  # fmt: skip
    agents = [r.agents for r in rounds if r.agents is not None]
    if agents:
        body += "\n" + agents_section(agents)
        shares = [a.prefix_ms for a in agents]
        bars.append(
            (
                f"P6: the prefix's share of agents 2-{AGENTS} TTFT (TTFT - queue_ms - "
                f"prefill_ms, median over agents), ms (<= {PREFIX_BAR_MS:g})",
                shares,
                verdict(shares, PREFIX_BAR_MS, at_least=False),
                ".2f",
            )
        )
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
        "path it measures (P1: an exact hit from a tier, not live KV); P2 is NOT MET when a "
        "round's first repeat after the restart was not exact. SPEC P1's and P6's ratios to "
        "llama-server and P12 (the back-to-back repeat against llama-server's live-slot hit) "
        "are judged by bench/peers_bench.py, which runs llama-server in the same rounds."
    )
    return f"{body}\n### Bars\n\n{bar_table}\n\n{note}\n"


def _hits(ms: Iterable[Measure]) -> list[str]:
    return [m.hit for m in ms]


def agents_section(agents: list[Agents]) -> str:
    """P6: agent 1's TTFT, agents 2-8 p50/p99 per round, the prefix's share and
    the worker's stats."""
    firsts = [a.first.ttft_ms for a in agents]
    others = [m for a in agents for m in a.others]
    pooled = [m.ttft_ms for m in others]
    tier = [float(m.source("ram") + m.source("ram_file") + m.source("disk")) for m in others]
    rows = [
        ["agent 1, TTFT ms", spread(firsts, ".0f")],
        ["agent 1, cache_hit_kind / tokens prefilled",
         f"{'/'.join(sorted({a.first.hit for a in agents}))} / "
         f"{median([float(a.first.prefill_tokens) for a in agents]):.0f}"],
        [f"agents 2-{AGENTS}, p50 TTFT ms (per round)", spread([a.p50_ms for a in agents], ".1f")],
        [f"agents 2-{AGENTS}, p99 TTFT ms (per round)", spread([a.p99_ms for a in agents], ".1f")],
        [f"agents 2-{AGENTS}, all rounds pooled: p10 / p50 / p90 / p99 TTFT ms",
         " / ".join(f"{percentile(pooled, q):.1f}" for q in (10, 50, 90, 99))],
        [f"agents 2-{AGENTS}, the prefix's share: TTFT - queue_ms - prefill_ms, median over "
         "agents (per round)", spread([a.prefix_ms for a in agents], ".2f")],
        [f"agents 2-{AGENTS}, p50 / agent 1 (per round; information)",
         spread([a.share for a in agents], ".4f")],
        [f"agents 2-{AGENTS}, cache_hit_kind", "/".join(sorted({m.hit for m in others}))],
        [f"agents 2-{AGENTS}, prompt tokens from (median live / tier / computed)",
         f"{median([float(m.source('live')) for m in others]):.0f} / "
         f"{median(tier):.0f} / "
         f"{median([float(m.source('computed')) for m in others]):.0f}"],
        [f"agents 2-{AGENTS}, queue_ms / restore_ms (of it wait_ms) / prefill_ms (medians)",
         f"{median([m.queue_ms for m in others]):.2f} / "
         f"{median([m.restore_ms for m in others]):.2f} "
         f"({median([m.wait_ms for m in others]):.2f}) / "
         f"{median([m.prefill_ms for m in others]):.2f}"],
        [f"agents 2-{AGENTS}, tokens prefilled (median)",
         f"{median([float(m.prefill_tokens) for m in others]):.0f}"],
        [f"agents 2-{AGENTS}, tokens prefilled together / agent 1's (per round)",
         spread([a.tail_share for a in agents], ".4f")],
        [f"agents 2-{AGENTS}, client TTFT - worker, ms (median; includes waiting for the "
         "tick in progress before the worker reads the request)",
         f"{median([m.transport_ms for m in others]):.2f}"],
    ]  # fmt: skip
    return (
        f"### {AGENTS} agents sharing a {PREFIX_TOKENS}-token prefix (SPEC P6)\n\n"
        "Agent 1 alone on a fresh prefix and its tail; the moment its reply ended, agents "
        f"2-{AGENTS} together (threads released by one barrier), no save waited for.\n\n"
        + table(["", "median (min-max over rounds)"], rows)
        + "\n"
    )


def stored_logits(snap: WorkerSnapshot) -> int | None:
    """The worker's own count of first tokens sampled from logits kept with a
    row since its start (``None``: a worker that does not count them)."""
    n = getattr(snap.status, "stored_logits_hits", None)
    return None if n is None else int(n)


def logits_note(counts: Mapping[str, int | None]) -> str:
    """The workers' own count of first tokens sampled from logits kept with a
    row, since the last start (:func:`stored_logits`; a worker that does not
    count them says so)."""
    parts = [f"`{name}` {'not reported' if n is None else n}" for name, n in counts.items()]
    return (
        "First tokens sampled from logits stored with the row, by the workers' own count "
        f"(`stored_logits_hits`, the last daemon start only): {', '.join(parts)}."
    )


# -- the recorded form -------------------------------------------------------------------


def measure_data(m: Measure) -> dict[str, Any]:
    """A :class:`Measure` as recorded (``extra`` and ``sources`` as objects)."""
    out = {k: getattr(m, k) for k in Measure.__dataclass_fields__}
    out["extra"] = dict(m.extra)
    out["sources"] = dict(m.sources)
    return out


def measure_of(data: Mapping[str, Any]) -> Measure:
    """:func:`measure_data` read back."""
    fields = {k: data[k] for k in Measure.__dataclass_fields__ if k in data}
    fields["extra"] = tuple(data.get("extra", {}).items())
    fields["sources"] = tuple(data.get("sources", {}).items())
    return Measure(**fields)


def round_data(r: Round) -> dict[str, Any]:
    """One round as recorded: every timed request (path, tokens, the
    :class:`Measure`) and P6's agents."""
    return {
        "ttft": [{"path": path, "tokens": n, **measure_data(m)} for (path, n), m in r.ttft.items()],
        "agents": None
        if r.agents is None
        else {
            "first": measure_data(r.agents.first),
            "others": [measure_data(m) for m in r.agents.others],
        },
    }


def round_of(data: Mapping[str, Any]) -> Round:
    """:func:`round_data` read back."""
    r = Round()
    for t in data["ttft"]:
        r.ttft[t["path"], int(t["tokens"])] = measure_of(t)
    a = data.get("agents")
    if a is not None:
        r.agents = Agents(measure_of(a["first"]), [measure_of(m) for m in a["others"]])
    return r


def render(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    """The recorded body from bench/daemon_bench.py's ``params`` and ``data``."""

    def avg(xs: Sequence[float]) -> str:
        return "/".join(f"{x:.2f}" for x in xs)

    agents, model = params["agents"], params["model"]
    settings = (
        f"Model `default`, {params['cores']} cores. One daemon (`python -m llamad.daemon "
        f"--config`) serving it as `{model}` with the default configuration but `n_seq_max` "
        f"{agents} (P6's agents at once): default context, batch, threads (every CPU), flash "
        "attention auto, and the cache's default tiers, quotas and policy (no save or restore "
        "tier chosen). Driven by `llamad.Client` from the bench process; greedy, max_tokens 1; "
        "TTFT = `infer` called to the first token event. Requests back to back: nothing "
        f"waits for a save; the repeat from a tier follows {agents} (n_seq_max) other "
        f"{params['filler_tokens']}-token requests, which take every sequence, the prompt's "
        f"idle entry's last. The daemon was started {params['starts']} times (a full restart, "
        "SIGTERM then exit 0, every round, then one short untimed prompt). "
        f"{params['rounds']} rounds after one unrecorded warm-up round, orders alternating. "
        "Values: median (min-max) over rounds.\n\n"
        f"Load average (1/5/15 min) at start {avg(params['load_start'])}, "
        f"at end {avg(params['load_end'])}; 1-min at each round's start "
        f"(warm-up first): {', '.join(f'{x:.2f}' for x in params['loads'])}. Wall time "
        f"{params['wall_s']:.0f} s.\n\n{governor_note(params['governor'])}\n\n"
        f"{logits_note(params['stored_logits_hits'])}"
    )
    return report([round_of(r) for r in data["rounds"]], settings)
