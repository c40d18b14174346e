"""bench/soak.py's verdicts: what /proc said, the kills, the bars, the recorded text.

Nothing here touches a process or a socket, so the judging is unit-tested
(``tests/unit/test_soak_report.py``). The clients' side is the ledger
(:mod:`bench.soak_ledger`); :class:`Sample` is one process at one moment;
:func:`judge` turns a run into bars with verdicts and :func:`report` into
the recorded markdown. A recorded run is ``soak-<date>.json``: every sample
of every process, every request and its outcomes, the kills and the exits
the supervisors logged (:func:`bench.soak.run` says what else);
:func:`render` judges it and renders the ``.md`` (:func:`run_bars`: the bars
alone).

**The daemon's own RSS** (``Sample.own_kb``): ``VmRSS - RssShmem - Rss of
every mapping of a .gguf file`` (``/proc/PID/status`` and ``/proc/PID/smaps``).
The weights are a shared file mapping and the ram tier's rows are shared
memory: both are the model's and the cache's, not the daemon's. A worker's
KV cells and compute buffers are anonymous memory that llama.cpp allocates
and zeroes when the context is created, so they are resident from the
worker's first sample on and constant per model; the worker comparison is
like for like (two fresh workers of the same model at the same age), which
cancels them rather than guessing their size.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import table
from bench.soak_ledger import EXPECTED_CODES, LedgerSummary, summarize

RSS_BAR_MB = 20.0  # growth of the daemon's own processes after warm-up, at most
RESTARTS_ALLOWED = 3  # the front gives a model up past 3 restarts in 60 s
RESTART_PERIOD_S = 60.0

# -- processes -----------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """One llamad process at one moment (``t``: seconds since the load began)."""

    t: float
    pid: int
    role: str  # root, front, cache_sup, cache-meta, model_sup, model.<id>
    rss_kb: int
    own_kb: int  # see the module doc
    fds: int
    threads: int


def is_worker(role: str) -> bool:
    return role.startswith("model.")


@dataclass(frozen=True)
class Windows:
    """When the comparisons are taken (seconds since the load began).

    Long-lived processes: the median of ``[warmup, warmup + span)`` against
    the median of the last ``span``. Workers: each fresh worker (first seen
    after ``warmup``) at ``age`` seconds after it was first seen.
    """

    warmup: float
    span: float
    end: float
    age: float


@dataclass(frozen=True)
class Growth:
    role: str
    ref_mb: float
    end_mb: float
    noise_mb: float  # the spread of the samples compared
    fds_ref: int  # long-lived: the most in the reference window; workers: at age
    fds_end: int  # long-lived: the median of the end window; workers: at age
    threads_bound: int  # the most up to the end of the reference window
    threads_late: int  # the most after it
    pids: list[int]
    note: str = ""

    @property
    def growth_mb(self) -> float:
        return self.end_mb - self.ref_mb


def _mb(kb: float) -> float:
    return kb / 1024


def _spread(values: Sequence[int]) -> float:
    return _mb(max(values) - min(values)) if values else 0.0


def _threads(samples: Sequence[Sample], w: Windows) -> tuple[int, int]:
    cut = w.warmup + w.span
    early = [s.threads for s in samples if s.t < cut]
    late = [s.threads for s in samples if s.t >= cut]
    return max(early, default=0), max(late, default=0)


def long_lived_growth(samples: Sequence[Sample], role: str, w: Windows) -> Growth | None:
    """A process that lives the whole run, compared after warm-up and at the end."""
    mine = [s for s in samples if s.role == role]
    ref = [s for s in mine if w.warmup <= s.t < w.warmup + w.span]
    last = [s for s in mine if s.t > w.end - w.span]
    if not ref or not last:
        return None
    pids = sorted({s.pid for s in mine})
    bound, late = _threads(mine, w)
    return Growth(
        role,
        _mb(statistics.median(s.own_kb for s in ref)),
        _mb(statistics.median(s.own_kb for s in last)),
        _spread([s.own_kb for s in ref]) + _spread([s.own_kb for s in last]),
        max(s.fds for s in ref),
        int(statistics.median(s.fds for s in last)),
        bound,
        late,
        pids,
        note="" if len(pids) == 1 else f"restarted: {len(pids)} pids",
    )


@dataclass(frozen=True)
class Life:
    """One worker process of a model: its samples, first seen at ``born``."""

    pid: int
    born: float
    samples: list[Sample]

    def window(self, w: Windows) -> list[Sample]:
        """Its samples from ``w.age`` to ``w.age + w.span`` after it was first seen."""
        return [s for s in self.samples if w.age <= s.t - self.born < w.age + w.span]


def lives(samples: Iterable[Sample], role: str) -> list[Life]:
    by_pid: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.role == role:
            by_pid[s.pid].append(s)
    out = [
        Life(pid, min(s.t for s in ss), sorted(ss, key=lambda s: s.t)) for pid, ss in by_pid.items()
    ]
    return sorted(out, key=lambda life: life.born)


def fresh_lives(samples: Sequence[Sample], role: str, w: Windows) -> list[Life]:
    """Workers first seen after warm-up with samples in their window at ``w.age``."""
    return [life for life in lives(samples, role) if life.born >= w.warmup and life.window(w)]


def worker_growth(samples: Sequence[Sample], role: str, w: Windows) -> Growth | None:
    """The first fresh worker after warm-up against the last, each over the same
    window of its life (``w.age`` to ``w.age + w.span``), as long-lived processes
    are: own RSS median against median, fds the most against the median.

    ``None`` when fewer than two fresh workers reached that age.
    """
    fresh = fresh_lives(samples, role, w)
    if len(fresh) < 2:
        return None
    a, b = fresh[0].window(w), fresh[-1].window(w)
    # Threads like for like too: a worker starts some threads only once it
    # needs them (saves, restores), so its first minutes are no bound. The
    # first fresh worker's whole life bounds every later one's.
    bound = max(s.threads for s in fresh[0].samples)
    late = max(
        (
            s.threads
            for life in lives(samples, role)
            if life.born > fresh[0].born
            for s in life.samples
        ),
        default=0,
    )
    medians = [statistics.median(s.own_kb for s in life.window(w)) for life in fresh]
    return Growth(
        role,
        _mb(medians[0]),
        _mb(medians[-1]),
        # What the same window measures from one fresh worker to the next.
        _spread([int(m) for m in medians]),
        max(s.fds for s in a),
        int(statistics.median(s.fds for s in b)),
        bound,
        late,
        [life.pid for life in fresh],
        note=f"{len(fresh)} fresh workers, {w.age:.0f}-{w.age + w.span:.0f} s old",
    )


def growths(samples: Sequence[Sample], w: Windows) -> tuple[list[Growth], list[str]]:
    """Every role's growth, and the roles that could not be compared (why)."""
    out: list[Growth] = []
    missing: list[str] = []
    for role in sorted({s.role for s in samples}):
        g = (
            worker_growth(samples, role, w)
            if is_worker(role)
            else long_lived_growth(samples, role, w)
        )
        if g is None:
            why = (
                "fewer than two fresh workers reached the age"
                if is_worker(role)
                else "no samples in a window"
            )
            missing.append(f"{role}: {why}")
        else:
            out.append(g)
    return out, missing


