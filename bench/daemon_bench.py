"""The daemon through the public client: warm TTFT from ram and after a restart from disk,
and 8 agents sharing a prefix (issue 9; SPEC P1, P2, P6).

    python -m bench.daemon_bench [--rounds 5] [--no-record]

A real daemon (``python -m llamad.daemon --config FILE``, the config in a
private 0700 temporary directory: runtime dir, state dir with the disk tier,
log; its own cache instance; the ``ram_file`` tier off, so nothing outlives
a stop but the disk tier) serves the default model twice:

* ``ram``: saves to the ``ram`` tier (the default), ``n_seq_max`` 8 (P6);
* ``disk``: saves to, and restores from, the ``disk`` tier only.

Both run with ``n_threads`` = ``n_threads_batch`` = the CPUs this process
may run on (as bench/worker_bench.py), and the daemon's thread budget is
those CPUs. Everything goes through :class:`llamad.Client` from this
process; every prompt is token ids (``client.tokenize`` of random words
led by a nonce, cut to exactly 512, 1024 or 2048 tokens), new in every
round, so nothing is warm by accident. TTFT is the time from calling
``infer`` (greedy, ``max_tokens`` 1) to the first token event arriving.
Every request's finish save is waited for (its ``finish_key`` looked up in
cache-meta until published, untimed, and checked to lie in the model's
tier) before the next request is sent.

In every round, at each size (orders alternate between rounds):

* ``cold`` then ``ram``: a fresh prompt on model ``ram``, then the same
  prompt again (an exact hit, restored from shared memory);
* ``cold (disk model)``: another fresh prompt on model ``disk`` (its row
  written to the disk tier); then the daemon is stopped with SIGTERM (exit
  0, none of its processes left, none of its ``ram`` segments left) and
  started again over the same config and disk tier, and
* ``disk after restart``: that prompt again on model ``disk``, the first
  requests of the new daemon but for one short untimed prompt per model
  (its first decode) and the readiness calls; the row's pages are left in
  the page cache as its save left them (as after a real restart).

**P6**, once a round on model ``ram``: a fresh 1024-token prefix; agent 1
sends it with a 32-token tail of its own alone (cold; its finish save holds
the prefix), then agents 2-8, each a thread of this process with its own
connection, send the prefix with their own 32-token tails at once (a
restore of the prefix, then their tails prefilled).

Rounds alternate after one warm-up round that is not counted. The report
(:mod:`bench.daemon_bench_report`) shows medians and ranges, the worker's own
stats per measurement (restore, prefill, hit kind, whether the first token
came from logits stored with the row) and the client TTFT less those (the
transport), and computes the verdicts.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from bench.common import record
from bench.daemon_bench_report import (
    AGENTS,
    COLD,
    DISK,
    DISK_COLD,
    PREFIX_TOKENS,
    RAM,
    SIZES,
    TAIL_TOKENS,
    Agents,
    Measure,
    Round,
    logits_note,
    measure,
    report,
)
from bench.worker_bench import WORDS, prompt_text
from bench.worker_bench_report import governor_note
from llamad import Client, TokenEvent, logs, paths
from llamad.cache.client import CacheClient
from llamad.front_wire import ModelState

if TYPE_CHECKING:
    from llamad.model.results import Completion
    from llamad.model.status_board import WorkerSnapshot

MIN_ROUNDS = 5
N_CTX, N_BATCH = 16384, 512  # ram: 8 agents x 1,056 tokens fit at once (kv_unified)
DISK_N_CTX = 4096
BUSY_LINGER_S = 0.5  # [daemon.threads] busy_linger_s, written into the config
READY_S, SAVE_S, STOP_S = 180.0, 120.0, 120.0
MODELS = {"ram": "ram", "disk": "disk"}  # model id -> its save tier


class Daemon:
    """``python -m llamad.daemon`` over a private directory; restartable."""

    def __init__(self, cores: int) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="ldb-", dir="/tmp"))
        self.run_dir = self.base / "run"
        self.endpoint = f"ipc://{self.run_dir}/llamad.sock"
        self.instance = f"db{uuid.uuid4().hex[:10]}"
        self.config = self.base / "llamad.toml"
        threads = f"n_threads = {cores}\nn_threads_batch = {cores}\nn_batch = {N_BATCH}\n"
        threads += f"n_ubatch = {N_BATCH}\n"
        self.config.write_text(
            f"""
