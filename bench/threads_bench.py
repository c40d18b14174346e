"""Threads on a shared machine (SPEC M14, issue 8 item 11): decode beside CPU hogs and a peer.

    python -m bench.threads_bench [--rounds 5] [--seconds 4] [--no-record]
    python -m bench.threads_bench --matrix [--rounds 3] [--seconds 2] [--no-record]

A *loop* is a worker-like decode loop in its own process: the default model,
one ``kv_unified`` context, a prompt prefilled, then one-row greedy decode
steps (batch, ``llama_decode``, sample) for ``--seconds`` of wall time; its
figure is decoded tokens per second. Each loop runs in one of two modes:

* ``plain``: the binding as it was before M14: every core as threads
  (``default_threads``), libgomp's default barrier spin (``GOMP_SPINCOUNT``
  300000, what libgomp uses when nothing is set), no governor;
* ``governed``: the M14 mechanism: the binding's bounded spin
  (:mod:`llamad.llama_ffi.spin`), a :class:`~llamad.model.threads.ThreadGovernor`
  around every decode, and a :class:`~llamad.model.thread_board.ThreadBoard`
  shared by the loops of one cell.

Scenarios, for each mode, in every round (order alternating between rounds):
``quiet``, one loop alone; ``hogs_first``, one loop started while a CPU hog
(``bench.hogs``) already runs on every core (the issue's repro: ggml's
threads are placed on busy cores); ``hogs_later``, the hogs start once the
loop is warm; ``pair``, two loops at once. Per round and mode the ratios are
each hog scenario's tok/s over ``quiet`` (bar >= 0.25) and ``pair``'s total
over ``quiet`` (bar >= 0.9). The verdict is computed here, as in ``bench/ffi_bench.py``: "met" only
when every round's ratio clears the bar, "BELOW BAR" when none does, "within
noise" when the bar lies inside the spread. Results are recorded only by this
script. Hogs are killed however a round ends.

``--matrix`` records the investigation behind the mechanism
(``docs/internals/threads.md``): one loop per configuration (thread count,
libgomp spin, ggml threadpool settings), no governor, quiet and started
beside a hog per core, in alternating rounds; per configuration the median ms per token
quiet and under hogs and the worst single step under hogs.

The machine is shared: other processes may run beside the bench, so the load
average at each round's start is recorded with the results.

Recorded (``threads-<date>.json``, ``threads-matrix-<date>.json`` beside the
``.md``): every round's load average and every loop's own result (tok/s,
tokens, worst step, spin, the governor's counts); :func:`render` and
:func:`render_matrix` compute the tables, ratios and verdicts from them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from bench.common import median, record, show, table
from bench.hogs import Hogs
from llamad import paths
from llamad.llama_ffi import Batch, ContextOptions, Model, Sampler, SamplerParams, default_threads
from llamad.llama_ffi.spin import spin_setting
from llamad.llama_ffi.threadpool import Threadpool, ThreadpoolOptions
from llamad.model.thread_board import ThreadBoard
from llamad.model.threads import ThreadGovernor, ThreadPolicy

HOGS_BAR = 0.25  # decode tok/s with a hog on every core / quiet, at least
PAIR_BAR = 0.9  # two busy loops' total tok/s / one loop alone, at least
MIN_ROUNDS = 5
WARMUP_STEPS = 40
WARMUP_MAX_S = 3.0
STARTING_STEPS = 2  # warm-up of a loop started among hogs: first page faults only
LIBGOMP_DEFAULT_SPIN = "300000"
MODES = ("plain", "governed")
SCENARIOS = ("quiet", "hogs_first", "hogs_later", "pair")
HOG_SCENARIOS = ("hogs_first", "hogs_later")
# --matrix: name -> loop settings (threads: default every core; env for libgomp;
# pool: ThreadpoolOptions fields of an attached ggml threadpool).
_DEFAULT_SPIN = {"GOMP_SPINCOUNT": LIBGOMP_DEFAULT_SPIN}
_SPIN_ENV = ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "LLAMAD_GOMP_SPINCOUNT")
MATRIX: dict[str, dict[str, Any]] = {
    "1 thread": {"threads": 1},
    "2 threads, libgomp default spin (300000)": {"env": _DEFAULT_SPIN},
    "2 threads, OMP_WAIT_POLICY=passive": {"env": {"OMP_WAIT_POLICY": "passive"}},
    "2 threads, GOMP_SPINCOUNT=1000": {"env": {"GOMP_SPINCOUNT": "1000"}},
    "2 threads, GOMP_SPINCOUNT=3000 (binding default)": {},
    "2 threads, GOMP_SPINCOUNT=10000": {"env": {"GOMP_SPINCOUNT": "10000"}},
    "2 threads, GOMP_SPINCOUNT=30000": {"env": {"GOMP_SPINCOUNT": "30000"}},
    "2 threads, threadpool poll=0, default spin": {"env": _DEFAULT_SPIN, "pool": {"poll": 0}},
    "2 threads, threadpool prio=low, default spin": {
        "env": _DEFAULT_SPIN,
        "pool": {"priority": "low"},
    },
    "2 threads, threadpool pinned (strict_cpu), default spin": {
        "env": _DEFAULT_SPIN,
        "pool": {"cpus": "all", "strict_cpu": True},
    },
}
# The loops' own lines on stdout, among whatever structlog prints there.
_READY = "@@ready"
_RESULT = "@@result "
PROMPT = "The history of the lighthouse begins with fires lit on hills above the sea."
RENDER = "bench.threads_bench:render"
RENDER_MATRIX = "bench.threads_bench:render_matrix"


def verdict(ratios: list[float], bar: float) -> str:
    """Met only if every round clears the bar; within noise if the bar is inside the spread."""
    lo, hi = min(ratios), max(ratios)
    if lo >= bar:
        return "met"
    return "BELOW BAR" if hi < bar else "within noise"


# -- the loop (child process) ---------------------------------------------------------


def run_loop(cfg: dict[str, Any]) -> None:
    """One worker-like decode loop; talks to the parent over stdin/stdout lines."""
    threads = int(cfg.get("threads") or default_threads())
    model = Model(paths.default_model_path())
    ctx = model.context(
        ContextOptions(
            n_ctx=4096, n_batch=64, n_ubatch=64, n_threads=threads, n_threads_batch=threads
        )
    )
    sampler = Sampler(model, SamplerParams(greedy=True))
    board = ThreadBoard(cfg["board"]) if cfg["mode"] == "governed" else None
    governor = (
        ThreadGovernor(ThreadPolicy(max_threads=threads), board=board)
        if board is not None
        else None
    )
    pool = None
    if cfg.get("pool") is not None:
        fields = dict(cfg["pool"])
        if fields.get("cpus") == "all":
            fields["cpus"] = tuple(sorted(os.sched_getaffinity(0)))
        pool = Threadpool(ThreadpoolOptions(n_threads=threads, **fields))
        ctx.attach_threadpool(pool)
    batch = Batch(1)
    ctx.prefill(model.tokenize(PROMPT))
    pos = ctx.next_pos(0)
    current = threads

    def step() -> float:
        nonlocal pos, current
        token = ctx.sample(sampler, -1)
        batch.clear()
        batch.add(token, pos, 0, logits=True)
        if governor is not None:
            n = governor.threads_for(1)
            if n != current:
                ctx.set_threads(n)
                current = n
        t0 = time.perf_counter()
        ctx.decode(batch)
        took = time.perf_counter() - t0
        if governor is not None:
            governor.record(1, took)
        pos += 1
        return took

    # Page faults; the governor's baseline and first exploration. Bounded in
    # time too: a collapsing loop may take seconds per step.
    warm_until = time.perf_counter() + WARMUP_MAX_S
    for _ in range(int(cfg.get("warmup", WARMUP_STEPS))):
        step()
        if time.perf_counter() > warm_until:
            break
    print(_READY, flush=True)
    sys.stdin.readline()  # "go"
    deadline = time.perf_counter() + cfg["seconds"]
    t0 = time.perf_counter()
    n = 0
    worst = 0.0
    while time.perf_counter() < deadline and pos < ctx.n_ctx - 1:
        worst = max(worst, step())
        n += 1
    elapsed = time.perf_counter() - t0
    status = governor.status() if governor is not None else None
    print(
        _RESULT
        + json.dumps(
            {
                "tok_s": n / elapsed,
                "tokens": n,
                "worst_step_s": worst,
                "spin": spin_setting().value,
                "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                "fallbacks": status.fallbacks if status else None,
                "collapses": status.collapses if status else None,
                "probes": status.probes if status else None,
                "probes_kept": status.probes_kept if status else None,
                "explorations": status.explorations if status else None,
                "explorations_kept": status.explorations_kept if status else None,
                "threads_end": status.threads if status else current,
            }
        ),
        flush=True,
    )
    if board is not None:
        board.close()
    if pool is not None:
        ctx.detach_threadpool()
        pool.close()
    sampler.close()
    ctx.close()
    model.close()


# -- the parent ------------------------------------------------------------------------


def _child_env(extra: dict[str, str]) -> dict[str, str]:
    # This process loaded the binding too (which set its own bound): each
    # loop gets its own spin settings explicitly.
    env = {k: v for k, v in os.environ.items() if k not in _SPIN_ENV}
    env["LLAMAD_LOG_LEVEL"] = env.get("LLAMAD_LOG_LEVEL", "error")
    env.update(extra)
    return env


def _stop(procs: list[subprocess.Popen[Any]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=10)


@dataclass
class Cell:
    mode: str
    scenario: str
    results: list[dict[str, Any]]  # one per loop

    @property
    def total(self) -> float:
        return sum(float(r["tok_s"]) for r in self.results)


def run_loops(
    cfg: dict[str, Any], env: dict[str, str], n_loops: int, hogs: int, *, hogs_first: bool
) -> list[dict[str, Any]]:
    """Start ``n_loops`` loops, wait until all are warm, go; ``hogs`` hogs run
    from before the loops start (``hogs_first``) or from the go."""
    line = json.dumps(cfg)
    loops: list[subprocess.Popen[str]] = []
    hog_procs = Hogs(hogs)
    try:
        if hogs and hogs_first:
            hog_procs.start()
        for _ in range(n_loops):
            loops.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.threads_bench", "--loop", line],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=_child_env(env),
                )
            )
        for p in loops:
            assert p.stdout is not None
            for out_line in p.stdout:
                if out_line.strip() == _READY:
                    break
            else:
                raise RuntimeError(f"a loop ({line}) exited before it was ready")
        if hogs and not hogs_first:
            hog_procs.start()
            time.sleep(0.2)  # let the hogs reach the run queues
        for p in loops:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in loops:
            out, _ = p.communicate(timeout=cfg["seconds"] + 120)
            found = [ln for ln in out.splitlines() if ln.startswith(_RESULT)]
            if not found:
                raise RuntimeError(f"a loop ({line}) ended without a result (exit {p.returncode})")
            results.append(json.loads(found[-1][len(_RESULT) :]))
        return results
    finally:
        hog_procs.stop()
        _stop(loops)


def run_cell(mode: str, scenario: str, seconds: float, cores: int, tmp: Path) -> Cell:
    """One mode in one scenario: its loops share a fresh thread board."""
    board = tmp / f"threads-{mode}-{scenario}-{time.monotonic_ns()}"
    # A loop started among hogs is measured from its first steps: that is
    # where the issue saw ggml's threads collapse (placed on busy cores).
    warmup = STARTING_STEPS if scenario == "hogs_first" else WARMUP_STEPS
    cfg = {"mode": mode, "seconds": seconds, "board": str(board), "warmup": warmup}
    env = _DEFAULT_SPIN if mode == "plain" else {}
    n_loops = 2 if scenario == "pair" else 1
    hogs = cores if scenario in ("hogs_first", "hogs_later") else 0
    results = run_loops(cfg, env, n_loops, hogs, hogs_first=scenario == "hogs_first")
    return Cell(mode, scenario, results)


def spread(values: list[float], fmt: str) -> str:
    return f"{median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def run_matrix(rounds: int, seconds: float, cores: int) -> list[dict[str, Any]]:
    """The investigation: every MATRIX configuration quiet and beside hogs; per
    round, its load average and each configuration's two loop results."""
    names = list(MATRIX)
    out: list[dict[str, Any]] = []
    for i in range(rounds):
        got: dict[str, Any] = {"load": os.getloadavg()[0], "configs": {}}
        for name in names if i % 2 == 0 else list(reversed(names)):
            spec = MATRIX[name]
            cfg = {
                "mode": "fixed",
                "seconds": seconds,
                "threads": spec.get("threads"),
                "pool": spec.get("pool"),
            }
            env = spec.get("env", {})
            q = run_loops(cfg, env, 1, 0, hogs_first=False)[0]
            h = run_loops({**cfg, "warmup": STARTING_STEPS}, env, 1, cores, hogs_first=True)[0]
            got["configs"][name] = {"quiet": q, "hogs": h}
            print(
                f"round {i + 1}/{rounds} {name}: {1e3 / float(q['tok_s']):.1f} ms/token quiet, "
                f"{1e3 / float(h['tok_s']):.1f} beside hogs",
                file=sys.stderr,
                flush=True,
            )
        out.append(got)
    return out