def fd_samples(samples: Sequence[Sample], role: str, w: Windows) -> tuple[Sample, Sample] | None:
    """Two samples to name the fd kinds a growth is made of: the one with the most
    fds in the reference window, and the last (workers: of the last fresh
    worker's window)."""
    if is_worker(role):
        fresh = fresh_lives(samples, role, w)
        if len(fresh) < 2:
            return None
        return max(fresh[0].window(w), key=lambda s: s.fds), fresh[-1].window(w)[-1]
    mine = [s for s in samples if s.role == role]
    ref = [s for s in mine if w.warmup <= s.t < w.warmup + w.span]
    return (max(ref, key=lambda s: s.fds), mine[-1]) if ref else None


def fd_diff(before: Counter[str], after: Counter[str]) -> str:
    """``+2 socket, -1 pipe``: the fd kinds whose counts changed."""
    parts = [
        f"{after[k] - before[k]:+d} {k}"
        for k in sorted(set(before) | set(after))
        if after[k] != before[k]
    ]
    return ", ".join(parts) or "the same kinds"


# -- kills ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Kill:
    t: float
    model: str
    pid: int
    back_s: float | None  # until a new worker registered (None: never)


@dataclass(frozen=True)
class Exit:
    """A child the daemon's supervisors saw end abnormally (its ``child.exited`` log)."""

    t: float  # seconds since the load began
    child: str
    pid: int
    how: str  # reason, exit status, and the cause when the supervisor killed it


def unexplained(exits: Sequence[Exit], kills: Sequence[Kill]) -> list[Exit]:
    """Exits of processes the killer did not kill."""
    killed = {k.pid for k in kills}
    return [e for e in exits if e.pid not in killed]


def restarts(kills: Sequence[Kill], exits: Sequence[Exit]) -> list[Kill]:
    """Every worker restart the front counts: the kills and the workers' other exits."""
    return [
        *kills,
        *(
            Kill(e.t, e.child.removeprefix("model."), e.pid, None)
            for e in unexplained(exits, kills)
            if is_worker(e.child)
        ),
    ]


