"""Why token streams go straight from the worker to the client: direct vs one relay hop.

The daemon's front is the control plane; a client routes once and then
streams from the worker actor itself. The alternative is a front that relays
every event (client -> front -> worker and back). This bench measures what
that extra hop costs, with the actor runtime the daemon uses:

- ``producer``: the toy actor (``llamad.actors.testing``) in its own process,
  pushing ``ticks`` events from its loop the way a worker pushes tokens;
- ``relay``: an actor in its own process whose stream op opens the same
  stream upstream with its own client and re-emits every event (the least a
  relaying front would do: no routing table, no other clients);
- the client, in this process, streams either from the producer (direct) or
  from the relay, in alternating rounds.

Measured: first-event latency (stream request to first event, a stream of
one event: the hop's share of TTFT), one-way event latency (producer's
emit time to arrival, for events paced at 10 ms like tokens), and throughput
(events/s of an unpaced stream). Recorded in ``bench/results/front-relay-<date>.md``.

    .venv/bin/python -m bench.front_relay_bench [--rounds N] [--no-record]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, record, table
from llamad import logs
from llamad.actors import Actor, Client, OpKind, OpSpec, Request
from llamad.actors.testing import Ticks, spawn_toy

PACED_EVENTS = 100
PACE_S = 0.01
FIRST_SAMPLES = 100
BURST_EVENTS = 20_000


def _relay_main(endpoint: str, upstream: str) -> None:
    """The relay process: one stream op that re-emits an upstream ``ticks`` stream."""
    logs.configure("warning")  # stdout carries the READY line; logs go to stderr
    actor = Actor("relay", endpoint=endpoint, register=False)
    client = Client(upstream, timeout=60)

    def relay(req: Request[Ticks]) -> Iterator[Any]:
        stream = client.stream("ticks", {"n": req.body.n, "interval": req.body.interval})
        for message in stream:
            yield message.body
        return stream.result

    actor.add_op(OpSpec("ticks", OpKind.STREAM, body=Ticks), relay)
    actor.start()
    print("READY", flush=True)
    try:
        actor.serve_forever()
    finally:
        client.close()


def _first_event_s(client: Client) -> float:
    t0 = time.perf_counter()
    stream = client.stream("ticks", {"n": 1})
    next(iter(stream))
    elapsed = time.perf_counter() - t0
    for _ in stream:
        pass
    return elapsed


def _paced_latencies(client: Client) -> list[float]:
    out = []
    for message in client.stream("ticks", {"n": PACED_EVENTS, "interval": PACE_S}):
        out.append(time.monotonic() - message.body["t"])
    return out


def _throughput(client: Client) -> float:
    t0 = time.perf_counter()
    n = sum(1 for _ in client.stream("ticks", {"n": BURST_EVENTS}))
    return n / (time.perf_counter() - t0)


def run(rounds: int) -> dict[str, dict[str, list[float]]]:
    base = Path(tempfile.mkdtemp(prefix="lfr-", dir="/tmp"))
    producer = spawn_toy("--endpoint", f"ipc://{base}/producer.sock", "--no-register")
    relay_ep = f"ipc://{base}/relay.sock"
    relay = subprocess.Popen(
        [sys.executable, "-m", "bench.front_relay_bench", "--relay", relay_ep, producer.endpoint],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert relay.stdout is not None and relay.stdout.readline().startswith("READY")
    data: dict[str, dict[str, list[float]]] = {
        path: {"first": [], "paced": [], "burst": [], "relay_cpu_us": []}
        for path in ("direct", "relay")
    }
    relay_proc = psutil.Process(relay.pid)
    try:
        with Client(producer.endpoint, timeout=60) as direct, Client(relay_ep, timeout=60) as via:
            clients = {"direct": direct, "relay": via}
            for c in clients.values():  # warm-up: connections, imports, caches
                _first_event_s(c)
                _throughput(c)
            for r in range(rounds):
                order = ["direct", "relay"] if r % 2 == 0 else ["relay", "direct"]
                for path in order:
                    c = clients[path]
                    data[path]["first"] += [_first_event_s(c) for _ in range(FIRST_SAMPLES)]
                    data[path]["paced"] += _paced_latencies(c)
                    cpu = sum(relay_proc.cpu_times()[:2])
                    data[path]["burst"].append(_throughput(c))
                    if path == "relay":  # the relay's own CPU per relayed event
                        spent = sum(relay_proc.cpu_times()[:2]) - cpu
                        data[path]["relay_cpu_us"].append(spent / BURST_EVENTS * 1e6)
    finally:
        relay.terminate()
        relay.wait(10)
        producer.stop()
    return data


def report(data: dict[str, dict[str, list[float]]], rounds: int) -> str:
    def us(values: list[float], q: float) -> str:
        return f"{percentile(values, q) * 1e6:.0f}"

    rows = []
    for path in ("direct", "relay"):
        d = data[path]
        rows.append(
            [
                path,
                us(d["first"], 50),
                us(d["first"], 99),
                us(d["paced"], 50),
                us(d["paced"], 99),
                f"{percentile(d['burst'], 50):,.0f}",
            ]
        )
    direct, relay = data["direct"], data["relay"]
    added_first = (percentile(relay["first"], 50) - percentile(direct["first"], 50)) * 1e6
    added_paced = (percentile(relay["paced"], 50) - percentile(direct["paced"], 50)) * 1e6
    ratio = percentile(relay["burst"], 50) / percentile(direct["burst"], 50)
    head = [
        "path",
        "first event p50 µs",
        "first event p99 µs",
        "event latency p50 µs",
        "event latency p99 µs",
        "events/s p50",
    ]
    return "\n".join(
        [
            f"{rounds} alternating rounds; per round and path: {FIRST_SAMPLES} one-event "
            f"streams, {PACED_EVENTS} events paced at {PACE_S * 1000:g} ms, "
            f"{BURST_EVENTS:,} unpaced events. ipc, one client. Load average at end: "
            f"{os.getloadavg()[0]:.2f}.",
            "",
            table(head, rows),
            "",
            f"- the relay hop adds {added_first:.0f} µs to the first event (p50) and "
            f"{added_paced:.0f} µs to every paced event (p50);",
            f"- relayed throughput is {ratio:.2f}x direct (the relay's loop handles every "
            "event twice: receive, decode, re-encode, send);",
            f"- the relay process spends {percentile(relay['relay_cpu_us'], 50):.1f} µs of CPU "
            "per event (p50 over rounds), on the cores the model workers decode on.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument(
        "--relay", nargs=2, metavar=("ENDPOINT", "UPSTREAM"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.relay:
        _relay_main(*args.relay)
        return 0
    body = report(run(args.rounds), args.rounds)
    print(body)
    if not args.no_record:
        path = record("front-relay", "Direct streams vs one relay hop (the front)", body)
        print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
