"""Why token streams go straight from the worker to the client: direct vs one relay hop.

The daemon's front is the control plane; a client routes once and then
streams from the worker actor itself. The alternative is a front that relays
every event (client -> front -> worker and back). This bench measures what
that extra hop costs, with the actor runtime the daemon uses:

- ``producer``: the toy actor (``llamad.testing.toy_actor``) in its own process,
  pushing ``ticks`` events from its loop the way a worker pushes tokens;
- ``relay``: an actor in its own process whose stream op opens the same
  stream upstream with its own client and re-emits every event (the least a
  relaying front would do: no routing table, no other clients);
- the client, in this process, streams either from the producer (direct) or
  from the relay, in alternating rounds.

Measured: first-event latency (stream request to first event, a stream of
one event: the hop's share of TTFT), one-way event latency (producer's
emit time to arrival, for events paced at 10 ms like tokens), and throughput
(events/s of an unpaced stream). Recorded in ``bench/results/front-relay-<date>.md``,
rendered by :func:`report` from ``front-relay-<date>.json`` beside it: per round
and path, the first-event and paced latencies (histograms at 1 µs), the
unpaced rate and the relay's CPU per event.

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

from bench.common import hist, percentile, record, show, table, unhist
from llamad import logs
from llamad.actors import Actor, Client, OpKind, OpSpec, Request
from llamad.testing.toy_actor import Ticks, spawn_toy

PACED_EVENTS = 100
PACE_S = 0.01
FIRST_SAMPLES = 100
BURST_EVENTS = 20_000
RENDER = "bench.front_relay_bench:report"


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


def run(rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Per path, each round's measurements (latencies in µs)."""
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
    data: dict[str, list[dict[str, Any]]] = {"direct": [], "relay": []}
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
                    first = [_first_event_s(c) * 1e6 for _ in range(FIRST_SAMPLES)]
                    paced = [x * 1e6 for x in _paced_latencies(c)]
                    cpu = sum(relay_proc.cpu_times()[:2])
                    got: dict[str, Any] = {
                        "first_us": hist(first),
                        "paced_us": hist(paced),
                        "burst_events_s": _throughput(c),
                    }
                    if path == "relay":  # the relay's own CPU per relayed event
                        spent = sum(relay_proc.cpu_times()[:2]) - cpu
                        got["relay_cpu_us"] = spent / BURST_EVENTS * 1e6
                    data[path].append(got)
    finally:
        relay.terminate()
        relay.wait(10)
        producer.stop()
    return data


def report(params: dict[str, Any], data: dict[str, list[dict[str, Any]]]) -> str:
    """The recorded body from :func:`run`'s per-round data and :func:`main`'s params."""

    def pooled(path: str, name: str) -> list[float]:
        return unhist(*(r[name] for r in data[path]))

    def burst(path: str) -> list[float]:
        return [r["burst_events_s"] for r in data[path]]

    rows = []
    for path in ("direct", "relay"):
        first, paced = pooled(path, "first_us"), pooled(path, "paced_us")
        rows.append(
            [
                path,
                f"{percentile(first, 50):.0f}",
                f"{percentile(first, 99):.0f}",
                f"{percentile(paced, 50):.0f}",
                f"{percentile(paced, 99):.0f}",
                f"{percentile(burst(path), 50):,.0f}",
            ]
        )

    def added(name: str) -> float:
        return percentile(pooled("relay", name), 50) - percentile(pooled("direct", name), 50)

    ratio = percentile(burst("relay"), 50) / percentile(burst("direct"), 50)
    relay_cpu = [r["relay_cpu_us"] for r in data["relay"]]
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
            f"{params['rounds']} alternating rounds; per round and path: "
            f"{params['first_samples']} one-event streams, {params['paced_events']} events "
            f"paced at {params['pace_s'] * 1000:g} ms, {params['burst_events']:,} unpaced "
            "events. ipc, one client; latencies kept to 1 µs. Load average at end: "
            f"{params['load_end']:.2f}.",
            "",
            table(head, rows),
            "",
            f"- the relay hop adds {added('first_us'):.0f} µs to the first event (p50) and "
            f"{added('paced_us'):.0f} µs to every paced event (p50);",
            f"- relayed throughput is {ratio:.2f}x direct (the relay's loop handles every "
            "event twice: receive, decode, re-encode, send);",
            f"- the relay process spends {percentile(relay_cpu, 50):.1f} µs of CPU "
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
    data = run(args.rounds)
    params = {
        "rounds": args.rounds,
        "first_samples": FIRST_SAMPLES,
        "paced_events": PACED_EVENTS,
        "pace_s": PACE_S,
        "burst_events": BURST_EVENTS,
        "load_end": os.getloadavg()[0],
    }
    print(show(RENDER, params, data))
    if not args.no_record:
        title = "Direct streams vs one relay hop (the front)"
        path = record("front-relay", title, RENDER, params, data)
        print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