def most_kills_in_period(kills: Sequence[Kill], period: float = RESTART_PERIOD_S) -> int:
    """The most kills of one model inside any ``period`` seconds."""
    most = 0
    by_model: dict[str, list[float]] = defaultdict(list)
    for k in kills:
        by_model[k.model].append(k.t)
    for times in by_model.values():
        times.sort()
        for i, t in enumerate(times):
            most = max(most, sum(1 for u in times[i:] if u - t < period))
    return most


# -- verdicts ------------------------------------------------------------------------


def upper_verdict(value: float, noise: float, bar: float) -> str:
    """Met when ``value`` stays under ``bar`` by more than its noise; above when it
    exceeds it by more; otherwise the bar lies inside the spread: within noise."""
    if value + noise <= bar:
        return "met"
    if value - noise > bar:
        return "ABOVE BAR"
    return "within noise"


@dataclass(frozen=True)
class Bar:
    name: str
    value: str
    verdict: str


def judge(
    ledger: LedgerSummary,
    grown: Sequence[Growth],
    missing: Sequence[str],
    kills: Sequence[Kill],
    failed_models: Sequence[str],
    *,
    exits: Sequence[Exit] = (),
) -> list[Bar]:
    total = ledger.total
    bars = [
        Bar(
            "no reply lost or duplicated",
            f"{total.lost} lost, {total.duplicated} duplicated, {total.mismatched} "
            f"not for their prompt, of {total.started}",
            "met" if total.lost == total.duplicated == total.mismatched == 0 else "FAILED",
        ),
        Bar(
            "every error typed, expected codes only",
            f"{total.untyped} untyped; unexpected codes: "
            + (", ".join(ledger.unexpected_codes) or "none"),
            "met" if total.untyped == 0 and not ledger.unexpected_codes else "FAILED",
        ),
    ]
    growth = sum(g.growth_mb for g in grown)
    noise = sum(g.noise_mb for g in grown)
    verdict = upper_verdict(growth, noise, RSS_BAR_MB)
    if missing and verdict == "met":
        verdict = "incomplete"
    bars.append(
        Bar(
            f"own RSS growth after warm-up <= {RSS_BAR_MB:.0f} MB (sum of roles)",
            f"{growth:+.1f} MB (noise {noise:.1f} MB)"
            + (f"; not compared: {'; '.join(missing)}" if missing else ""),
            verdict,
        )
    )
    fd_grew = [f"{g.role} {g.fds_ref}->{g.fds_end}" for g in grown if g.fds_end > g.fds_ref]
    bars.append(
        Bar(
            "no fd growth (end <= after warm-up, per process)",
            ", ".join(fd_grew) or "none grew",
            "met" if not fd_grew else "FAILED",
        )
    )
    thr = [
        f"{g.role} {g.threads_bound}->{g.threads_late}"
        for g in grown
        if g.threads_late > g.threads_bound
    ]
    bars.append(
        Bar(
            "threads bounded (none past the most seen by the end of warm-up)",
            ", ".join(thr) or "none grew",
            "met" if not thr else "FAILED",
        )
    )
    most = most_kills_in_period(restarts(kills, exits))
    never_back = [f"{k.model} pid {k.pid}" for k in kills if k.back_s is None]
    others = [f"{e.child} pid {e.pid} at {e.t:.0f} s ({e.how})" for e in unexplained(exits, kills)]
    bars.append(
        Bar(
            f"restarts inside the window ({RESTARTS_ALLOWED} in {RESTART_PERIOD_S:.0f} s),"
            " every killed worker back, no model given up",
            f"{len(kills)} kills; other exits: {', '.join(others) or 'none'}; at most {most} "
            f"restarts of one model in {RESTART_PERIOD_S:.0f} s; "
            f"not back: {', '.join(never_back) or 'none'}; "
            f"given up: {', '.join(failed_models) or 'none'}",
            "met"
            if most <= RESTARTS_ALLOWED and kills and not (never_back or failed_models)
            else "FAILED",
        )
    )
    return bars


# -- the recorded text ---------------------------------------------------------------


