"""Actor runtime benchmark: call round trip and stream throughput over ipc.

Runs the toy actor (``llamad.testing.toy_actor``) in its own process and drives
it from 1 and from 16 client processes. A bare pyzmq ROUTER/DEALER echo over
the same transport is the floor our runtime adds to: the single client
measures it and the call in alternating rounds from the same process (on a
shared VM the machine's speed drifts within a run; rounds give both the same
conditions). Bars (issue 3): p50 round trip ≤ 100 µs, ≥ 50,000 stream
events/s.

    .venv/bin/python bench/actors_bench.py [--calls N] [--events N] [--no-record]

Recorded (``actors-<date>.json`` beside the ``.md``): every alternating
round's call and floor latencies (histograms at 1 µs) and busy time, each of
the 16 clients' latencies and span, and each stream's events and span;
:func:`render` computes the table and the bars from them.
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

from bench.common import hist, percentile, record, show, table, unhist
from llamad.actors import Client
from llamad.testing.toy_actor import spawn_toy

CLIENTS = 16
ROUNDS = 20
RENDER = "bench.actors_bench:render"


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
            lat.append((time.perf_counter() - t0) * 1e6)
        return {"call_us": hist(lat), "begin": begin, "end": time.monotonic()}


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
            rounds = []
            per = calls // ROUNDS
            for _ in range(ROUNDS):
                lat: list[float] = []
                floor: list[float] = []
                begin = time.monotonic()
                for i in range(per):
                    t0 = time.perf_counter()
                    c.call("echo", {"i": i})
                    lat.append(time.perf_counter() - t0)
                busy = time.monotonic() - begin
                for _ in range(per):
                    t0 = time.perf_counter()
                    raw.send(payload)
                    raw.recv()
                    floor.append(time.perf_counter() - t0)
                rounds.append(
                    {
                        "call_us": hist(x * 1e6 for x in lat),
                        "busy_s": busy,
                        "floor_us": hist(x * 1e6 for x in floor),
                        "floor_s": sum(floor),
                    }
                )
            return {"rounds": rounds}
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


def _spans(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each client's result with its begin and end as seconds since the first begin."""
    t0 = min(r["begin"] for r in results)
    return [{**r, "begin": r["begin"] - t0, "end": r["end"] - t0} for r in results]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        raw_endpoint = f"ipc://{tmp}/raw.sock"
        raw_server = start_raw_server(raw_endpoint)
        with spawn_toy("--endpoint", f"ipc://{tmp}/toy.sock", "--no-register") as toy:
            [one] = run_parallel(_alternating_worker, (toy.endpoint, raw_endpoint), 1, args.calls)
            many = run_parallel(_call_worker, toy.endpoint, CLIENTS, args.calls // CLIENTS)
            [s1] = run_parallel(_stream_worker, toy.endpoint, 1, args.events)
            sm = run_parallel(_stream_worker, toy.endpoint, CLIENTS, args.events // CLIENTS)
        stop_raw_server(raw_endpoint, raw_server)
    load_after = os.getloadavg()
    params = {
        "calls": args.calls,
        "events": args.events,
        "clients": CLIENTS,
        "rounds": ROUNDS,
        "uname": " ".join(os.uname()),
        "load_before": load_before[0],
        "load_after": load_after[0],
    }
    data = {
        "alternating": one["rounds"],
        "calls": _spans(many),
        "stream_1": _spans([s1]),
        "stream_many": _spans(sm),
    }
    print(show(RENDER, params, data))
    if not args.no_record:
        path = record(
            "actors", "Actor runtime: round trip and stream throughput", RENDER, params, data
        )
        print(f"recorded {path}")
    return 0


def _span_s(results: list[dict[str, Any]]) -> float:
    return float(max(r["end"] for r in results) - min(r["begin"] for r in results))


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body, from :func:`main`'s ``params`` and ``data`` (latencies in µs)."""
    rounds = data["alternating"]
    floor = unhist(*(r["floor_us"] for r in rounds))
    lat = unhist(*(r["call_us"] for r in rounds))
    many = unhist(*(r["call_us"] for r in data["calls"]))
    rate1 = sum(r["events"] for r in data["stream_1"]) / _span_s(data["stream_1"])
    rate16 = sum(r["events"] for r in data["stream_many"]) / _span_s(data["stream_many"])
    clients = params["clients"]
    rows: list[list[object]] = [
        [
            "bare pyzmq echo (floor)",
            1,
            f"{percentile(floor, 50):.0f}",
            f"{percentile(floor, 99):.0f}",
            f"{len(floor) / sum(r['floor_s'] for r in rounds):,.0f} calls/s",
        ],
        [
            "call round trip",
            1,
            f"{percentile(lat, 50):.0f}",
            f"{percentile(lat, 99):.0f}",
            f"{len(lat) / sum(r['busy_s'] for r in rounds):,.0f} calls/s",
        ],
        [
            "call round trip",
            clients,
            f"{percentile(many, 50):.0f}",
            f"{percentile(many, 99):.0f}",
            f"{len(many) / _span_s(data['calls']):,.0f} calls/s",
        ],
        ["stream events", 1, "", "", f"{rate1:,.0f} events/s"],
        ["stream events", clients, "", "", f"{rate16:,.0f} events/s"],
    ]
    p50_ours = percentile(lat, 50)
    body = table(["measure", "clients", "p50 µs", "p99 µs", "throughput"], rows)
    body += (
        f"\n\nBars: call p50 ≤ 100 µs: {'met' if p50_ours <= 100 else 'MISSED'} "
        f"({p50_ours:.0f} µs; the bare floor is {percentile(floor, 50):.0f} µs); "
        f"≥ 50,000 stream events/s: {'met' if min(rate1, rate16) >= 50_000 else 'MISSED'}.\n\n"
        f"`uname -a`: {params['uname']}\n\n"
        f"Transport ipc; body a small map; {params['calls']} calls, {params['events']} events; "
        "client processes spawned, all against one toy actor process; the floor is a "
        "bare pyzmq ROUTER/DEALER echo (blocking recv, no envelope, no validation, no "
        f"crash watch) measured by the single client in {params['rounds']} rounds alternating "
        "with its calls; latencies kept to 1 µs.\n"
        f"Load average before/after: {params['load_before']:.2f} / {params['load_after']:.2f} "
        "(other work on the machine inflates latency).\n"
    )
    return body


if __name__ == "__main__":
    sys.exit(main())
