"""Threads on a shared machine (SPEC M14, issue 8 item 11): decode beside CPU hogs and a peer.

    python -m bench.threads_bench [--rounds 5] [--seconds 4] [--no-record]

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
one loop on a quiet machine; one loop with a CPU hog (``while True: pass``)
on every core; two loops at once. Per round and mode two ratios are computed:
``hogs / quiet`` (bar >= 0.25) and ``two loops' total / one alone`` (bar >=
0.9). The verdict is computed here, as in ``bench/ffi_bench.py``: "met" only
when every round's ratio clears the bar, "BELOW BAR" when none does, "within
noise" when the bar lies inside the spread. Results are recorded only by this
script. Hogs are killed however a round ends.

The machine is shared: other processes may run beside the bench, so the load
average at each round's start is recorded with the results.
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

from bench.common import median, record, table
from llamad import paths
from llamad.llama_ffi import Batch, ContextOptions, Model, Sampler, SamplerParams, default_threads
from llamad.llama_ffi.spin import spin_setting
from llamad.model.thread_board import ThreadBoard
from llamad.model.threads import ThreadGovernor, ThreadPolicy

HOGS_BAR = 0.25  # decode tok/s with a hog on every core / quiet, at least
PAIR_BAR = 0.9  # two busy loops' total tok/s / one loop alone, at least
MIN_ROUNDS = 5
WARMUP_STEPS = 40
LIBGOMP_DEFAULT_SPIN = "300000"
MODES = ("plain", "governed")
SCENARIOS = ("quiet", "hogs", "pair")
# The loops' own lines on stdout, among whatever structlog prints there.
_READY = "@@ready"
_RESULT = "@@result "
PROMPT = "The history of the lighthouse begins with fires lit on hills above the sea."


def verdict(ratios: list[float], bar: float) -> str:
    """Met only if every round clears the bar; within noise if the bar is inside the spread."""
    lo, hi = min(ratios), max(ratios)
    if lo >= bar:
        return "met"
    return "BELOW BAR" if hi < bar else "within noise"


# -- the loop (child process) ---------------------------------------------------------


def run_loop(cfg: dict[str, Any]) -> None:
    """One worker-like decode loop; talks to the parent over stdin/stdout lines."""
    threads = default_threads()
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
    batch = Batch(1)
    ctx.prefill(model.tokenize(PROMPT))
    pos = ctx.next_pos(0)
    current = threads

    def step() -> None:
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
            governor.record(1, time.perf_counter() - t0)
        else:
            ctx.decode(batch)
        pos += 1

    for _ in range(WARMUP_STEPS):  # page faults; the governor's baseline and first exploration
        step()
    print(_READY, flush=True)
    sys.stdin.readline()  # "go"
    deadline = time.perf_counter() + cfg["seconds"]
    t0 = time.perf_counter()
    n = 0
    while time.perf_counter() < deadline and pos < ctx.n_ctx - 1:
        step()
        n += 1
    elapsed = time.perf_counter() - t0
    status = governor.status() if governor is not None else None
    print(
        _RESULT
        + json.dumps(
            {
                "tok_s": n / elapsed,
                "tokens": n,
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
    sampler.close()
    ctx.close()
    model.close()


# -- the parent ------------------------------------------------------------------------


def _child_env(mode: str) -> dict[str, str]:
    # This process loaded the binding too (which set its own bound): each
    # loop gets its mode's spin explicitly.
    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    env["LLAMAD_LOG_LEVEL"] = env.get("LLAMAD_LOG_LEVEL", "error")
    if mode == "plain":
        env["GOMP_SPINCOUNT"] = LIBGOMP_DEFAULT_SPIN
    return env


def _hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


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


def run_cell(mode: str, scenario: str, seconds: float, cores: int, tmp: Path) -> Cell:
    """Start the cell's loops, wait until all are warm, add hogs if asked, go."""
    board = tmp / f"threads-{mode}-{scenario}-{time.monotonic_ns()}"
    cfg = json.dumps({"mode": mode, "seconds": seconds, "board": str(board)})
    n_loops = 2 if scenario == "pair" else 1
    loops: list[subprocess.Popen[str]] = []
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n_loops):
            loops.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.threads_bench", "--loop", cfg],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env=_child_env(mode),
                )
            )
        for p in loops:
            assert p.stdout is not None
            for line in p.stdout:
                if line.strip() == _READY:
                    break
            else:
                raise RuntimeError(f"a {mode} loop exited before it was ready")
        if scenario == "hogs":
            hogs = _hogs(cores)
            time.sleep(0.2)  # let the hogs reach the run queues
        for p in loops:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in loops:
            out, _ = p.communicate(timeout=seconds + 120)
            found = [ln for ln in out.splitlines() if ln.startswith(_RESULT)]
            if not found:
                raise RuntimeError(f"a {mode} loop ended without a result (exit {p.returncode})")
            results.append(json.loads(found[-1][len(_RESULT) :]))
        return Cell(mode, scenario, results)
    finally:
        _stop(hogs)
        _stop(loops)