[daemon]
runtime_dir = "{self.run_dir}"
state_dir = "{self.base / "state"}"
log_format = "json"
log_level = "warning"
[daemon.threads]
cores = {cores}
busy_linger_s = {BUSY_LINGER_S}
[cache]
instance = "{self.instance}"
[cache.ram]
quota = "2GiB"
[cache.ram_file]
quota = 0
[cache.disk]
quota = "4GiB"
[security]
model_dirs = ["{paths.default_model_path().parent}"]
[models.ram]
path = "default"
n_ctx = {N_CTX}
n_seq_max = {AGENTS}
{threads}
[models.disk]
path = "default"
n_ctx = {DISK_N_CTX}
n_seq_max = 1
{threads}
[models.disk.cache]
save_tier = "disk"
restore_tiers = ["disk"]
"""
        )
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> Client:
        """Start it; a client once both models are ready and have decoded once."""
        # This process's LLAMAD_* settings must not reach the daemon, but for
        # where the default model lives.
        keep = ("LLAMAD_CACHE_DIR", "LLAMAD_DEFAULT_MODEL")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_") or k in keep}
        with (self.base / "daemon.log").open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llamad.daemon", "--config", str(self.config)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=env,
            )
        self.starts += 1
        client = Client(self.endpoint, timeout=300.0, connect_timeout=5.0)
        deadline = time.monotonic() + READY_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the daemon exited with {self.proc.returncode}")
            with contextlib.suppress(Exception):
                states = {m.model_id: m.state for m in client.list_models(timeout=5.0)}
                if all(states.get(m) is ModelState.READY for m in MODELS):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the models were not ready in {READY_S:.0f} s")
            time.sleep(0.1)
        for model in MODELS:
            # Untimed: the route, the worker's socket and its first decode
            # (each on every thread: settled after the other model's).
            settle()
            client.complete(model, f"Hello {uuid.uuid4().hex[:8]}", max_tokens=1, temperature=0.0)
        return client

    def stop(self) -> None:
        """SIGTERM; exit 0, no process of its tree and no ram segment of its cache left."""
        assert self.proc is not None
        tree = psutil.Process(self.proc.pid).children(recursive=True)
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(STOP_S)
        if code != 0:
            raise RuntimeError(f"the daemon exited {code} on SIGTERM")
        _gone, alive = psutil.wait_procs(tree, timeout=10)
        if [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]:
            raise RuntimeError(f"left behind after the stop: {[p.pid for p in alive]}")
        # The next daemon must restore from disk: no ram row may survive.
        segments = list(Path("/dev/shm").glob(f"llamad-ram.{self.instance}.*.kvc"))
        if segments:
            raise RuntimeError(f"ram segments left after the stop: {segments[:3]}")

    def wait_saved(self, result: Completion, tier: str, *, required: bool = True) -> None:
        """Until the row of ``result``'s finish save is published; it must lie in
        ``tier``. A warm hit whose row was there already may name none
        (``required=False``): then no save is in flight to wait for."""
        key = result.finish_key
        if key is None:
            if required:
                raise RuntimeError(
                    f"a {result.cache_hit_kind.value} request of "
                    f"{result.stats.prompt_tokens} tokens saved no row"
                )
            return
        deadline = time.monotonic() + SAVE_S
        with CacheClient(registry_root=self.run_dir / "actors", timeout=30.0) as cache:
            # The writer reserves the save on its own thread: until it has,
            # cache-meta knows no save to wait for and answers a miss at once.
            while (ref := cache.lookup_exact_or_wait(key, 1.0)) is None:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"row {key.hex()} was never published")
                time.sleep(0.005)
            cache.checkin(ref.pin)
        if ref.tier.value != tier:
            raise RuntimeError(f"row {key.hex()} is in {ref.tier.value}, not {tier}")

    def close(self) -> None:
        """Stop it however the bench ends (SIGTERM, then SIGKILL), remove its directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        path = self.base / "daemon.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def timed(client: Client, model: str, tokens: list[int]) -> tuple[Measure, Completion]:
    """One greedy token: the client's TTFT with the worker's stats, and the Completion."""
    t0 = time.perf_counter()
    first = None
    stream = client.infer(model, tokens, max_tokens=1, temperature=0.0)
    for event in stream:
        if first is None and isinstance(event, TokenEvent):
            first = time.perf_counter()
    result = stream.result
    assert first is not None and result is not None, "no token before the stream ended"
    return measure((first - t0) * 1e3, result), result