METHOD = """\
### Method

`python -m bench.soak` starts `python -m llamad.daemon` over a private
temporary directory and loads it as the settings say; the killer SIGKILLs a
model's worker (the models in turn) and waits for its replacement to
register. Every request is entered in a ledger before it is sent and given
one outcome per terminal its client sees (a reply or `done`, a typed error,
anything else); prompts are token ids, so a reply that does not continue its
own prompt shows. Every 5 s a sampler walks the daemon's process tree in
`/proc` (every task's `children`) and records per process: RSS, **own RSS**
= `VmRSS - RssShmem - Rss of the .gguf mappings` (the weights are a shared
file mapping and the ram tier's rows shared memory; a worker's KV cells and
compute buffers are allocated and zeroed when its context is created, so
they are resident from its first sample and constant per model), open fds
(and their kinds) and threads. Long-lived processes (root, front, cache_sup,
cache-meta, model_sup) are compared as the median of the window after
warm-up against the median of the last window; workers, which the kills
replace, like for like: the first worker started after warm-up against the
last one, each at the same age. The RSS bar is on the sum of every role's
growth, met only when the sum stays under it by more than the samples'
spread. fds: the median of the last window against the most seen in the
window after warm-up (workers: at the same age). Threads: none past the
most seen by the end of that window (workers: past the first fresh worker's
whole life). Restarts: the kills and any other worker exit the supervisors
logged, at most 3 of one model in 60 s (the front gives a model up past
that).
"""


def report(
    *,
    settings: dict[str, str],
    ledger: LedgerSummary,
    grown: Sequence[Growth],
    kills: Sequence[Kill],
    bars: Sequence[Bar],
    plots: Sequence[str],
    fd_notes: dict[str, str] | None = None,
) -> str:
    parts = [METHOD, "\n### Settings and load\n"]
    parts += ["\n".join(f"- {k}: {v}" for k, v in settings.items())]
    parts += [
        "\n\n### Bars\n",
        table(["bar", "measured", "verdict"], [[b.name, b.value, b.verdict] for b in bars]),
    ]
    rows = [
        [
            k.kind,
            k.started,
            k.served,
            k.cancelled,
            k.errors,
            k.lost,
            k.duplicated,
            k.untyped,
            k.mismatched,
        ]
        for k in [*ledger.kinds, ledger.total]
    ]
    parts += [
        "\n\n### Requests\n",
        "served: a reply or a `done`; cancelled: the client left the stream or asked the "
        "worker to stop it; lost: no terminal (or a timeout); mismatched: a reply that "
        "does not continue its own prompt.\n",
        table(
            [
                "kind",
                "started",
                "served",
                "cancelled",
                "errors",
                "lost",
                "duplicated",
                "untyped",
                "mismatched",
            ],
            rows,
        ),
    ]
    err_rows = [
        [
            code,
            sum(kinds.values()),
            ", ".join(f"{k} {n}" for k, n in kinds.most_common()),
            EXPECTED_CODES.get(code, "UNEXPECTED"),
        ]
        for code, kinds in sorted(ledger.errors.items())
    ]
    parts += [
        "\n\n### Errors by code\n",
        table(["code", "count", "kinds", "why"], err_rows) if err_rows else "none",
    ]
    if ledger.untyped:
        parts += ["\n\nUntyped failures (first 10):\n", "\n".join(f"- {u}" for u in ledger.untyped)]
    parts += [
        "\n\n### Kills\n",
        table(
            ["t (s)", "model", "pid", "new worker after (s)"],
            [
                [f"{k.t:.0f}", k.model, k.pid, "never" if k.back_s is None else f"{k.back_s:.1f}"]
                for k in kills
            ],
        )
        if kills
        else "none",
    ]
    proc_rows = [
        [
            g.role,
            f"{g.ref_mb:.1f}",
            f"{g.end_mb:.1f}",
            f"{g.growth_mb:+.1f}",
            f"{g.noise_mb:.1f}",
            f"{g.fds_ref} / {g.fds_end}",
            f"{g.threads_bound} / {g.threads_late}",
            g.note,
        ]
        for g in grown
    ]
    parts += [
        "\n\n### Processes (own RSS: RSS less the .gguf mappings and shared memory)\n",
        table(
            [
                "role",
                "after warm-up MB",
                "end MB",
                "growth MB",
                "noise MB",
                "fds ref / end",
                "threads bound / late",
                "",
            ],
            proc_rows,
        ),
    ]
    if fd_notes:
        parts += [
            "\n\nfds that grew, by kind (the two samples compared):\n",
            "\n".join(f"- {role}: {note}" for role, note in sorted(fd_notes.items())),
        ]
    if plots:
        parts += ["\n\n### Plots\n", "\n".join(f"![{p}]({p})" for p in plots)]
    return "".join(parts) + "\n"


# -- the recorded run ------------------------------------------------------------------


def sample_data(s: Sample) -> list[object]:
    """A :class:`Sample` as recorded: ``[t, pid, role, rss_kb, own_kb, fds, threads]``."""
    return [s.t, s.pid, s.role, s.rss_kb, s.own_kb, s.fds, s.threads]


