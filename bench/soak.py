"""Load and soak (issue 10): a real daemon, 16 clients, a worker SIGKILLed every minute.

    python -m bench.soak      # 10 minutes; records bench/results/soak-<date>.md and plots
    python -m bench.soak --minutes 1 --kill-every 20 --no-record  # a quick check

``python -m llamad.daemon`` over a private temporary directory serves the
default model twice (``a``: n_ctx 4096, ``b``: n_ctx 2048; one thread each,
``n_seq_max`` 4). What this scenario configures, and why: small quotas on
every tier (``ram``, ``ram_file``, ``disk``; none turned off), so rows are
saved, moved between tiers and evicted all along, which is what a soak is
for; a cache policy that saves the soak's short prompts (``min_tokens`` 16
and its companions: by default nothing under 512 tokens is saved, and these
prompts are 40-280 tokens); two models on one thread each, so both fit the
machine's cores at once. The cache chooses the tier a save lands in; how
long the daemon waits for a save in flight is its default. No client waits
for a save: every client sends its next request the moment the previous one
ended. 12 threads with a blocking ``Client`` each and 4 tasks sharing an
``AsyncClient`` send a mix (:mod:`bench.soak_load`): completions, streams
read to the end, streams left after a few tokens (``break``) or cancelled
(``stream.cancel()``), sessions (``session_id``, ``continue``,
``end_session``), stateless resends with ``parent_key``, embeddings and
tokenize. A killer SIGKILLs one model's worker every ``--kill-every`` seconds,
the models in turn: each model loses a worker every two periods, inside the
front's window (a model is given up past 3 restarts in 60 s).

Every 5 s a sampler walks the daemon's process tree through ``/proc`` and
records each process's RSS, its own RSS (less the weights and shared
memory; see :mod:`bench.soak_report`), open fds and threads. At the end the
script judges the bars (:func:`bench.soak_report.judge`), writes the result
file and two plots (``--no-plot`` without matplotlib).

The killer's kills are the only faults: every error a client sees must be a
typed ``LlamadError`` whose code :data:`bench.soak_report.EXPECTED_CODES`
explains, and every request must end with exactly one terminal.

A recorded run is ``soak-<date>.json`` beside the ``.md``: every /proc sample
of every process, the fd kinds of the samples the fd comparison picks, every
request with its outcomes, the kills and exits, the load averages, the
models' state and the cache's counters at the end;
:func:`bench.soak_report.render` judges the bars from it and renders the
``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from bench import soak_report
from bench.common import machine, record, results_dir, show
from bench.soak_ledger import Ledger
from bench.soak_load import Load, Vocab, Worker, build_vocab, run_async_clients
from bench.soak_procs import Sampler
from bench.soak_report import Exit, Kill, Sample, Windows
from llamad import Client, paths
from llamad.actors import Registry
from llamad.testing import Launcher

MODELS = {"a": 4096, "b": 2048}  # model id -> n_ctx
RENDER = "bench.soak_report:render"
CACHE_COUNTERS = (
    "hits_exact",
    "hits_resume",
    "hits_longest_prefix",
    "misses",
    "evictions",
    "saves_dropped",
)
THREADS = 12
ASYNC_TASKS = 4


# -- the daemon ----------------------------------------------------------------------


class SoakDaemon:
    """``python -m llamad.daemon --config FILE`` over a private directory
    (:class:`llamad.testing.Launcher`)."""

    def __init__(self, ram_quota: str, ram_file_quota: str, disk_quota: str) -> None:
        self.launcher = Launcher(prefix="lsk-", instance=f"k{uuid.uuid4().hex[:10]}")
        self.base = self.launcher.base
        self.instance = self.launcher.instance
        self.runtime = self.launcher.runtime
        self.runtime.mkdir(mode=0o700)
        self.endpoint = self.launcher.endpoint
        self.registry = Registry(self.launcher.registry_root)
        models = "".join(
            f"""