def tokens_of(client: Client, n: int, nonce: str) -> list[int]:
    """Exactly ``n`` tokens of random words led by ``nonce``."""
    tokens = client.tokenize("ram", prompt_text(nonce, n))
    assert len(tokens) >= n, f"{len(tokens)} tokens, wanted {n}"
    return tokens[:n]


def tail_tokens(client: Client, i: int, tag: str) -> list[int]:
    """Agent ``i``'s tail: exactly TAIL_TOKENS tokens, its first word its own, so
    the tails part from the shared prefix at their first token."""
    rng = random.Random(f"{tag}-{i}")
    text = " " + " ".join([WORDS[i], *(rng.choice(WORDS) for _ in range(TAIL_TOKENS))])
    tokens = client.tokenize("ram", text, add_special=False)
    assert len(tokens) >= TAIL_TOKENS, f"{len(tokens)} tail tokens, wanted {TAIL_TOKENS}"
    return tokens[:TAIL_TOKENS]


def settle() -> None:
    # The governor counts a worker busy for busy_linger_s after its last
    # step, halving the other model's threads meanwhile: let it pass before
    # measuring another model.
    time.sleep(BUSY_LINGER_S + 0.2)


def fresh(
    d: Daemon, c: Client, model: str, sizes: tuple[int, ...], tag: str
) -> tuple[dict[tuple[str, int], Measure], dict[int, list[int]]]:
    """A fresh prompt at each size, cold on ``model``, its row waited for; on
    ``ram`` the same prompt again at once (the ``ram`` path)."""
    got, prompts = {}, {}
    settle()
    for n in sizes:
        prompts[n] = tokens_of(c, n, f"{model}-{tag}-{n}-{os.urandom(4).hex()}")
        got[COLD if model == "ram" else DISK_COLD, n], cold = timed(c, model, prompts[n])
        d.wait_saved(cold, model)
        if model == "ram":
            got[RAM, n], warm = timed(c, model, prompts[n])
            d.wait_saved(warm, model, required=False)
    return got, prompts


def disk_warm(
    d: Daemon, c: Client, prompts: dict[int, list[int]], sizes: tuple[int, ...]
) -> dict[tuple[str, int], Measure]:
    got = {}
    settle()
    for n in sizes:
        got[DISK, n], warm = timed(c, "disk", prompts[n])
        d.wait_saved(warm, "disk", required=False)
    return got


def agents(d: Daemon, c: Client, tag: str) -> Agents:
    """P6: agent 1 alone on a fresh prefix, then agents 2-8 at once."""
    settle()
    prefix = tokens_of(c, PREFIX_TOKENS, f"agents-{tag}-{os.urandom(4).hex()}")
    tails = [tail_tokens(c, i, tag) for i in range(AGENTS)]
    first, done = timed(c, "ram", prefix + tails[0])
    d.wait_saved(done, "ram")
    ready = threading.Barrier(AGENTS)  # agents 2-8 and this thread
    out: list[tuple[Measure, Completion] | BaseException | None] = [None] * (AGENTS - 1)

    def agent(i: int) -> None:
        try:
            c.tokenize("ram", "connect")  # this thread's own socket, untimed
            ready.wait()
            out[i] = timed(c, "ram", prefix + tails[i + 1])
        except BaseException as exc:
            out[i] = exc
            with contextlib.suppress(threading.BrokenBarrierError):
                ready.abort()

    runners = [threading.Thread(target=agent, args=(i,)) for i in range(AGENTS - 1)]
    for t in runners:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):
        ready.wait()
    for t in runners:
        t.join(600)
    others = []
    for got in out:
        if not isinstance(got, tuple):
            raise RuntimeError(f"an agent failed: {got!r}")
        others.append(got[0])
        d.wait_saved(got[1], "ram", required=False)  # off the clock of what follows
    return Agents(first, others)


