"""The public client: the asyncio transport against the blocking one, and 16
streams from one event loop through a real daemon.

    python -m bench.client_bench              # 3 rounds, records bench/results/client-<date>.md
    python -m bench.client_bench --no-record  # print only

**Transport** (a toy actor, no model): call round trip p50 and stream events
per second, the blocking ``llamad.actors.Client`` against
``llamad.actors.aio_client.AsyncActorClient``, alternating rounds.

**16 streams** (``python -m llamad.daemon`` with the default model,
``n_seq_max`` 16): 16 concurrent ``infer`` streams of 32 tokens, from one
event loop with ``AsyncClient`` and from 16 threads sharing one ``Client``;
aggregate tokens per second (bound by the one worker's decoding, so noisy
here), the client process's CPU time per token received, time to first
token, and, for the event loop, how
late a ticker coroutine sleeping 5 ms at a time woke (how long the loop was
held by anything else).

Recorded (``client-<date>.json`` beside the ``.md``): every round's call
latencies (a histogram at 1 µs) and stream rate per transport, and every
round's tokens, wall and CPU time, TTFTs and (one loop) ticker delays per
16-stream client; :func:`render` computes the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.common import hist, median, percentile, record, show, table, unhist
from llamad import AsyncClient, Client, TokenEvent, logs, paths
from llamad.actors import Client as ActorClient
from llamad.actors.aio_client import AsyncActorClient
from llamad.testing import Launcher
from llamad.testing.toy_actor import spawn_toy

STREAMS = 16
TOKENS = 32
CALLS, EVENTS = 2000, 50_000
RENDER = "bench.client_bench:render"


def _prompt(i: int, round_no: int) -> str:
    words = ["river", "stone", "lamp", "cloud", "paper", "garden", "mirror", "copper"]
    body = " ".join(words[(i * 5 + j * 3) % 8] for j in range(40))
    return f"Bench {round_no}-{i} {uuid.uuid4().hex[:6]}: {body}."


# -- transport --------------------------------------------------------------------


def _sync_transport(endpoint: str, calls: int, events: int) -> dict[str, Any]:
    with ActorClient(endpoint, timeout=30) as c:
        c.call("echo", 0)
        times = []
        for i in range(calls):
            t0 = time.perf_counter()
            c.call("echo", i)
            times.append((time.perf_counter() - t0) * 1e6)
        t0 = time.perf_counter()
        n = sum(1 for _ in c.stream("count", {"n": events}))
        took = time.perf_counter() - t0
    return {"call_us": hist(times), "events": n, "stream_s": took}


def _async_transport(endpoint: str, calls: int, events: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        c = AsyncActorClient(endpoint, timeout=30)
        try:
            await c.call("echo", 0)
            times = []
            for i in range(calls):
                t0 = time.perf_counter()
                await c.call("echo", i)
                times.append((time.perf_counter() - t0) * 1e6)
            t0 = time.perf_counter()
            n = 0
            async for _ in await c.stream("count", {"n": events}):
                n += 1
            took = time.perf_counter() - t0
        finally:
            c.close()
        return {"call_us": hist(times), "events": n, "stream_s": took}

    return asyncio.run(main())


def transport(rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Per client kind, each round's call latencies and stream rate."""
    base = Path(tempfile.mkdtemp(prefix="lcb-", dir="/tmp"))
    out: dict[str, list[dict[str, Any]]] = {"blocking": [], "asyncio": []}
    try:
        with spawn_toy("--endpoint", f"ipc://{base}/toy.sock", "--no-register") as toy:
            for r in range(rounds):
                order = ["blocking", "asyncio"] if r % 2 == 0 else ["asyncio", "blocking"]
                for kind in order:
                    run = _sync_transport if kind == "blocking" else _async_transport
                    out[kind].append(run(toy.endpoint, CALLS, EVENTS))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return out


# -- 16 streams through the daemon -------------------------------------------------


@contextmanager
def daemon() -> Iterator[str]:
    d = Launcher(prefix="lcb-", instance=f"b{uuid.uuid4().hex[:10]}")
    d.runtime.mkdir(mode=0o700)
    d.write_config(
        f"""
[daemon]
runtime_dir = "{d.runtime}"
state_dir = "{d.state}"
log_format = "json"
log_level = "warning"
[cache]
instance = "{d.instance}"
[cache.ram_file]
quota = 0
[security]
model_dirs = ["{paths.default_model_path().parent}"]
[models.smol]
path = "default"
n_ctx = 4096
n_batch = 512
n_seq_max = {STREAMS}
"""
    )
    try:
        d.start().wait_routed(["smol"], timeout=120)
        yield d.endpoint
    finally:
        d.close(120)