[models.{mid}]
path = "default"
n_ctx = {n_ctx}
n_batch = 512
n_seq_max = 4
n_threads = 1
n_threads_batch = 1
"""
            for mid, n_ctx in MODELS.items()
        )
        self.config = self.launcher.write_config(
            f"""
[daemon]
runtime_dir = "{self.runtime}"
state_dir = "{self.launcher.state}"
log_format = "json"
log_level = "warning"
[cache]
instance = "{self.instance}"
[cache.ram]
quota = "{ram_quota}"
[cache.ram_file]
quota = "{ram_file_quota}"
[cache.disk]
quota = "{disk_quota}"
[cache.policy]
min_tokens = 16
cold_min_tokens = 16
boundary_trim_tokens = 0
boundary_align_tokens = 16
[cache.lookup]
common_min_tokens = 16
[security]
model_dirs = ["{paths.default_model_path().parent}"]
{models}"""
        )

    def start(self) -> None:
        self.launcher.start().wait_routed(MODELS, timeout=180)

    @property
    def ram_file_root(self) -> Path:
        """This instance's ``ram_file`` directory: the default root, on /dev/shm,
        outside :attr:`base` (``cache.ram_file.root``'s default)."""
        return self.launcher.ram_file_root

    def remove(self) -> None:
        """Its directory and its ``ram_file`` rows (stop it first)."""
        self.launcher.remove()

    @property
    def pid(self) -> int:
        return self.launcher.pid

    def worker_pid(self, model: str) -> int | None:
        entry = self.registry.lookup(f"model.{model}")
        return entry.pid if entry is not None else None

    def exits(self, wall_t0: float) -> list[Exit]:
        """Every ``child.exited`` the supervisors logged (abnormal exits log a warning)."""
        out = []
        for line in self.launcher.log_lines():
            if '"child.exited"' not in line:
                continue
            try:
                e = json.loads(line)
                when = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp()
                how = ", ".join(str(e[k]) for k in ("reason", "exit", "cause") if k in e)
                out.append(Exit(when - wall_t0, str(e["child"]), int(e["pid"]), how))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def log_problems(self) -> int:
        """Log lines at level error or critical."""
        return sum(
            1
            for line in self.launcher.log_lines()
            if '"level": "error"' in line or '"level": "critical"' in line
        )

    def stop(self) -> int | None:
        """SIGTERM; its exit status (``None``: killed after 120 s)."""
        return self.launcher.terminate(120).code


@contextmanager
def soak_daemon(
    ram_quota: str, ram_file_quota: str, disk_quota: str, keep: bool
) -> Iterator[SoakDaemon]:
    d = SoakDaemon(ram_quota, ram_file_quota, disk_quota)
    try:
        d.start()
        yield d
    finally:
        d.stop()
        if keep:
            print(f"kept {d.base} and {d.ram_file_root}", file=sys.stderr)
        else:
            d.remove()


# -- the killer ----------------------------------------------------------------------


class Killer(threading.Thread):
    """SIGKILL a model's worker every ``every`` seconds, the models in turn."""

    def __init__(self, daemon: SoakDaemon, every: float, t0: float, until: float) -> None:
        super().__init__(name="soak-killer", daemon=True)
        self.d, self.every, self.t0, self.until = daemon, every, t0, until
        self.kills: list[Kill] = []

    def run(self) -> None:
        models = list(MODELS)
        n = 0
        # No kill in the run's last seconds: every kill's worker is seen back
        # (and its requests' outcomes counted) before the load stops.
        while (at := self.every * (n + 1)) < self.until - 5:
            time.sleep(max(0.0, self.t0 + at - time.monotonic()))
            model = models[n % len(models)]
            n += 1
            pid = self.d.worker_pid(model)
            if pid is None:
                continue  # not back from an earlier kill: the kill is skipped, and shows
            t = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            back = None
            while time.monotonic() < t + 120:
                new = self.d.worker_pid(model)
                if new is not None and new != pid:
                    back = time.monotonic() - t
                    break
                time.sleep(0.05)
            self.kills.append(Kill(t - self.t0, model, pid, back))


# -- plots ---------------------------------------------------------------------------


def plot(samples: list[Sample], kills: list[Kill], w: Windows, stem: Path) -> list[Path]:
    # Imported here: matplotlib is a dev extra, and --no-plot runs without it.
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    roles = sorted({s.role for s in samples})
    colors = {r: plt.get_cmap("tab10")(i % 10) for i, r in enumerate(roles)}

    def series(ax: object, value: str, ylabel: str) -> None:
        for r in roles:
            for pid in sorted({s.pid for s in samples if s.role == r}):
                pts = [s for s in samples if s.pid == pid and s.role == r]
                first = pid == min(s.pid for s in samples if s.role == r)
                ax.plot(  # type: ignore[attr-defined]
                    [s.t for s in pts],
                    [getattr(s, value) / (1024 if value.endswith("_kb") else 1) for s in pts],
                    color=colors[r],
                    label=r if first else None,
                    marker=".",
                    markersize=3,
                )
        for k in kills:
            ax.axvline(k.t, color="red", alpha=0.3, linestyle="--")  # type: ignore[attr-defined]
        ax.axvspan(0, w.warmup, color="grey", alpha=0.1)  # type: ignore[attr-defined]
        ax.set_ylabel(ylabel)  # type: ignore[attr-defined]
        ax.grid(alpha=0.3)  # type: ignore[attr-defined]

    out = []
    fig, axes = plt.subplots(2, 1, figsize=(11, 8), sharex=True)
    series(axes[0], "own_kb", "own RSS (MB): less .gguf and shmem")
    series(axes[1], "rss_kb", "RSS (MB)")
    axes[0].set_title("llamad processes; dashed red: a worker SIGKILLed; grey: warm-up")
    axes[0].legend(loc="upper left", fontsize=8, ncol=4)
    axes[1].set_xlabel("seconds since the load began")
    out.append(stem.with_name(stem.name + "-rss.png"))
    fig.tight_layout()
    fig.savefig(out[-1], dpi=90)
    plt.close(fig)
    fig, axes = plt.subplots(2, 1, figsize=(11, 7), sharex=True)
    series(axes[0], "fds", "open fds")
    series(axes[1], "threads", "threads")
    axes[0].set_title("fds and threads per llamad process")
    axes[0].legend(loc="upper left", fontsize=8, ncol=4)
    axes[1].set_xlabel("seconds since the load began")
    out.append(stem.with_name(stem.name + "-fds-threads.png"))
    fig.tight_layout()
    fig.savefig(out[-1], dpi=90)
    plt.close(fig)
    return out


# -- the run -------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    duration = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(120.0, duration / 5)
    span = min(30.0, duration / 10)
    # Each model loses a worker every two periods: compare fresh workers at
    # an age every one of them reaches (loading takes some of the period).
    age = args.kill_every
    ledger = Ledger()
    stop_load, stop_watch = threading.Event(), threading.Event()
    load_start = os.getloadavg()
    with soak_daemon(args.ram_quota, args.ram_file_quota, args.disk_quota, args.keep) as d:
        with Client(d.endpoint, timeout=60) as c:
            vocab: Vocab = build_vocab(c, next(iter(MODELS)))
        t0, wall_t0 = time.monotonic(), time.time()
        sampler = Sampler(d.pid, t0, stop_watch)
        killer = Killer(d, args.kill_every, t0, duration)
        load = Load(d.endpoint, list(MODELS), vocab, ledger, stop_load)
        workers = [Worker(n, load) for n in range(THREADS)]
        threads = [threading.Thread(target=w.run, name=f"soak-{w.n}", daemon=True) for w in workers]
        threads.append(
            threading.Thread(
                target=run_async_clients,
                args=(ASYNC_TASKS, load),
                name="soak-async",
                daemon=True,
            )
        )
        sampler.start()
        killer.start()
        for t in threads:
            t.start()
        while (left := t0 + duration - time.monotonic()) > 0:
            time.sleep(min(left, 10))
            done = ledger.summary().total
            print(
                f"  {time.monotonic() - t0:5.0f} s: {done.started} started, {done.served} served, "
                f"{done.errors} errors, {len(killer.kills)} kills",
                flush=True,
            )
        killer.join(130)
        stop_load.set()
        deadline = time.monotonic() + 150  # a stuck request ends at its 120 s timeout
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in threads if t.is_alive()]
        stop_watch.set()
        sampler.join(10)
        end_t = time.monotonic() - t0
        sampler.once()
        with Client(d.endpoint, timeout=60) as c:
            infos = {m: c.model_info(m) for m in MODELS}
            counters = c.counters()
        problems = d.log_problems()
        exits = d.exits(wall_t0)
        exit_code = d.stop()
    w = Windows(warmup=warmup, span=span, end=end_t, age=age)
    day = machine()["date"][:10]
    plots: list[Path] = []
    if not args.no_plot:
        out = results_dir() if args.record else Path(tempfile.gettempdir())
        out.mkdir(parents=True, exist_ok=True)
        plots = plot(sampler.samples, killer.kills, w, out / f"soak-{day}")
        print("plots: " + ", ".join(str(p) for p in plots))
    params = {
        "minutes": args.minutes,
        "kill_every_s": args.kill_every,
        "warmup_s": warmup,
        "span_s": span,
        "age_s": age,
        "ram_quota": args.ram_quota,
        "ram_file_quota": args.ram_file_quota,
        "disk_quota": args.disk_quota,
        "models": MODELS,
        "threads": THREADS,
        "async_tasks": ASYNC_TASKS,
        "load_start": load_start[0],
        "plots": [p.name for p in plots],
    }
    data = {
        "end_s": end_t,
        "samples": [soak_report.sample_data(s) for s in sampler.samples],
        "fd_kinds": soak_report.picked_fds(sampler.samples, sampler.fds, w),
        "load": sampler.load,
        "kills": [[k.t, k.model, k.pid, k.back_s] for k in killer.kills],
        "exits": [[e.t, e.child, e.pid, e.how] for e in exits],
        "requests": ledger.requests(),
        "models": {
            m: {
                "state": i.state.value,
                "restarts": i.restarts,
                "error": None if i.error is None else str(i.error),
            }
            for m, i in infos.items()
        },
        "counters": {k: counters.get(k, 0) for k in CACHE_COUNTERS},
        "log_problems": problems,
        "exit_code": exit_code,
        "stuck": stuck,
    }
    bars = soak_report.run_bars(params, data)
    for b in bars:
        print(f"{b.verdict:>12}  {b.name}: {b.value}")
    if args.record:
        title = "Load and soak (bench/soak.py)"
        print(f"recorded {record('soak', title, RENDER, params, data)}")
    else:
        print(show(RENDER, params, data))
    return 0 if all(b.verdict == "met" for b in bars) else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--kill-every", type=float, default=60.0, help="seconds between kills")
    ap.add_argument(
        "--warmup", type=float, default=None, help="seconds (default: 2 min, at most a fifth)"
    )
    ap.add_argument("--ram-quota", default="32MiB")
    ap.add_argument("--ram-file-quota", default="32MiB")
    ap.add_argument("--disk-quota", default="64MiB")
    ap.add_argument("--no-record", dest="record", action="store_false")
    ap.add_argument("--no-plot", action="store_true", help="no PNGs (no matplotlib needed)")
    ap.add_argument("--keep", action="store_true", help="keep the daemon's directory (its log)")
    return run(ap.parse_args())


if __name__ == "__main__":
    sys.exit(main())
