"""Per-step overhead probe (issue 21 item 1): a real worker decoding 1 and 4 streams.

    python -m bench.step_probe [--tokens 200] [--threads 1] [--profile FILE]
        [--timing [--cpu]]

Starts one real model worker (the default GGUF, no cache: ``NoCache``, so no
save competes with the decode) as a child process of this one, in the tree
this module is imported from, and drives it with
:class:`~llamad.model.worker_client.WorkerClient` from this process: one
greedy stream of ``--tokens`` tokens, then four at once (one thread and one
connection each, as the peers bench's P3). It prints the decode rate the
client sees (tokens over the window from the last first token to the first
last token, as the peers bench's ``steady_rate``) and, from the worker's own
counters, its time outside ``llama_decode`` per step.

``--timing`` wraps the loop's parts and prints each one's microseconds per
step (``--cpu``: the loop thread's CPU time instead of wall). Two things
read high there. ``llama_decode`` is a mean over every decode of the phase,
the prompt's included (~0.7 ms a step at 1 stream over 300 tokens). And
each wrapper adds two clock reads and a Python call, so the parts, and
``loop.step - llama_decode``, overstate the loop's own time: 300-370 us at 1
stream, where a sampling profiler (``py-spy record --nonblocking``) found
~180 us a token outside the decode. Compare two trees with it; do not read
it as the cost.

``--profile FILE`` runs the worker's loop under cProfile and dumps the stats
there on exit (the profiler's own cost inflates every Python figure: use it
to see where the time goes, not how much it is). Not a recorded bench: it
writes no result file; the issue's figures come from the peers bench.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llamad.actors import Registry
from llamad.model.results import TokenEvent
from llamad.model.worker_client import WorkerClient

if TYPE_CHECKING:
    from llamad.model.worker_spec import WorkerSpec


def _spec(root: str, threads: int) -> WorkerSpec:
    from llamad.llama_ffi import ContextOptions  # noqa: PLC0415
    from llamad.model.config import WorkerConfig  # noqa: PLC0415
    from llamad.model.threads import ThreadPolicy  # noqa: PLC0415
    from llamad.model.worker_spec import WorkerSpec  # noqa: PLC0415
    from llamad.paths import default_model_path  # noqa: PLC0415

    sizes = {"n_ctx": 4096, "n_batch": 512, "n_seq_max": 4}
    return WorkerSpec(
        model_id="probe",
        model_path=str(default_model_path()),
        context=ContextOptions(
            **sizes, n_ubatch=512, kv_unified=True, n_threads=threads, n_threads_batch=threads
        ),
        worker=WorkerConfig(**sizes),
        cache=None,
        threads=ThreadPolicy(max_threads=threads, cores=threads),
        registry_root=root,
    )


def _time_parts(proc: Any, out: Path, clock: Callable[[], float] = time.perf_counter) -> None:
    """Wrap the loop's parts in ``clock`` accumulators (a few hundred ns
    each), written to ``out`` at every idle tick. ``time.thread_time``: the
    loop thread's CPU time, which the other processes of a loaded machine do
    not inflate (a part preempted reads as what it ran, not what it waited)."""
    totals: dict[str, list[float]] = {}

    def wrap(obj: Any, name: str, label: str) -> None:
        inner = getattr(obj, name, None)
        if inner is None:
            return  # a part this tree does not have
        acc = totals.setdefault(label, [0.0, 0])

        def timed(*a: Any, **k: Any) -> Any:
            t = clock()
            try:
                return inner(*a, **k)
            finally:
                acc[0] += clock() - t
                acc[1] += 1

        setattr(obj, name, timed)

    def wrap_poll(obj: Any, name: str) -> None:
        """As ``wrap``, with the polls that may block (a ``timeout`` other
        than 0: the loop had no work) apart, as ``actor.poll(wait)``: the
        wait for the client's next request is not loop time."""
        inner = getattr(obj, name)
        busy = totals.setdefault("actor.poll", [0.0, 0])
        wait = totals.setdefault("actor.poll(wait)", [0.0, 0])

        def timed(timeout: float | None = 0.0) -> Any:
            acc = busy if timeout == 0 else wait
            t = clock()
            try:
                return inner(timeout)
            finally:
                acc[0] += clock() - t
                acc[1] += 1

        setattr(obj, name, timed)

    backend = proc.parts.backend
    wrap(backend.ctx, "decode", "llama_decode")
    wrap(backend, "decode", "backend.decode")
    wrap(proc.core, "step", "core.step")
    wrap(proc.core, "_plan", "core._plan")
    wrap(proc.backend, "sample", "sample")
    wrap(proc, "_deliver", "deliver")
    wrap(proc, "_publish", "publish")
    wrap(proc, "snapshot", "snapshot")
    if proc.parts.threads is not None:
        wrap(proc.parts.threads, "threads_for", "governor.threads_for")
        wrap(proc.parts.threads, "record", "governor.record")
    wrap_poll(proc.actor, "poll")
    wrap(proc.ops, "settle", "ops.settle")
    wrap(proc, "step", "loop.step")
    step = proc.step

    def dump_when_idle(timeout: float | None = 0.0) -> Any:
        report = step(timeout)
        if not proc.core.requests:
            out.write_text(json.dumps(totals))
        return report

    proc.step = dump_when_idle