def loads(rounds: list[dict[str, Any]]) -> str:
    """Each round's load average at its start."""
    return ", ".join(f"{r['load']:.2f}" for r in rounds)


def render_matrix(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The investigation's body from :func:`run_matrix`'s rounds and :func:`main`'s params."""
    rounds = data["rounds"]
    names = list(rounds[0]["configs"])

    def ms(name: str, which: str) -> list[float]:
        return [1e3 / float(r["configs"][name][which]["tok_s"]) for r in rounds]

    def worst(name: str) -> list[float]:
        return [1e3 * float(r["configs"][name]["hogs"]["worst_step_s"]) for r in rounds]

    best_quiet = min(median(ms(n, "quiet")) for n in names)
    rows = [
        [
            name,
            spread(ms(name, "quiet"), ".1f"),
            spread(ms(name, "hogs"), ".1f"),
            f"{max(worst(name)):.0f}",
            f"{best_quiet / median(ms(name, 'hogs')):.3f}",
        ]
        for name in names
    ]
    matrix_table = table(
        [
            "configuration",
            "quiet ms/token (range)",
            "beside hogs ms/token (range)",
            "worst step beside hogs, ms",
            "hogs speed / best quiet",
        ],
        rows,
    )
    cores = params["cores"]
    settings = (
        f"model `default`, {cores} cores, {params['rounds']} alternating rounds; per "
        f"configuration and round one loop quiet, then one started beside {cores} "
        f"busy-loop hogs (bench.hogs), each {params['seconds']:g} s of one-row greedy decode after "
        f"{params['warmup_steps']} warm-up steps quiet, {params['starting_steps']} beside hogs, "
        "no governor. ms/token: median (range) over rounds. Last column: the best quiet "
        "configuration's median speed against this one's beside hogs. Load average (1 min) "
        f"at each round's start: {loads(rounds)}."
    )
    return f"{settings}\n\n{matrix_table}\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=None, help="alternating rounds (5; matrix 3)")
    ap.add_argument("--seconds", type=float, default=None, help="decode time per loop (4; 2)")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--matrix", action="store_true", help="the investigation's configurations")
    ap.add_argument("--loop", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        run_loop(json.loads(args.loop))
        return
    n_rounds = args.rounds if args.rounds is not None else (3 if args.matrix else MIN_ROUNDS)
    seconds = args.seconds if args.seconds is not None else (2.0 if args.matrix else 4.0)
    need = 3 if args.matrix else MIN_ROUNDS
    if n_rounds < need and not args.no_record:
        ap.error(f"a recorded result needs --rounds >= {need} (or pass --no-record)")
    if n_rounds < 1 or seconds <= 0:
        ap.error("--rounds must be >= 1 and --seconds > 0")
    cores = len(os.sched_getaffinity(0))
    params = {
        "cores": cores,
        "rounds": n_rounds,
        "seconds": seconds,
        "warmup_steps": WARMUP_STEPS,
        "warmup_max_s": WARMUP_MAX_S,
        "starting_steps": STARTING_STEPS,
    }
    if args.matrix:
        data = {"rounds": run_matrix(n_rounds, seconds, cores)}
        print(show(RENDER_MATRIX, params, data))
        if not args.no_record:
            title = "Threads on a shared machine: the investigation (SPEC M14, issue 8)"
            print(f"recorded {record('threads-matrix', title, RENDER_MATRIX, params, data)}")
        return
    cells = [(m, s) for s in SCENARIOS for m in MODES]
    rounds: list[dict[str, Any]] = []
    with TemporaryDirectory(prefix="llamad-threads-bench-") as tmp:
        for i in range(n_rounds):
            load = os.getloadavg()[0]
            order = cells if i % 2 == 0 else list(reversed(cells))
            got = {(m, s): run_cell(m, s, seconds, cores, Path(tmp)) for m, s in order}
            rounds.append(
                {
                    "load": load,
                    "cells": {m: {s: got[m, s].results for s in SCENARIOS} for m in MODES},
                }
            )
            summary = ", ".join(f"{m}/{s} {got[m, s].total:.1f}" for m, s in cells)
            print(f"round {i + 1}/{n_rounds}: tok/s {summary}", file=sys.stderr, flush=True)
    data = {"rounds": rounds}
    print(show(RENDER, params, data))
    if not args.no_record:
        title = "Threads on a shared machine (SPEC M14, issue 8)"
        print(f"recorded {record('threads', title, RENDER, params, data)}")


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body from :func:`main`'s ``params`` and ``data``: per round,
    its load average and every cell's loop results (``cells[mode][scenario]``)."""
    rounds = [
        {(m, s): Cell(m, s, results) for m, by in r["cells"].items() for s, results in by.items()}
        for r in data["rounds"]
    ]

    def totals(mode: str, scenario: str) -> list[float]:
        return [r[mode, scenario].total for r in rounds]

    def stat(mode: str, scenario: str, key: str) -> str:
        vals = [
            int(x[key]) for r in rounds for x in r[mode, scenario].results if x[key] is not None
        ]
        return spread([float(v) for v in vals], ".0f") if vals else "-"

    rows = []
    for scenario in SCENARIOS:
        for mode in MODES:
            rows.append(
                [
                    scenario,
                    mode,
                    spread(totals(mode, scenario), ".1f"),
                    stat(mode, scenario, "threads_end"),
                    stat(mode, scenario, "collapses"),
                    stat(mode, scenario, "fallbacks"),
                    f"{stat(mode, scenario, 'probes')} / {stat(mode, scenario, 'probes_kept')}",
                    f"{stat(mode, scenario, 'explorations')} / "
                    f"{stat(mode, scenario, 'explorations_kept')}",
                ]
            )
    speed_table = table(
        [
            "scenario",
            "mode",
            "tok/s, all loops (range)",
            "threads at end",
            "collapses",
            "fallbacks",
            "probes / kept",
            "explorations / kept",
        ],
        rows,
    )
    bar_rows = []
    for mode in MODES:
        for scenario in HOG_SCENARIOS:
            hogs = [r[mode, scenario].total / r[mode, "quiet"].total for r in rounds]
            bar_rows.append(
                [
                    mode,
                    f"{scenario} / quiet (bar >= {HOGS_BAR})",
                    f"{median(hogs):.3f}",
                    f"{min(hogs):.3f}-{max(hogs):.3f}",
                    verdict(hogs, HOGS_BAR),
                ]
            )
        pair = [r[mode, "pair"].total / r[mode, "quiet"].total for r in rounds]
        bar_rows.append(
            [
                mode,
                f"two busy / one alone (bar >= {PAIR_BAR})",
                f"{median(pair):.3f}",
                f"{min(pair):.3f}-{max(pair):.3f}",
                verdict(pair, PAIR_BAR),
            ]
        )
    quiet_cost = [r["governed", "quiet"].total / r["plain", "quiet"].total for r in rounds]
    bar_table = table(["mode", "ratio", "median", "spread", "verdict"], bar_rows)
    spins = sorted(
        {
            f"{mode}: {x['spin']} (GOMP_SPINCOUNT={x['gomp_spincount']})"
            for r in rounds
            for (mode, _), cell in r.items()
            for x in cell.results
        }
    )
    cores = params["cores"]
    settings = (
        f"model `default`, {cores} cores, {params['rounds']} alternating rounds, "
        f"{params['seconds']:g} s of one-row greedy decode per loop after "
        f"{params['warmup_steps']} warm-up steps (or {params['warmup_max_s']:g} s; "
        f"{params['starting_steps']} in `hogs_first`); "
        f"hogs: {cores} busy-loop processes (bench.hogs), started before the loop "
        "(`hogs_first`) or once it is warm (`hogs_later`). tok/s: median (range) over rounds of "
        "the cell's total (both loops in `pair`). Ratios are per round against the same "
        "mode's quiet loop; spread: their range. Verdict: met if the whole spread clears the "
        "bar, within noise if the bar lies inside it.\n\n"
        f"Spin per mode: {'; '.join(spins)}. Load average (1 min) at each round's start: "
        f"{loads(data['rounds'])}."
    )
    note = f"Quiet cost of the mechanism (governed / plain, quiet): {spread(quiet_cost, '.3f')}."
    return f"{settings}\n\n{speed_table}\n\n{bar_table}\n\n{note}\n"


if __name__ == "__main__":
    main()
