"""Cache lookup latency: 10,000 rows, looked up from another process over the actor transport.

The index holds rows of varied lengths (log-uniform, 256 to 32,768 tokens)
arranged as conversations: each conversation's rows are prefixes of one token
stream, the way cold, continued and finish saves of a chat are. The rows are
written as ``.kvc`` files into a ``ram_file`` tier and a real cache-meta
process adopts them at startup (its rebuild time is reported too). This
process then calls cache-meta exactly as a model worker does, through
:class:`llamad.cache.client.CacheClient`:

- ``lookup_exact`` of a saved key (pinned; the checkin is not timed);
- ``longest_prefix`` of 2,000- and 30,000-token prompts that extend a saved
  conversation and then diverge (a hit: the longest saved prefix at any
  length), and of random prompts (a miss);
- the transport's own round trip (``$ping``) beside them, and cache-meta's
  server-side ``longest_prefix_ns`` per lookup from its counters.

Every kind of call is measured in alternating rounds (a block of each per
round), beside a bare ZeroMQ echo between two processes: on a shared VM the
machine's speed drifts within a run, and rounds give every row the same
conditions.

Bars (issue 4): longest-prefix p50 ≤ 200 µs at 2,000 tokens and ≤ 1 ms at
30,000 tokens.

    python -m bench.cache_lookup_bench [--rows 10000] [--samples 2000] [--record]

Recorded (``cache-lookup-<date>.json`` beside the ``.md``): per row of the
table, every round's call latencies (a histogram at 1 µs) and, for the
longest-prefix rows, the round's hits, cache-meta's server time and probes;
:func:`render` computes the percentiles and the bars.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from bench.common import hist, median, percentile, record, show, table, unhist
from llamad.cache.client import CacheClient
from llamad.cache.key import FingerprintMode, Namespace
from llamad.cache.kvc import KvcSpec, SaveReason, write_kvc
from llamad.cache.lookup import HitKind
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import Tier
from llamad.testing import MetaProcess, discard_scratch, scratch_settings

NS = Namespace(fingerprint=b"\xb1" * 32, quant=3, ctx_hash=b"\xb2" * 32)
MAX_LEN = 32_768
MIN_LEN = 256
PAYLOAD = b"\x00" * 64  # the bytes are irrelevant to a lookup
RENDER = "bench.cache_lookup_bench:render"
LENGTHS = (2000, 30_000)


def log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return round(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def write_rows(tier: Tier, n_rows: int, per_conv: int, rng: random.Random) -> list[bytes]:
    """Write ``n_rows`` rows; returns each conversation's token stream (u32 LE)."""
    convs = []
    written = 0
    while written < n_rows:
        stream = os.urandom(4 * MAX_LEN)
        convs.append(stream)
        lengths = {log_uniform(rng, MIN_LEN, MAX_LEN) for _ in range(per_conv)}
        for n in sorted(lengths):
            if written >= n_rows:
                break
            spec = KvcSpec(NS, stream[: 4 * n], FingerprintMode.SAFE, SaveReason.CONTINUED)
            fd = os.open(tier.path_for(spec.key), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                write_kvc(fd, spec, PAYLOAD)
            finally:
                os.close(fd)
            written += 1
    return convs


def sample(fn: Callable[[], object], n: int) -> list[float]:
    """Per-call wall time in microseconds."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out


_ECHO = """
import sys, zmq
ctx = zmq.Context(); sock = ctx.socket(zmq.ROUTER); sock.bind(sys.argv[1])
print("READY", flush=True)
while True:
    frames = sock.recv_multipart()
    if frames[-1] == b"stop":
        break
    sock.send_multipart(frames)
sock.close(linger=0); ctx.term()
"""


class RawEcho:
    """A bare DEALER/ROUTER echo over ipc between two processes: the floor under any call."""

    def __init__(self, where: Path) -> None:
        endpoint = f"ipc://{where / 'echo.sock'}"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _ECHO, endpoint], stdout=subprocess.PIPE
        )
        assert self.proc.stdout is not None
        self.proc.stdout.readline()
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.connect(endpoint)
        for _ in range(200):
            self.once()

    def once(self) -> None:
        self.sock.send(b"x")
        self.sock.recv()

    def close(self) -> None:
        self.sock.send(b"stop")
        self.proc.wait(10)
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        self.sock.close(linger=0)
        self.ctx.term()


def row(name: str, us: list[float], note: str = "") -> list[object]:
    return [
        name,
        len(us),
        f"{median(us):.0f}",
        f"{percentile(us, 90):.0f}",
        f"{percentile(us, 99):.0f}",
        note,
    ]


def lp_name(length: int, hit: bool) -> str:
    return f"longest_prefix {length:,} tok ({'hit' if hit else 'miss'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--per-conversation", type=int, default=20)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds")
    parser.add_argument("--record", action="store_true", help="write bench/results/")
    args = parser.parse_args()
    rng = random.Random(20261125)
    load_before = os.getloadavg()[0]

    # No write-behind: 10,000 rows copied to disk behind the lookups would
    # time the disk, not the lookups.
    settings = scratch_settings(prefix="lcb", ram_file_quota=64 << 30, write_behind=False)
    ram_file = settings.tier(TierKind.RAM_FILE)
    assert ram_file is not None and settings.registry_root is not None
    base = settings.registry_root.parent
    tier = Tier(ram_file)
    tier.prepare()
    try:
        t0 = time.monotonic()
        convs = write_rows(tier, args.rows, args.per_conversation, rng)
        write_s = time.monotonic() - t0
        t0 = time.monotonic()
        with MetaProcess(settings, ready_timeout=600), CacheClient.from_settings(settings) as cache:
            start_s = time.monotonic() - t0
            status = cache.status()
            assert status["rows"] == args.rows, status
            keys = [bytes.fromhex(r["key"]) for r in cache.dump()]

            def prompts(length: int, hit: bool, n: int) -> list[bytes]:
                out = []
                for _ in range(n):
                    if hit:
                        stream = rng.choice(convs)
                        cut = rng.randrange(length // 2, length)
                        out.append(stream[: 4 * cut] + os.urandom(4 * (length - cut)))
                    else:
                        out.append(os.urandom(4 * length))
                return out

            n = args.samples
            for _ in range(200):  # warm up connections, caches and the allocator
                cache.lookup_exact(rng.choice(keys), pin=False)

            def exact(per: int) -> list[float]:
                # Time only the lookup: the checkin is a second call a worker makes later.
                out = []
                for _ in range(per):
                    key = rng.choice(keys)
                    t_start = time.perf_counter_ns()
                    ref = cache.lookup_exact(key)
                    out.append((time.perf_counter_ns() - t_start) / 1000)
                    assert ref is not None
                    cache.checkin(ref.pin)
                return out

            kinds = [(length, hit) for length in LENGTHS for hit in (True, False)]
            batches = {
                (length, hit): prompts(length, hit, n if length == 2000 else max(200, n // 4))
                for length, hit in kinds
            }
            # Per table row, one entry per round.
            rounds: dict[str, list[dict[str, Any]]] = {
                name: [] for name in ("raw", "ping", "exact", *(lp_name(*k) for k in kinds))
            }
            raw = RawEcho(base)
            try:
                for r in range(args.rounds):
                    per = n // args.rounds
                    rounds["raw"].append({"us": hist(sample(raw.once, per))})
                    ping = sample(lambda: cache._client.call("$ping", {}), per)
                    rounds["ping"].append({"us": hist(ping)})
                    rounds["exact"].append({"us": hist(exact(per))})
                    for kind in kinds:
                        batch = batches[kind]
                        step = len(batch) // args.rounds
                        before = cache.counters()
                        us, hits = [], 0
                        for prompt in batch[r * step : (r + 1) * step]:
                            t_start = time.perf_counter_ns()
                            found = cache.longest_prefix(NS, prompt)
                            us.append((time.perf_counter_ns() - t_start) / 1000)
                            if found.row is not None:
                                hits += 1
                                assert found.kind in (HitKind.PREFIX, HitKind.COMMON)
                                cache.checkin(found.row.pin)
                        after = cache.counters()
                        rounds[lp_name(*kind)].append(
                            {
                                "us": hist(us),
                                "hits": hits,
                                "server_ns": after["longest_prefix_ns"]
                                - before["longest_prefix_ns"],
                                "probes": after["longest_prefix_probes"]
                                - before["longest_prefix_probes"],
                            }
                        )
            finally:
                raw.close()
            final = cache.status()
    finally:
        discard_scratch(settings)

    params = {
        "rows": args.rows,
        "conversations": len(convs),
        "per_conversation": args.per_conversation,
        "min_len": MIN_LEN,
        "max_len": MAX_LEN,
        "samples": args.samples,
        "rounds": args.rounds,
        "write_s": write_s,
        "start_s": start_s,
        "pins_after": final["pins"],
        "load_before": load_before,
        "load_after": os.getloadavg()[0],
    }
    data = {"rows": rounds}
    print(show(RENDER, params, data))
    if args.record:
        title = "Cache lookup latency (10,000 rows, over the actor transport)"
        print(record("cache-lookup", title, RENDER, params, data))


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body from :func:`main`'s ``params`` and ``data``: per table
    row, each round's latencies (µs) and longest-prefix counts; the bars here."""
    rows = data["rows"]

    def us(name: str) -> list[float]:
        return unhist(*(r["us"] for r in rows[name]))

    results = [
        row("raw ZeroMQ ipc echo (no runtime)", us("raw"), "peer: the floor"),
        row("actor round trip ($ping)", us("ping"), "peer: the transport"),
        row("lookup_exact (hit, pinned)", us("exact")),
    ]
    for length in LENGTHS:
        for hit in (True, False):
            name = lp_name(length, hit)
            got, count = rows[name], len(us(name))
            server = sum(r["server_ns"] for r in got) / count / 1000
            results.append(
                row(
                    name,
                    us(name),
                    f"hits {sum(r['hits'] for r in got)}/{count}; server {server:.0f} µs; "
                    f"{sum(r['probes'] for r in got) / count:.0f} probes",
                )
            )
    body = table(["lookup", "n", "p50 µs", "p90 µs", "p99 µs", "notes"], results)
    lp2k = next(r for r in results if r[0] == lp_name(2000, True))
    lp30k = next(r for r in results if r[0] == lp_name(30_000, True))
    bars = table(
        ["bar", "measured p50", "limit", "met"],
        [
            ["longest prefix, 2,000 tokens", f"{lp2k[2]} µs", "200 µs", float(str(lp2k[2])) <= 200],
            [
                "longest prefix, 30,000 tokens",
                f"{lp30k[2]} µs",
                "1000 µs",
                float(str(lp30k[2])) <= 1000,
            ],
        ],
    )
    setup = (
        f"{params['rows']:,} rows ({params['conversations']} conversations, lengths "
        f"log-uniform {params['min_len']}..{params['max_len']} tokens) in a ram_file tier; "
        f"files written in {params['write_s']:.1f} s; cache-meta start with index rebuild "
        f"{params['start_s']:.1f} s; pins after the run: {params['pins_after']}. Client and "
        "cache-meta are separate processes on ipc://; every row measured in "
        f"{params['rounds']} alternating rounds; latencies kept to 1 µs. "
        f"Load average before/after: {params['load_before']:.2f} / {params['load_after']:.2f}."
    )
    return f"{setup}\n\n{body}\n\n{bars}\n"


if __name__ == "__main__":
    main()