def spread(values: list[float], fmt: str) -> str:
    return f"{median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help="alternating rounds")
    ap.add_argument("--seconds", type=float, default=4.0, help="decode time per loop")
    ap.add_argument("--no-record", action="store_true")
    ap.add_argument("--loop", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loop:
        run_loop(json.loads(args.loop))
        return
    if args.rounds < MIN_ROUNDS and not args.no_record:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    if args.rounds < 1 or args.seconds <= 0:
        ap.error("--rounds must be >= 1 and --seconds > 0")
    cores = len(os.sched_getaffinity(0))
    cells = [(m, s) for s in SCENARIOS for m in MODES]
    rounds: list[dict[tuple[str, str], Cell]] = []
    loads: list[float] = []
    with TemporaryDirectory(prefix="llamad-threads-bench-") as tmp:
        for i in range(args.rounds):
            loads.append(os.getloadavg()[0])
            order = cells if i % 2 == 0 else list(reversed(cells))
            got = {(m, s): run_cell(m, s, args.seconds, cores, Path(tmp)) for m, s in order}
            rounds.append(got)
            summary = ", ".join(f"{m}/{s} {got[m, s].total:.1f}" for m, s in cells)
            print(f"round {i + 1}/{args.rounds}: tok/s {summary}", file=sys.stderr, flush=True)

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
        hogs = [r[mode, "hogs"].total / r[mode, "quiet"].total for r in rounds]
        pair = [r[mode, "pair"].total / r[mode, "quiet"].total for r in rounds]
        bar_rows.append(
            [
                mode,
                f"hogs / quiet (bar >= {HOGS_BAR})",
                f"{median(hogs):.3f}",
                f"{min(hogs):.3f}-{max(hogs):.3f}",
                verdict(hogs, HOGS_BAR),
            ]
        )
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
    settings = (
        f"model `default`, {cores} cores, {args.rounds} alternating rounds, "
        f"{args.seconds:g} s of one-row greedy decode per loop after {WARMUP_STEPS} warm-up "
        "steps (before any hog starts); "
        f"hogs: {cores} `while True: pass` processes. tok/s: median (range) over rounds of "
        "the cell's total (both loops in `pair`). Ratios are per round against the same "
        "mode's quiet loop; spread: their range. Verdict: met if the whole spread clears the "
        "bar, within noise if the bar lies inside it.\n\n"
        f"Spin per mode: {'; '.join(spins)}. Load average (1 min) at each round's start: "
        f"{', '.join(f'{x:.2f}' for x in loads)}."
    )
    note = f"Quiet cost of the mechanism (governed / plain, quiet): {spread(quiet_cost, '.3f')}."
    body = f"{settings}\n\n{speed_table}\n\n{bar_table}\n\n{note}\n"
    print(body)
    if not args.no_record:
        title = "Threads on a shared machine (SPEC M14, issue 8)"
        print(f"recorded {record('threads', title, body)}")


if __name__ == "__main__":
    main()
