"""Actor runtime benchmark: call round trip and stream throughput over ipc.

Runs the toy actor (``llamad.actors.testing``) in its own process and drives
it from 1 and from 16 client processes. A bare pyzmq ROUTER/DEALER echo over
the same transport is measured in the same run as the floor our runtime adds
to. Bars (issue 3): p50 round trip ≤ 100 µs, ≥ 50,000 stream events/s.

    .venv/bin/python bench/actors_bench.py [--calls N] [--events N] [--no-record]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import percentile, record, table
from llamad.actors import Client
from llamad.actors.testing import spawn_toy

CLIENTS = 16


def _call_worker(endpoint: str, calls: int, start_at: float) -> dict[str, Any]:
    with Client(endpoint, timeout=60) as c:
        for i in range(200):
            c.call("echo", {"i": i})
        while time.monotonic() < start_at:
            time.sleep(0.001)
        lat = []
        begin = time.monotonic()
        for i in range(calls):
            t0 = time.perf_counter()
            c.call("echo", {"i": i})
            lat.append(time.perf_counter() - t0)
        return {"lat": lat, "begin": begin, "end": time.monotonic()}


def _stream_worker(endpoint: str, events: int, start_at: float) -> dict[str, Any]:
    with Client(endpoint, timeout=60) as c:
        c.call("echo", None)
        while time.monotonic() < start_at:
            time.sleep(0.001)
        begin = time.monotonic()
        stream = c.stream("count", {"n": events})
        seen = sum(1 for _ in stream)
        assert seen == events and stream.result == {"n": events}
        return {"events": seen, "begin": begin, "end": time.monotonic()}


def _raw_server(endpoint: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.bind(endpoint)
    while True:
        ident, msg = sock.recv_multipart()
        if msg == b"stop":
            break
        sock.send_multipart([ident, msg])
    sock.close(0)
    ctx.term()


def raw_floor(tmp: str, calls: int) -> list[float]:
    """Round trips of a bare pyzmq echo (blocking recv, no envelope, no validation)."""
    endpoint = f"ipc://{tmp}/raw.sock"
    ctx_mp = multiprocessing.get_context("spawn")
    server = ctx_mp.Process(target=_raw_server, args=(endpoint,))
    server.start()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    payload = b"\x95\x01\x01\x01\xa4echo\x81\xa1i\x01"
    for _ in range(200):
        sock.send(payload)
        sock.recv()
    lat = []
    for _ in range(calls):
        t0 = time.perf_counter()
        sock.send(payload)
        sock.recv()
        lat.append(time.perf_counter() - t0)
    sock.send(b"stop")
    server.join(30)
    sock.close(0)
    ctx.term()
    return lat


def run_parallel(worker: Any, endpoint: str, n: int, count: int) -> list[dict[str, Any]]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(n) as pool:
        start_at = time.monotonic() + 3.0  # every client is connected and warm by then
        results = [pool.apply_async(worker, (endpoint, count, start_at)) for _ in range(n)]
        return [r.get(timeout=600) for r in results]


def us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    rows: list[list[object]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        floor = raw_floor(tmp, args.calls)
        rows.append(
            [
                "bare pyzmq echo (floor)",
                1,
                us(percentile(floor, 50)),
                us(percentile(floor, 99)),
                f"{len(floor) / sum(floor):,.0f} calls/s",
            ]
        )
        with spawn_toy("--endpoint", f"ipc://{tmp}/toy.sock", "--no-register") as toy:
            [one] = run_parallel(_call_worker, toy.endpoint, 1, args.calls)
            lat = one["lat"]
            rows.append(
                [
                    "call round trip",
                    1,
                    us(percentile(lat, 50)),
                    us(percentile(lat, 99)),
                    f"{len(lat) / (one['end'] - one['begin']):,.0f} calls/s",
                ]
            )
            many = run_parallel(_call_worker, toy.endpoint, CLIENTS, args.calls // CLIENTS)
            lat = [x for r in many for x in r["lat"]]
            span = max(r["end"] for r in many) - min(r["begin"] for r in many)
            rows.append(
                [
                    "call round trip",
                    CLIENTS,
                    us(percentile(lat, 50)),
                    us(percentile(lat, 99)),
                    f"{len(lat) / span:,.0f} calls/s",
                ]
            )
            [s1] = run_parallel(_stream_worker, toy.endpoint, 1, args.events)
            rate1 = s1["events"] / (s1["end"] - s1["begin"])
            rows.append(["stream events", 1, "", "", f"{rate1:,.0f} events/s"])
            sm = run_parallel(_stream_worker, toy.endpoint, CLIENTS, args.events // CLIENTS)
            span = max(r["end"] for r in sm) - min(r["begin"] for r in sm)
            rate16 = sum(r["events"] for r in sm) / span
            rows.append(["stream events", CLIENTS, "", "", f"{rate16:,.0f} events/s"])
    load_after = os.getloadavg()
    p50_ours = percentile(one["lat"], 50)
    body = table(["measure", "clients", "p50 µs", "p99 µs", "throughput"], rows)
    body += (
        f"\n\nBars: call p50 ≤ 100 µs: {'met' if p50_ours <= 100e-6 else 'MISSED'} "
        f"({us(p50_ours)} µs; the bare floor is {us(percentile(floor, 50))} µs); "
        f"≥ 50,000 stream events/s: {'met' if min(rate1, rate16) >= 50_000 else 'MISSED'}.\n\n"
        f"`uname -a`: {' '.join(os.uname())}\n\n"
        f"Transport ipc; body a small map; {args.calls} calls, {args.events} events; "
        "client processes spawned, all against one toy actor process; the floor is a "
        "bare pyzmq ROUTER/DEALER echo (blocking recv, no envelope, no validation, no "
        "crash watch) measured in the same run.\n"
        f"Load average before/after: {load_before[0]:.2f} / {load_after[0]:.2f} "
        "(other work on the machine inflates latency).\n"
    )
    print(body)
    if not args.no_record:
        path = record("actors", "Actor runtime: round trip and stream throughput", body)
        print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
