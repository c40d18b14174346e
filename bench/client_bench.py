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

from bench.common import median, percentile, record, table
from llamad import AsyncClient, Client, TokenEvent, logs, paths
from llamad.actors import Client as ActorClient
from llamad.actors.aio_client import AsyncActorClient
from llamad.actors.testing import spawn_toy
from llamad.testing import Launcher

STREAMS = 16
TOKENS = 32


def _prompt(i: int, round_no: int) -> str:
    words = ["river", "stone", "lamp", "cloud", "paper", "garden", "mirror", "copper"]
    body = " ".join(words[(i * 5 + j * 3) % 8] for j in range(40))
    return f"Bench {round_no}-{i} {uuid.uuid4().hex[:6]}: {body}."


# -- transport --------------------------------------------------------------------


def _sync_transport(endpoint: str, calls: int, events: int) -> tuple[float, float]:
    with ActorClient(endpoint, timeout=30) as c:
        c.call("echo", 0)
        times = []
        for i in range(calls):
            t0 = time.perf_counter()
            c.call("echo", i)
            times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        n = sum(1 for _ in c.stream("count", {"n": events}))
        rate = n / (time.perf_counter() - t0)
    return median(times) * 1e6, rate


def _async_transport(endpoint: str, calls: int, events: int) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        c = AsyncActorClient(endpoint, timeout=30)
        try:
            await c.call("echo", 0)
            times = []
            for i in range(calls):
                t0 = time.perf_counter()
                await c.call("echo", i)
                times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            n = 0
            async for _ in await c.stream("count", {"n": events}):
                n += 1
            rate = n / (time.perf_counter() - t0)
        finally:
            c.close()
        return median(times) * 1e6, rate

    return asyncio.run(main())


def transport(rounds: int) -> list[list[object]]:
    base = Path(tempfile.mkdtemp(prefix="lcb-", dir="/tmp"))
    rows: dict[str, list[tuple[float, float]]] = {"blocking": [], "asyncio": []}
    try:
        with spawn_toy("--endpoint", f"ipc://{base}/toy.sock", "--no-register") as toy:
            for r in range(rounds):
                order = ["blocking", "asyncio"] if r % 2 == 0 else ["asyncio", "blocking"]
                for kind in order:
                    run = _sync_transport if kind == "blocking" else _async_transport
                    rows[kind].append(run(toy.endpoint, 2000, 50_000))
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [
        [
            kind,
            f"{median([r[0] for r in rs]):.0f}",
            f"{median([r[1] for r in rs]) / 1000:.0f} k",
        ]
        for kind, rs in rows.items()
    ]


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


def _one_loop(endpoint: str, round_no: int) -> dict[str, float]:
    async def main() -> dict[str, float]:
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
            "tok_s": sum(counts) / elapsed,
            "cpu_us": cpu / sum(counts) * 1e6,
            "ttft_p50": percentile(ttft, 50),
            "ttft_p99": percentile(ttft, 99),
            "tick_p50": percentile(delays, 50),
            "tick_p99": percentile(delays, 99),
            "tick_max": max(delays),
        }

    return asyncio.run(main())


def _threads(endpoint: str, round_no: int) -> dict[str, float]:
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
    return {
        "tok_s": sum(counts) / elapsed,
        "cpu_us": cpu / sum(counts) * 1e6,
        "ttft_p50": percentile(ttft, 50),
        "ttft_p99": percentile(ttft, 99),
    }


def streams(rounds: int) -> list[list[object]]:
    results: dict[str, list[dict[str, float]]] = {
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
    rows = []
    for kind, rs in results.items():

        def med(key: str, rs: list[dict[str, float]] = rs) -> float:
            return median([x[key] for x in rs])

        row: list[object] = [
            kind,
            f"{med('tok_s'):.0f}",
            f"{med('cpu_us'):.0f}",
            f"{med('ttft_p50') * 1000:.0f}",
            f"{med('ttft_p99') * 1000:.0f}",
        ]
        if "tick_max" in rs[0]:
            row += [
                f"{med('tick_p50') * 1000:.2f}",
                f"{med('tick_p99') * 1000:.2f}",
                f"{max(x['tick_max'] for x in rs) * 1000:.1f}",
            ]
        else:
            row += ["-", "-", "-"]
        rows.append(row)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    logs.configure(level="warning")
    load = os.getloadavg()[0]
    t = table(
        ["client", "call p50 (µs)", "stream events/s"],
        transport(args.rounds),
    )
    s = table(
        [
            "16 streams of 32 tokens",
            "tok/s",
            "client CPU per token (µs)",
            "TTFT p50 (ms)",
            "TTFT p99 (ms)",
            "tick late p50 (ms)",
            "p99 (ms)",
            "max (ms)",
        ],
        streams(args.rounds),
    )
    body = (
        f"Load average at start: {load:.2f}. Medians of {args.rounds} alternating rounds.\n\n"
        f"## Transport (toy actor, ipc)\n\n{t}\n\n## 16 streams through the daemon\n\n{s}\n"
    )
    print(body)
    if not args.no_record:
        print(record("client", "Public client: asyncio transport and 16 streams", body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