def windows_of(params: Mapping[str, Any], data: Mapping[str, Any]) -> Windows:
    return Windows(
        warmup=params["warmup_s"], span=params["span_s"], end=data["end_s"], age=params["age_s"]
    )


def picked_fds(
    samples: Sequence[Sample], fds: Mapping[tuple[float, int], Counter[str]], w: Windows
) -> list[list[object]]:
    """What a recorded run keeps of the fd kinds: those of the two samples
    :func:`fd_samples` picks for each role, ``[t, pid, {kind: count}]``."""
    out: list[list[object]] = []
    for role in sorted({s.role for s in samples}):
        for s in fd_samples(samples, role, w) or ():
            out.append([s.t, s.pid, dict(fds.get((s.t, s.pid), Counter()))])
    return out


@dataclass(frozen=True)
class Run:
    """A recorded run read back and judged."""

    ledger: LedgerSummary
    samples: list[Sample]
    windows: Windows
    grown: list[Growth]
    missing: list[str]
    kills: list[Kill]
    exits: list[Exit]
    bars: list[Bar]


def run_of(params: Mapping[str, Any], data: Mapping[str, Any]) -> Run:
    """bench/soak.py's ``params`` and ``data``, counted and judged."""
    ledger = summarize(data["requests"])
    samples = [Sample(*row) for row in data["samples"]]
    w = windows_of(params, data)
    grown, missing = growths(samples, w)
    kills = [Kill(*row) for row in data["kills"]]
    exits = [Exit(*row) for row in data["exits"]]
    failed = [f"{m} ({i['error']})" for m, i in data["models"].items() if i["state"] == "failed"]
    bars = judge(ledger, grown, missing, kills, failed, exits=exits)
    return Run(ledger, samples, w, grown, missing, kills, exits, bars)


def run_bars(params: Mapping[str, Any], data: Mapping[str, Any]) -> list[Bar]:
    """The bars of a recorded run, judged from its data."""
    return run_of(params, data).bars


def render(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    """The recorded body from bench/soak.py's ``params`` and ``data``."""
    run = run_of(params, data)
    kinds = {(t, pid): Counter(k) for t, pid, k in data["fd_kinds"]}
    fd_notes = {}
    for g in run.grown:
        pair = fd_samples(run.samples, g.role, run.windows)
        if g.fds_end > g.fds_ref and pair is not None:
            before, after = (kinds.get((s.t, s.pid), Counter()) for s in pair)
            fd_notes[g.role] = fd_diff(before, after)
    load = data["load"]
    models = params["models"]
    settings = {
        "duration": f"{data['end_s']:.0f} s of load ({params['minutes']} min asked), warm-up "
        f"{params['warmup_s']:.0f} s, windows {params['span_s']:.0f} s, fresh workers compared "
        f"at age {params['age_s']:.0f} s",
        "daemon": "python -m llamad.daemon, default model twice: "
        + ", ".join(f"{m} n_ctx {n}" for m, n in models.items())
        + f"; n_seq_max 4, 1 thread each; quotas ram {params['ram_quota']}, ram_file "
        f"{params['ram_file_quota']}, disk {params['disk_quota']} (small, so rows move and are "
        "evicted all along); policy min_tokens 16 (the soak's prompts are short); the "
        "save tier and the wait for a save in flight are the defaults",
        "waits": "none: each client sends its next request the moment the previous one "
        "ended; no client waits for a save",
        "clients": f"{params['threads']} threads with a Client each + {params['async_tasks']} "
        "tasks on one AsyncClient (timeout 120 s, idle 60 s, connect 60 s)",
        "kills": f"SIGKILL a worker every {params['kill_every_s']:.0f} s, models in turn",
        "load average (1 min)": f"{params['load_start']:.2f} at start; during the run median "
        f"{statistics.median(load):.2f}, max {max(load):.2f}",
        "cache": ", ".join(f"{k} {v}" for k, v in data["counters"].items()),
        "front's view at the end": "; ".join(
            f"{m} {i['state']}, {i['restarts']} restarts" for m, i in data["models"].items()
        ),
        "daemon exit": f"exit {data['exit_code']} on SIGTERM; {data['log_problems']} log lines "
        "at error or above",
        "client threads still running at the end": ", ".join(data["stuck"]) or "none",
    }
    return report(
        settings=settings,
        ledger=run.ledger,
        grown=run.grown,
        kills=run.kills,
        bars=run.bars,
        plots=params["plots"],
        fd_notes=fd_notes,
    )