def child(
    root: str, threads: int, profile: str | None, timing: bool = False, cpu: bool = False
) -> None:
    """The worker, serving until SIGTERM."""
    from llamad.model.worker_proc import WorkerProcess  # noqa: PLC0415

    proc = WorkerProcess(_spec(root, threads))
    ready = Path(root) / "ready"
    if timing:
        clock = time.thread_time if cpu else time.perf_counter
        _time_parts(proc, Path(root) / "timing.json", clock)
    if profile is None:
        proc.serve(ready=ready.touch)
        return
    import cProfile  # noqa: PLC0415

    prof = cProfile.Profile()
    prof.enable()
    try:
        proc.serve(ready=ready.touch)
    finally:
        prof.disable()
        prof.dump_stats(profile)


def _stream(w: WorkerClient, prompt: str, n: int) -> list[float]:
    times: list[float] = []
    for event in w.infer(prompt, max_tokens=n, temperature=0.0):
        if isinstance(event, TokenEvent) and event.token is not None:
            times.append(time.perf_counter())
    return times


def _steady(streams: list[list[float]]) -> float:
    start = max(s[0] for s in streams)
    end = min(s[-1] for s in streams)
    count = sum(sum(1 for t in s if start < t <= end) for s in streams)
    return count / (end - start)


def drive(root: str, n: int) -> dict[str, float]:
    registry = Registry(root)
    clients = [WorkerClient("probe", registry=registry) for _ in range(4)]
    # Counting: the model goes on counting, so no stream ends early.
    prompts = [", ".join(str(100 * i + 7 + k) for k in range(30)) + ", " for i in range(4)]
    _stream(clients[0], prompts[0], 8)  # warm up
    one = _steady([_stream(clients[0], prompts[0], n)])
    timing = Path(root) / "timing.json"
    time.sleep(0.3)  # the worker's idle tick writes its totals
    after_one = json.loads(timing.read_text()) if timing.exists() else {}
    out: list[list[float]] = [[] for _ in range(4)]
    go = threading.Barrier(4)

    def run(i: int) -> None:
        go.wait()
        out[i] = _stream(clients[i], prompts[i], n)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    four = _steady(out)
    for c in clients:
        c.close()
    time.sleep(0.3)
    after_four = json.loads(timing.read_text()) if timing.exists() else {}
    if after_one:
        _print_timing("1 stream", after_one, {})
        _print_timing("4 streams", after_four, after_one)
    return {"one": one, "four": four}


def _print_timing(label: str, now: dict[str, list[float]], before: dict[str, list[float]]) -> None:
    """Per decode step: each part's microseconds (the differences since ``before``)."""
    steps = now["llama_decode"][1] - before.get("llama_decode", [0, 0])[1]
    parts = {k: (v[0] - before.get(k, [0.0, 0])[0]) * 1e6 / max(1, steps) for k, v in now.items()}
    parts["core.step - backend.decode"] = parts["core.step"] - parts["backend.decode"]
    parts["backend.decode - llama_decode"] = parts["backend.decode"] - parts["llama_decode"]
    # The loop's own time: its steps less the decodes and the waits for work.
    parts["loop.step - llama_decode"] = (
        parts["loop.step"] - parts["llama_decode"] - parts.get("actor.poll(wait)", 0.0)
    )
    print(label, f"{steps} steps, us/step:", {k: round(v, 1) for k, v in parts.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--profile", default=None)
    ap.add_argument("--timing", action="store_true", help="time the loop's parts")
    ap.add_argument(
        "--cpu", action="store_true", help="with --timing: the loop thread's CPU time, not wall"
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.threads, args.profile, args.timing, args.cpu)
        return
    root = tempfile.mkdtemp(prefix="llamad-probe-", dir="/tmp")
    cmd = [
        sys.executable,
        "-m",
        "bench.step_probe",
        "--child",
        root,
        "--threads",
        str(args.threads),
    ]
    if args.profile:
        cmd += ["--profile", args.profile]
    if args.timing:
        cmd += ["--timing"]
    if args.cpu:
        cmd += ["--cpu"]
    worker = subprocess.Popen(cmd, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while not (Path(root) / "ready").exists():
            if worker.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the worker did not start")
            time.sleep(0.05)
        rates = drive(root, args.tokens)
        rates["load"] = os.getloadavg()[0]
        print(json.dumps(rates))
    finally:
        worker.terminate()
        worker.wait(30)


if __name__ == "__main__":
    main()
