"""The daemon through the public client, as a user sends: warm TTFT from a tier,
the back-to-back repeat, the first repeat after a restart, and 8 agents sharing a
prefix (issue 9, issue 15 item 7; SPEC P1, P2, P6, P12).

    python -m bench.daemon_bench [--rounds 5] [--no-record]

A real daemon (``python -m llamad.daemon --config FILE``, the config in a
private 0700 temporary directory: runtime dir, state dir, log; its own cache
instance, so its rows are its own) serves the default model as ``m`` with
the **default configuration** but one setting: ``n_seq_max`` 8, because P6
is 8 agents at once (the default is 1; the peers bench gives llama-server
its ``-np`` the same way). Context size, batch, threads (every CPU this
process may run on), the thread budget and the cache (tiers, quotas,
policy: the cache chooses where a save lands) are the defaults.

Everything goes through :class:`llamad.Client` from this process; every
prompt is token ids (``client.tokenize`` of random words led by a nonce,
cut to exactly 512, 1024 or 2048 tokens), new in every round, so nothing is
warm by accident. TTFT is the time from calling ``infer`` (greedy,
``max_tokens`` 1) to the first token event arriving. Requests go back to
back, as a user's would: **nothing waits for a save** to be published.

In every round, at each size (orders alternate between rounds), back to back:

* ``cold``: a fresh prompt;
* ``repeat, back to back`` (SPEC P12): the same prompt the moment its reply
  ended: its idle entry is still in place (live reuse), the first token comes
  from its kept logits;
* 8 (``n_seq_max``) other short prompts, untimed: a new request takes an
  empty sequence first, then the least recently used idle entry's, so the
  8th takes the prompt's last and its idle entry is gone;
* ``repeat after 8 other requests`` (SPEC P1): the prompt again, now looked
  up in the cache; its finish save is not waited for (if it were still in
  flight the request waits for it or runs partly cold: ``wait_ms`` and
  ``cache_delta.sources`` show it).

**P6**, once a round: a fresh 1024-token prefix; agent 1 sends it with a
32-token tail of its own alone (cold), then, the moment its reply ended,
agents 2-8, each a thread of this process with its own connection (opened
before the barrier, untimed), send the prefix with their own 32-token tails
together.

Then the daemon is stopped with SIGTERM (exit 0, none of its processes
left, none of its ``ram`` segments left) and started again over the same
directories, one short untimed prompt goes first (the new worker's first
decode), and each size's prompt is sent once more: ``first repeat after a
restart`` (SPEC P2: exact, <= 40 ms; with the default configuration the
cache decides what survives a clean stop).

Rounds alternate after one warm-up round that is not counted. The report
(:mod:`bench.daemon_bench_report`) shows medians and ranges, the worker's own
stats per measurement (restore, wait, prefill, hit kind, where the prompt's
tokens came from, whether the first token came from logits stored with the
row) and the client TTFT less those (the transport), and computes the
verdicts. A recorded run is ``daemon-<date>.json`` (every request of every
round, :func:`bench.daemon_bench_report.round_data`) and the ``.md``
:func:`bench.daemon_bench_report.render` makes of it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from bench.common import record, show
from bench.daemon_bench_report import (
    AGENTS,
    COLD,
    PREFIX_TOKENS,
    REPEAT,
    RESTART,
    SIZES,
    TAIL_TOKENS,
    TIER,
    Agents,
    Measure,
    Round,
    measure,
    round_data,
    stored_logits,
)
from bench.peers.workload import exact_tokens
from bench.worker_bench import WORDS
from bench.worker_bench_report import governor_info
from llamad import Client, TokenEvent, logs
from llamad.testing import Launcher

if TYPE_CHECKING:
    from llamad.model.results import Completion
    from llamad.model.wire import WorkerSnapshot

MIN_ROUNDS = 5
MODEL = "m"
FILLER_TOKENS = 64  # a short request: below min_tokens, never saved
READY_S, STOP_S = 180.0, 120.0
RENDER = "bench.daemon_bench_report:render"


class Daemon:
    """``python -m llamad.daemon --config FILE`` over a private directory
    (:class:`llamad.testing.Launcher`); restartable."""

    def __init__(self) -> None:
        self.launcher = Launcher(prefix="ldb-", instance=f"db{uuid.uuid4().hex[:10]}")
        self.base = self.launcher.base
        self.endpoint = self.launcher.endpoint
        self.instance = self.launcher.instance
        # Where the daemon lives and what it is called (so it reaches no other
        # daemon and its rows are its own), quiet logs, and P6's sequences.
        self.config = self.launcher.write_config(
            f"""