def one_round(d: Daemon, client: Client, i: int) -> tuple[Round, Client]:
    """One round (see the module doc); the client of the restarted daemon."""
    tag = f"r{i}-{uuid.uuid4().hex[:6]}"
    sizes = SIZES if i % 2 == 0 else tuple(reversed(SIZES))
    r = Round()
    if i % 2:
        r.agents = agents(d, client, tag)
    r.ttft.update(fresh(d, client, "ram", sizes, tag)[0])
    if not i % 2:
        r.agents = agents(d, client, tag)
    cold, prompts = fresh(d, client, "disk", sizes, tag)
    r.ttft.update(cold)
    client.close()
    d.stop()
    client = d.start()
    r.ttft.update(disk_warm(d, client, prompts, sizes))
    return r, client


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help="counted rounds (5)")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if not args.no_record and args.rounds < MIN_ROUNDS:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    logs.configure(level="warning")
    cores = len(os.sched_getaffinity(0))
    load_start = os.getloadavg()
    t_start = time.monotonic()
    rounds: list[Round] = []
    loads: list[float] = []
    d = Daemon(cores)
    snaps: dict[str, WorkerSnapshot] = {}
    try:
        client = d.start()
        try:
            for i in range(-1, args.rounds):  # round -1: warm-up, not counted
                loads.append(os.getloadavg()[0])
                r, client = one_round(d, client, i)
                a = r.agents
                assert a is not None
                print(
                    f"{'warm-up' if i < 0 else f'round {i + 1}/{args.rounds}'}: 2048 tokens "
                    f"cold {r.ttft[COLD, 2048].ttft_ms:.0f} ms, ram {r.ttft[RAM, 2048].ttft_ms:.2f}"
                    f" ms, disk after restart {r.ttft[DISK, 2048].ttft_ms:.2f} ms; agent 1 "
                    f"{a.first.ttft_ms:.0f} ms, agents 2-{AGENTS} p50 {a.p50_ms:.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
                if i >= 0:
                    rounds.append(r)
            for model in MODELS:
                snap = client.status(model).worker
                if snap is not None:
                    snaps[model] = snap
            client.close()
            d.stop()
        except BaseException:
            client.close()
            raise
    except (RuntimeError, TimeoutError, AssertionError) as exc:
        print(f"error: {exc}\n--- daemon log ---\n{d.log_tail()}", file=sys.stderr)
        return 1
    finally:
        d.close()
    load_end = os.getloadavg()
    settings = (
        f"Model `default`, {cores} cores. One daemon (`python -m llamad.daemon --config`), "
        f"two models of the default file: `ram` (save tier ram, n_ctx {N_CTX}, n_seq_max "
        f"{AGENTS}) and `disk` (save and restore tier disk only, n_ctx {DISK_N_CTX}, n_seq_max "
        f"1); each n_threads = n_threads_batch = {cores}, n_batch = n_ubatch {N_BATCH}, flash "
        "attention auto, the default cache policy; ram_file tier off. Driven by "
        "`llamad.Client` from the bench process; greedy, max_tokens 1; TTFT = `infer` called "
        f"to the first token event. The daemon was started {d.starts} times (a full restart, "
        f"SIGTERM then exit 0, every round; the disk rows' pages left in the page cache as their "
        f"saves left them). {args.rounds} rounds after one unrecorded warm-up "
        "round, orders alternating. Values: median (min-max) over rounds.\n\n"
        f"Load average (1/5/15 min) at start {'/'.join(f'{x:.2f}' for x in load_start)}, "
        f"at end {'/'.join(f'{x:.2f}' for x in load_end)}; 1-min at each round's start "
        f"(warm-up first): {', '.join(f'{x:.2f}' for x in loads)}. Wall time "
        f"{time.monotonic() - t_start:.0f} s.\n\n{governor_note(snaps)}\n\n{logits_note(snaps)}"
    )
    body = report(rounds, settings)
    print(body)
    if not args.no_record:
        title = "The daemon through the public client: warm TTFT, restart, 8 agents (issue 9)"
        print(f"recorded {record('daemon', title, body)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