def _one_loop(endpoint: str, round_no: int) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        delays: list[float] = []
        running = True

        async def ticker() -> None:
            while running:
                t0 = time.monotonic()
                await asyncio.sleep(0.005)
                delays.append(time.monotonic() - t0 - 0.005)

        async with AsyncClient(endpoint, timeout=300) as client:
            tick = asyncio.ensure_future(ticker())
            start = time.monotonic()
            cpu = time.process_time()
            ttft: list[float] = []

            async def one(i: int) -> int:
                t0 = time.monotonic()
                stream = await client.infer(
                    "smol", _prompt(i, round_no), max_tokens=TOKENS, temperature=0.0
                )
                n = 0
                async for event in stream:
                    if isinstance(event, TokenEvent):
                        if n == 0:
                            ttft.append(time.monotonic() - t0)
                        n += 1
                return n

            counts = await asyncio.gather(*(one(i) for i in range(STREAMS)))
            elapsed = time.monotonic() - start
            cpu = time.process_time() - cpu
            running = False
            await tick
        return {
            "tokens": list(counts),
            "elapsed_s": elapsed,
            "cpu_s": cpu,
            "ttft_s": ttft,
            "tick_late_us": hist(x * 1e6 for x in delays),
        }

    return asyncio.run(main())


def _threads(endpoint: str, round_no: int) -> dict[str, Any]:
    ttft: list[float] = []
    counts: list[int] = []
    lock = threading.Lock()
    with Client(endpoint, timeout=300) as client:

        def one(i: int) -> None:
            t0 = time.monotonic()
            n = 0
            for event in client.infer(
                "smol", _prompt(i, round_no), max_tokens=TOKENS, temperature=0.0
            ):
                if isinstance(event, TokenEvent):
                    if n == 0:
                        with lock:
                            ttft.append(time.monotonic() - t0)
                    n += 1
            with lock:
                counts.append(n)

        start = time.monotonic()
        cpu = time.process_time()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(STREAMS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - start
        cpu = time.process_time() - cpu
    return {"tokens": counts, "elapsed_s": elapsed, "cpu_s": cpu, "ttft_s": ttft}


def streams(rounds: int) -> dict[str, list[dict[str, Any]]]:
    """Per client, each round's tokens, times, TTFTs (and ticker delays)."""
    results: dict[str, list[dict[str, Any]]] = {
        "AsyncClient, one loop": [],
        "Client, 16 threads": [],
    }
    with daemon() as endpoint:
        _one_loop(endpoint, -1)  # warm-up: connections, first decodes
        for r in range(rounds):
            order = list(results) if r % 2 == 0 else list(reversed(results))
            for kind in order:
                run = _one_loop if kind.startswith("Async") else _threads
                results[kind].append(run(endpoint, r))
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    logs.configure(level="warning")
    params = {
        "rounds": args.rounds,
        "load": os.getloadavg()[0],
        "calls": CALLS,
        "events": EVENTS,
        "streams": STREAMS,
        "tokens": TOKENS,
    }
    data = {"transport": transport(args.rounds), "streams": streams(args.rounds)}
    print(show(RENDER, params, data))
    if not args.no_record:
        title = "Public client: asyncio transport and 16 streams"
        print(record("client", title, RENDER, params, data))
    return 0


def _stream_row(kind: str, rs: list[dict[str, Any]]) -> list[object]:
    """One 16-stream client's row: per-round figures, their medians over rounds."""

    def med(fn: Any) -> float:
        return median([fn(r) for r in rs])

    row: list[object] = [
        kind,
        f"{med(lambda r: sum(r['tokens']) / r['elapsed_s']):.0f}",
        f"{med(lambda r: r['cpu_s'] / sum(r['tokens']) * 1e6):.0f}",
        f"{med(lambda r: percentile(r['ttft_s'], 50)) * 1000:.0f}",
        f"{med(lambda r: percentile(r['ttft_s'], 99)) * 1000:.0f}",
    ]
    if "tick_late_us" in rs[0]:
        row += [
            f"{med(lambda r: percentile(unhist(r['tick_late_us']), 50)) / 1000:.2f}",
            f"{med(lambda r: percentile(unhist(r['tick_late_us']), 99)) / 1000:.2f}",
            f"{max(max(unhist(r['tick_late_us'])) for r in rs) / 1000:.1f}",
        ]
    else:
        row += ["-", "-", "-"]
    return row


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body from :func:`main`'s ``params`` and ``data``."""
    t = table(
        ["client", "call p50 (µs)", "stream events/s"],
        [
            [
                kind,
                f"{median([median(unhist(r['call_us'])) for r in rs]):.0f}",
                f"{median([r['events'] / r['stream_s'] for r in rs]) / 1000:.0f} k",
            ]
            for kind, rs in data["transport"].items()
        ],
    )
    s = table(
        [
            f"{params['streams']} streams of {params['tokens']} tokens",
            "tok/s",
            "client CPU per token (µs)",
            "TTFT p50 (ms)",
            "TTFT p99 (ms)",
            "tick late p50 (ms)",
            "p99 (ms)",
            "max (ms)",
        ],
        [_stream_row(kind, rs) for kind, rs in data["streams"].items()],
    )
    return (
        f"Load average at start: {params['load']:.2f}. Medians of {params['rounds']} "
        "alternating rounds (latencies kept to 1 µs).\n\n"
        f"## Transport (toy actor, ipc)\n\n{t}\n\n## 16 streams through the daemon\n\n{s}\n"
    )


if __name__ == "__main__":
    sys.exit(main())