[daemon]
runtime_dir = "{self.launcher.runtime}"
state_dir = "{self.launcher.state}"
log_format = "json"
log_level = "warning"
[cache]
instance = "{self.instance}"
[models.{MODEL}]
path = "default"
n_seq_max = {AGENTS}
"""
        )
        self.starts = 0

    @property
    def ram_file_root(self) -> Path:
        """The default ``ram_file`` directory of this instance (on /dev/shm,
        outside :attr:`base`; ``cache.ram_file.root``'s default)."""
        return self.launcher.ram_file_root

    def start(self) -> Client:
        """Start it; a client once the model is ready and has decoded once."""
        self.launcher.start()
        self.starts += 1
        self.launcher.wait_routed([MODEL], timeout=READY_S)
        client = Client(self.endpoint, timeout=300.0, connect_timeout=5.0)
        # Untimed: the route, the worker's socket and its first decode.
        client.complete(MODEL, f"Hello {uuid.uuid4().hex[:8]}", max_tokens=1, temperature=0.0)
        return client

    def stop(self) -> None:
        """SIGTERM; exit 0, no process of its tree and no ram segment of its cache left."""
        code = self.launcher.stop(STOP_S)
        if code != 0:
            raise RuntimeError(f"the daemon exited {code} on SIGTERM")
        # A ram row is shared memory: a stopped daemon must leave none behind
        # (what outlives it is the cache's to keep in ram_file or disk).
        segments = [p for p in self.launcher.ram_segments() if p.suffix == ".kvc"]
        if segments:
            raise RuntimeError(f"ram segments left after the stop: {segments[:3]}")

    def close(self) -> None:
        """Stop it however the bench ends (SIGTERM, then SIGKILL), remove its
        directory and its ram_file rows."""
        self.launcher.close(STOP_S)

    def log_tail(self, lines: int = 20) -> str:
        return self.launcher.log_tail(lines)


def timed(client: Client, tokens: list[int]) -> tuple[Measure, Completion]:
    """One greedy token: the client's TTFT with the worker's stats, and the Completion."""
    t0 = time.perf_counter()
    first = None
    stream = client.infer(MODEL, tokens, max_tokens=1, temperature=0.0)
    for event in stream:
        if first is None and isinstance(event, TokenEvent):
            first = time.perf_counter()
    result = stream.result
    assert first is not None and result is not None, "no token before the stream ended"
    return measure((first - t0) * 1e3, result), result


def tokens_of(client: Client, n: int, nonce: str) -> list[int]:
    """Exactly ``n`` tokens of random words, led by words the nonce draws, so
    two prompts rarely share even their first token (a cold prompt is cold)."""
    return exact_tokens(lambda text: client.tokenize(MODEL, text), nonce, n)


def tail_tokens(client: Client, i: int, tag: str) -> list[int]:
    """Agent ``i``'s tail: exactly TAIL_TOKENS tokens, its first word its own, so
    the tails part from the shared prefix at their first token."""
    rng = random.Random(f"{tag}-{i}")
    text = " " + " ".join([WORDS[i], *(rng.choice(WORDS) for _ in range(TAIL_TOKENS))])
    tokens = client.tokenize(MODEL, text, add_special=False)
    assert len(tokens) >= TAIL_TOKENS, f"{len(tokens)} tail tokens, wanted {TAIL_TOKENS}"
    return tokens[:TAIL_TOKENS]


def warm_paths(
    c: Client, sizes: tuple[int, ...], tag: str
) -> tuple[dict[tuple[str, int], Measure], dict[int, list[int]]]:
    """At each size, back to back: a fresh prompt cold, its repeat at once, 8
    other short prompts (untimed), the prompt again (see the module doc)."""
    got, prompts = {}, {}
    for n in sizes:
        prompts[n] = tokens_of(c, n, f"{tag}-{n}-{os.urandom(4).hex()}")
        fillers = [tokens_of(c, FILLER_TOKENS, f"f{tag}-{n}-{i}") for i in range(AGENTS)]
        got[COLD, n], _ = timed(c, prompts[n])
        got[REPEAT, n], _ = timed(c, prompts[n])
        for filler in fillers:
            c.complete(MODEL, filler, max_tokens=1, temperature=0.0)
        got[TIER, n], _ = timed(c, prompts[n])
    return got, prompts


def after_restart(
    c: Client, prompts: dict[int, list[int]], sizes: tuple[int, ...]
) -> dict[tuple[str, int], Measure]:
    return {(RESTART, n): timed(c, prompts[n])[0] for n in sizes}


def agents(c: Client, tag: str) -> Agents:
    """P6: agent 1 alone on a fresh prefix, then agents 2-8 at once."""
    prefix = tokens_of(c, PREFIX_TOKENS, f"agents-{tag}-{os.urandom(4).hex()}")
    tails = [tail_tokens(c, i, tag) for i in range(AGENTS)]
    first, _ = timed(c, prefix + tails[0])
    ready = threading.Barrier(AGENTS)  # agents 2-8 and this thread
    out: list[Measure | BaseException | None] = [None] * (AGENTS - 1)

    def agent(i: int) -> None:
        try:
            c.tokenize(MODEL, "connect")  # this thread's own socket, untimed
            ready.wait()
            out[i] = timed(c, prefix + tails[i + 1])[0]
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
        if not isinstance(got, Measure):
            raise RuntimeError(f"an agent failed: {got!r}")
        others.append(got)
    return Agents(first, others)


def one_round(d: Daemon, client: Client, i: int) -> tuple[Round, Client]:
    """One round (see the module doc); the client of the restarted daemon."""
    tag = f"r{i}-{uuid.uuid4().hex[:6]}"
    sizes = SIZES if i % 2 == 0 else tuple(reversed(SIZES))
    r = Round()
    if i % 2:
        r.agents = agents(client, tag)
    got, prompts = warm_paths(client, sizes, tag)
    r.ttft.update(got)
    if not i % 2:
        r.agents = agents(client, tag)
    client.close()
    d.stop()
    client = d.start()
    r.ttft.update(after_restart(client, prompts, sizes))
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
    d = Daemon()
    snaps: dict[str, WorkerSnapshot] = {}
    try:
        client = d.start()
        try:
            for i in range(-1, args.rounds):  # round -1: warm-up, not counted
                loads.append(os.getloadavg()[0])
                r, client = one_round(d, client, i)
                a = r.agents
                assert a is not None
                tier, restart = r.ttft[TIER, 2048], r.ttft[RESTART, 2048]
                print(
                    f"{'warm-up' if i < 0 else f'round {i + 1}/{args.rounds}'}: 2048 tokens "
                    f"cold {r.ttft[COLD, 2048].ttft_ms:.0f} ms, back to back "
                    f"{r.ttft[REPEAT, 2048].ttft_ms:.2f} ms, from a tier {tier.ttft_ms:.2f} ms "
                    f"({tier.where}), after a restart {restart.ttft_ms:.2f} ms "
                    f"({restart.where}); agent 1 {a.first.ttft_ms:.0f} ms, agents 2-{AGENTS} "
                    f"p50 {a.p50_ms:.1f} ms, prefix's share {a.prefix_ms:.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
                if i >= 0:
                    rounds.append(r)
            snap = client.status(MODEL).worker
            if snap is not None:
                snaps[MODEL] = snap
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
    params = {
        "cores": cores,
        "model": MODEL,
        "agents": AGENTS,
        "filler_tokens": FILLER_TOKENS,
        "starts": d.starts,
        "rounds": args.rounds,
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
        "loads": loads,
        "wall_s": time.monotonic() - t_start,
        "governor": {name: governor_info(snap) for name, snap in snaps.items()},
        "stored_logits_hits": {name: stored_logits(snap) for name, snap in snaps.items()},
    }
    data = {"rounds": [round_data(r) for r in rounds]}
    print(show(RENDER, params, data))
    if not args.no_record:
        title = (
            "The daemon through the public client: warm TTFT, back to back, restart, "
            "8 agents (issue 9)"
        )
        print(f"recorded {record('daemon', title, RENDER, params, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
