"""bench/soak.py's bookkeeping and verdicts: what the clients saw, what /proc said.

Nothing here touches a process or a socket, so the judging is unit-tested
(``tests/unit/test_soak_report.py``). :class:`Ledger` counts every request's
terminal outcomes (lost: none; duplicated: more than one); :class:`Sample`
is one process at one moment; :func:`judge` turns a run into bars with
verdicts and :func:`report` into the recorded markdown.

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

import itertools
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from bench.common import table

RSS_BAR_MB = 20.0  # growth of the daemon's own processes after warm-up, at most
RESTARTS_ALLOWED = 3  # the front gives a model up past 3 restarts in 60 s
RESTART_PERIOD_S = 60.0

#: Error codes a client may see in this soak, and why. Anything else fails "every error
#: expected"; a timeout is a reply that never came and counts as lost.
EXPECTED_CODES: dict[str, str] = {
    "worker_crashed": "the request was in flight on the worker the killer SIGKILLed",
    "no_session": "a session went on (or ended) after its worker was killed: "
    "its sequence died with it",
}
LOST_CODES = frozenset({"timeout"})

OK = "ok"
CANCELLED = "cancelled"  # the client left the stream, or asked the worker to stop it
MISMATCH = "mismatch"  # a reply that does not continue the request's own prompt


def error_outcome(code: str) -> str:
    return f"error:{code}"


def untyped_outcome(exc: BaseException) -> str:
    return f"untyped:{type(exc).__name__}: {exc}"[:200]


@dataclass
class _Request:
    kind: str
    model: str
    started: float
    ends: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class KindCounts:
    kind: str
    started: int = 0
    served: int = 0  # ok
    cancelled: int = 0
    errors: int = 0  # typed, expected or not (timeouts excluded)
    lost: int = 0
    duplicated: int = 0
    untyped: int = 0
    mismatched: int = 0


@dataclass(frozen=True)
class LedgerSummary:
    kinds: list[KindCounts]
    errors: dict[str, Counter[str]]  # code -> kinds it came from
    untyped: list[str]  # the first few untyped failures, as text
    lost: list[str]  # request ids
    duplicated: list[str]

    @property
    def total(self) -> KindCounts:
        out: dict[str, int] = Counter()
        for k in self.kinds:
            for name in ("started", "served", "cancelled", "errors", "lost", "duplicated"):
                out[name] += getattr(k, name)
            for name in ("untyped", "mismatched"):
                out[name] += getattr(k, name)
        return KindCounts("all", **out)

    @property
    def unexpected_codes(self) -> list[str]:
        return sorted(c for c in self.errors if c not in EXPECTED_CODES)


class Ledger:
    """Every request the clients started, and each terminal outcome it got.

    ``start`` before sending; ``end`` once per terminal the client saw (a
    ``done``, an error, a reply, or leaving the stream). Thread-safe.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()

    def start(self, kind: str, model: str) -> str:
        with self._lock:
            rid = f"soak-{next(self._ids)}"
            self._requests[rid] = _Request(kind, model, self._clock())
        return rid

    def end(self, rid: str, outcome: str) -> None:
        with self._lock:
            self._requests[rid].ends.append(outcome)

    def summary(self) -> LedgerSummary:
        with self._lock:
            requests = dict(self._requests)
        counts: dict[str, Counter[str]] = defaultdict(Counter)
        errors: dict[str, Counter[str]] = defaultdict(Counter)
        untyped: list[str] = []
        lost: list[str] = []
        duplicated: list[str] = []
        for rid, req in requests.items():
            c = counts[req.kind]
            c["started"] += 1
            if len(req.ends) > 1:
                c["duplicated"] += 1
                duplicated.append(rid)
            codes = [o.split(":", 1)[1] for o in req.ends if o.startswith("error:")]
            if not req.ends or any(code in LOST_CODES for code in codes):
                c["lost"] += 1
                lost.append(rid)
            for outcome in req.ends[:1]:
                if outcome == OK:
                    c["served"] += 1
                elif outcome == CANCELLED:
                    c["cancelled"] += 1
                elif outcome == MISMATCH:
                    c["mismatched"] += 1
                elif outcome.startswith("untyped:"):
                    c["untyped"] += 1
                    untyped.append(f"{req.kind}: {outcome}")
            for code in codes:
                if code not in LOST_CODES:
                    c["errors"] += 1
                errors[code][req.kind] += 1
        kinds = [KindCounts(kind, **c) for kind, c in sorted(counts.items())]
        return LedgerSummary(kinds, dict(errors), untyped[:10], lost, duplicated)


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

    def at(self, age: float) -> Sample | None:
        return next((s for s in self.samples if s.t - self.born >= age), None)


def lives(samples: Iterable[Sample], role: str) -> list[Life]:
    by_pid: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        if s.role == role:
            by_pid[s.pid].append(s)
    out = [
        Life(pid, min(s.t for s in ss), sorted(ss, key=lambda s: s.t)) for pid, ss in by_pid.items()
    ]
    return sorted(out, key=lambda life: life.born)


def worker_growth(samples: Sequence[Sample], role: str, w: Windows) -> Growth | None:
    """The first fresh worker after warm-up against the last, each at ``w.age``.

    ``None`` when fewer than two fresh workers reached that age.
    """
    fresh = [
        (life, s)
        for life in lives(samples, role)
        if life.born >= w.warmup and (s := life.at(w.age)) is not None
    ]
    if len(fresh) < 2:
        return None
    a, b = fresh[0][1], fresh[-1][1]
    # Threads like for like too: a worker starts some threads only once it
    # needs them (saves, restores), so its first minutes are no bound. The
    # first fresh worker's whole life bounds every later one's.
    first = fresh[0][0]
    bound = max(s.threads for s in first.samples)
    late = max(
        (
            s.threads
            for life in lives(samples, role)
            if life.born > first.born
            for s in life.samples
        ),
        default=0,
    )
    # Two single samples: their noise is what the same age measures across
    # every fresh worker in between.
    noise = _spread([s.own_kb for _, s in fresh])
    return Growth(
        role,
        _mb(a.own_kb),
        _mb(b.own_kb),
        noise,
        a.fds,
        b.fds,
        bound,
        late,
        [life.pid for life, _ in fresh],
        note=f"{len(fresh)} fresh workers at age {w.age:.0f} s",
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
    """The two samples whose fd counts a growth compares: long-lived, the most
    in the reference window and the last; workers, the first and last fresh
    worker at ``w.age``."""
    mine = [s for s in samples if s.role == role]
    if is_worker(role):
        fresh = [s for life in lives(mine, role) if life.born >= w.warmup and (s := life.at(w.age))]
        return (fresh[0], fresh[-1]) if len(fresh) >= 2 else None
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
    parts = ["### Settings and load\n", "\n".join(f"- {k}: {v}" for k, v in settings.items())]
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
