"""Actor runtime benchmark: call round trip and stream throughput over ipc.

Runs the toy actor (``llamad.actors.testing``) in its own process and drives
it from 1 and from 16 client processes. A bare pyzmq ROUTER/DEALER echo over
the same transport is the floor our runtime adds to: the single client
measures it and the call in alternating rounds from the same process (on a
shared VM the machine's speed drifts within a run; rounds give both the same
conditions). Bars (issue 3): p50 round trip ≤ 100 µs, ≥ 50,000 stream
events/s.

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
ROUNDS = 20


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


def _alternating_worker(endpoints: tuple[str, str], calls: int, start_at: float) -> dict[str, Any]:
    """One client: the actor call and the bare echo floor, in alternating rounds."""
    endpoint, raw_endpoint = endpoints
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.connect(raw_endpoint)
    payload = b"\x95\x01\x01\x01\xa4echo\x81\xa1i\x01"
    try:
        with Client(endpoint, timeout=60) as c:
            for i in range(200):
                c.call("echo", {"i": i})
                raw.send(payload)
                raw.recv()
            while time.monotonic() < start_at:
                time.sleep(0.001)
            lat: list[float] = []
            floor: list[float] = []
            busy = 0.0
            per = calls // ROUNDS
            for _ in range(ROUNDS):
                begin = time.monotonic()
                for i in range(per):
                    t0 = time.perf_counter()
                    c.call("echo", {"i": i})
                    lat.append(time.perf_counter() - t0)
                busy += time.monotonic() - begin
                for _ in range(per):
                    t0 = time.perf_counter()
                    raw.send(payload)
                    raw.recv()
                    floor.append(time.perf_counter() - t0)
            return {"lat": lat, "floor": floor, "busy": busy}
    finally:
        raw.close(0)
        ctx.term()


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


def start_raw_server(endpoint: str) -> multiprocessing.process.BaseProcess:
    server = multiprocessing.get_context("spawn").Process(target=_raw_server, args=(endpoint,))
    server.start()
    return server


def stop_raw_server(endpoint: str, server: multiprocessing.process.BaseProcess) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.connect(endpoint)
    sock.send(b"stop")
    server.join(30)
    sock.close(0)
    ctx.term()


def run_parallel(worker: Any, endpoint: Any, n: int, count: int) -> list[dict[str, Any]]:
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
        raw_endpoint = f"ipc://{tmp}/raw.sock"
        raw_server = start_raw_server(raw_endpoint)
        with spawn_toy("--endpoint", f"ipc://{tmp}/toy.sock", "--no-register") as toy:
            [one] = run_parallel(_alternating_worker, (toy.endpoint, raw_endpoint), 1, args.calls)
            floor = one["floor"]
            rows.append(
                [
                    "bare pyzmq echo (floor)",
                    1,
                    us(percentile(floor, 50)),
                    us(percentile(floor, 99)),
                    f"{len(floor) / sum(floor):,.0f} calls/s",
                ]
            )
            lat = one["lat"]
            rows.append(
                [
                    "call round trip",
                    1,
                    us(percentile(lat, 50)),
                    us(percentile(lat, 99)),
                    f"{len(lat) / one['busy']:,.0f} calls/s",
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
        stop_raw_server(raw_endpoint, raw_server)
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
        f"crash watch) measured by the single client in {ROUNDS} rounds alternating "
        "with its calls.\n"
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
