"""bench/worker_bench.py's results: what one run measured, and the report with its verdicts.

The measurements (:mod:`bench.worker_bench`) fill :class:`Round` records; :func:`report`
turns them into the recorded tables and judges the bars (:func:`verdict`).
:func:`render` does the same from a recorded JSON (``worker-<date>.json``):
:func:`round_data` is one round as recorded (every TTFT with the worker's
stats, every stream's token arrival times), :func:`round_of` reads it back.
Nothing here touches a process, so the judging is unit-tested
(``tests/unit/test_worker_bench.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bench.common import median, table

if TYPE_CHECKING:
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
    """One request's TTFT on the client, the worker's stats of it
    (``Completion.stats`` as a dict), and its last decode's time."""

    ms: float
    stats: dict[str, Any]
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
        return median([float(r.ttft[path, n].stats[name]) for r in rounds])

    where_rows = []
    for path in (*WARM_PATHS, "cold"):
        for n in SIZES:
            total = median(ms(path, n))
            parts = [stat(path, n, k) for k in ("queue_ms", "restore_ms", "prefill_ms")]
            runs = [r.ttft[path, n] for r in rounds]
            decodes = [t.last_decode_ms for t in runs if not t.from_logits]
            threads = sorted({str(t.threads) for t in runs if not t.from_logits})
            prefill = [float(t.stats["prefill_tokens"]) for t in runs]
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


def governor_info(snap: WorkerSnapshot) -> dict[str, Any]:
    """What the M14 thread governor did in a worker, from its status, as recorded."""
    spin = getattr(getattr(snap, "spin", None), "value", "unknown")
    status = getattr(snap, "threads", None)
    if status is None:
        return {"spin": spin, "threads": None}
    names = (
        "threads",
        "budget",
        "ceiling",
        "collapses",
        "fallbacks",
        "probes",
        "probes_kept",
        "explorations",
        "explorations_kept",
    )
    return {"spin": spin, "threads": {k: getattr(status, k) for k in names}}


def governor_note(infos: Mapping[str, Mapping[str, Any]]) -> str:
    """What the M14 thread governor did in each worker (:func:`governor_info`)."""
    lines = []
    for name, info in infos.items():
        spin, t = info["spin"], info["threads"]
        if t is None:
            lines.append(f"`{name}` not governed (fixed n_threads; spin {spin})")
            continue
        lines.append(
            f"`{name}` governed (spin {spin}), {t['threads']} threads at the end "
            f"(budget {t['budget']}, ceiling {t['ceiling']}), collapses "
            f"{t['collapses']}, fallbacks {t['fallbacks']}, probes {t['probes']} "
            f"({t['probes_kept']} kept), explorations {t['explorations']} "
            f"({t['explorations_kept']} kept)"
        )
    return "Thread governor (SPEC M14), over the whole run: " + "; ".join(lines) + "."


# -- the recorded form -------------------------------------------------------------------


def round_data(r: Round) -> dict[str, Any]:
    """One round as recorded: every TTFT (path, tokens, client ms, the worker's
    stats, its last decode), every scenario's streams (token arrival times in
    seconds since the scenario's first token, finish reasons, threads)."""
    decode = {}
    for s, d in r.decode.items():
        t0 = min((a[0] for a in d.arrivals if a), default=0.0)
        decode[s] = {
            "arrivals_s": [[round(t - t0, 6) for t in a] for a in d.arrivals],
            "finish": d.finish,
            "threads": d.threads,
        }
    return {
        "ttft": [
            {
                "path": path,
                "tokens": n,
                "ms": t.ms,
                "stats": t.stats,
                "last_decode_ms": t.last_decode_ms,
                "threads": t.threads,
                "from_logits": t.from_logits,
            }
            for (path, n), t in r.ttft.items()
        ],
        "decode": decode,
    }


def round_of(data: Mapping[str, Any]) -> Round:
    """:func:`round_data` read back."""
    r = Round()
    for t in data["ttft"]:
        r.ttft[t["path"], int(t["tokens"])] = Ttft(
            t["ms"], dict(t["stats"]), t["last_decode_ms"], t["threads"], t["from_logits"]
        )
    for s, d in data["decode"].items():
        r.decode[s] = Decode(d["arrivals_s"], d["finish"], d["threads"])
    return r


def render(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    """The recorded body from bench/worker_bench.py's ``params`` and ``data``."""
    cores = params["cores"]

    def avg(xs: Sequence[float]) -> str:
        return "/".join(f"{x:.2f}" for x in xs)

    settings = (
        f"Model `default`, {cores} cores; two workers (`ram`, `disk`) under a real "
        f"supervisor with cache-meta, each n_threads = n_threads_batch = {cores}, "
        f"n_ctx {params['n_ctx']}, n_seq_max {params['n_seq_max']}, n_batch = n_ubatch "
        f"{params['n_batch']}, flash attention {params['flash_attn']}, prefill chunk "
        f"{max(64, params['n_batch'] // 4)} (default), default cache policy; driven by "
        f"`WorkerClient` from the bench process. {params['rounds']} rounds after one "
        "unrecorded warm-up round, orders alternating between rounds. TTFT: client send to "
        "first token event, greedy, max_tokens 1. Decode: greedy streams of max_tokens "
        f"{params['max_tokens']} (short prompts, no saves), tok/s over the window in which all "
        "streams decode. Values: median (range) over rounds; a ratio is taken per round, its "
        "spread is the rounds' range. Verdict: met if every round clears the bar, within noise "
        f"if the bar lies inside the spread. Hogs: {cores} busy-loop Python processes.\n\n"
        f"Load average (1/5/15 min) at start {avg(params['load_start'])}, "
        f"at end {avg(params['load_end'])}; 1-min at each round's start "
        f"(warm-up first): {', '.join(f'{x:.2f}' for x in params['loads'])}. Wall time "
        f"{params['wall_s']:.0f} s.\n\n{governor_note(params['governor'])}"
    )
    return report([round_of(r) for r in data["rounds"]], settings)
