"""Cache I/O: save and load of a 2048-token KV payload per tier, beside plain copies.

The payload is 2048 tokens x 23,040 bytes (47 MB, the default model's KV per
2048 tokens). Per tier it measures

- save: the whole publish protocol (reserve, tmp write, fdatasync, check,
  link, fsync dir, announce) against an in-process cache-meta, beside a plain
  ``write`` + ``fdatasync`` of the same bytes into the same directory;
- load: a full validated read (header, TLV, key, payload CRC32C) into a
  reusable pre-faulted buffer, beside a plain ``memcpy`` of the same bytes and
  a plain ``pread`` of the same bytes from a file in the same directory (page
  cache warm);
- for ``ram``, also a mapped restore: CRC-check the payload in place, the
  bytes ``llama_state_seq_set_data`` can read with no intermediate buffer;
  and the cost of mapping a segment, which the writer pool pays right after a
  ``ram`` save. A row's first load in a process that did not map it yet pays
  it on the load ("first load"); later loads reuse the mapping.

Measurements are interleaved rep by rep so that load from other processes
hits all columns alike; medians are reported. Bars (issue 4): ``ram`` load
<= 2x memcpy; ``disk`` load <= 3x a plain read.

    python -m bench.cache_io_bench [--reps N] [--disk-root DIR] [--record]

Recorded (``cache-io-<date>.json`` beside the ``.md``): every measured time
of every tier (seconds); :func:`render` takes the medians and judges the bars.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import median, percentile, record, show, table
from llamad.cache.counters import DictCounters
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import KvcSpec, SaveReason
from llamad.cache.meta import CacheMeta, MetaConfig
from llamad.cache.publish import LocalMeta, PublishOutcome, publish
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import SEGMENTS, Tier, TierConfig, TierStore, build_tiers

N_TOKENS = 2048
BYTES_PER_TOKEN = 23_040
PAYLOAD_LEN = N_TOKENS * BYTES_PER_TOKEN
NS = Namespace(fingerprint=b"\x5a" * 32, quant=3, ctx_hash=b"\xa5" * 32)
RENDER = "bench.cache_io_bench:render"


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f}"


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prefaulted(n: int) -> bytearray:
    buf = bytearray(n)
    buf[::4096] = b"\x01" * len(range(0, n, 4096))
    return buf


def plain_write(path: Path, payload: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(payload)
        while view:
            view = view[os.write(fd, view) :]
        os.fdatasync(fd)
    finally:
        os.close(fd)


def plain_read(path: Path, buf: bytearray) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        view = memoryview(buf)
        done = 0
        while done < PAYLOAD_LEN:
            done += os.preadv(fd, [view[done:PAYLOAD_LEN]], done)
    finally:
        os.close(fd)


def validate_mapped(tier: Tier, key: bytes) -> None:
    """A ram restore without the buffer copy: map and CRC-check in place."""
    with tier.mapped_payload(key) as view:
        assert view.nbytes == PAYLOAD_LEN


def bench_tier(tier: Tier, payload: bytes, reps: int) -> dict[str, list[float]]:
    meta = CacheMeta(
        MetaConfig(quotas={tier.name: 8 * PAYLOAD_LEN}),
        TierStore(build_tiers([tier.config])),
        counters=DictCounters(),
    )
    writer = LocalMeta(meta)
    plain = tier.root / f"plain-{uuid.uuid4().hex}.bin"
    out: dict[str, list[float]] = {
        k: [] for k in ("save", "write", "first_load", "load", "mapped", "warm", "memcpy", "read")
    }
    buf = prefaulted(PAYLOAD_LEN)
    scratch = prefaulted(PAYLOAD_LEN)
    scratch_view = memoryview(scratch)
    keys: list[bytes] = []
    try:
        for rep in range(reps):
            spec = KvcSpec(
                NS,
                tokens_to_bytes([rep, *range(1, N_TOKENS)]),
                FingerprintMode.SAFE,
                SaveReason.COLD,
            )
            started = time.perf_counter()
            outcome = publish(writer, tier, spec, payload).outcome
            out["save"].append(time.perf_counter() - started)
            assert outcome is PublishOutcome.PUBLISHED, outcome
            keys.append(spec.key)
            out["write"].append(timed(lambda: plain_write(plain, payload)))
            load_row = functools.partial(tier.read_into, spec.key, buf)
            out["first_load"].append(timed(load_row))
            assert buf == payload
            for _ in range(3):
                out["memcpy"].append(timed(lambda: scratch_view.__setitem__(slice(None), payload)))
                out["read"].append(timed(lambda: plain_read(plain, scratch)))
                out["load"].append(timed(load_row))
                if tier.kind is TierKind.RAM:
                    out["mapped"].append(timed(functools.partial(validate_mapped, tier, spec.key)))
            if tier.kind is TierKind.RAM:
                # What the writer pool does after a ram save, off the restore path.
                SEGMENTS.drop(tier.path_for(spec.key))
                out["warm"].append(timed(functools.partial(tier.warm, spec.key)))
            # Keep the tier small: only the latest row stays.
            if len(keys) > 1:
                ref = meta.lookup_exact(keys[-2])
                assert ref is not None
                meta.forget(keys[-2])
    finally:
        plain.unlink(missing_ok=True)
        for key in keys:
            tier.delete(key)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--disk-root", type=Path, default=None)
    parser.add_argument("--record", action="store_true", help="write bench/results/")
    args = parser.parse_args(argv)

    payload = os.urandom(PAYLOAD_LEN)
    disk_parent = args.disk_root or Path(os.environ.get("LLAMAD_BENCH_DISK", "/var/tmp"))
    disk_root = Path(tempfile.mkdtemp(prefix="llamad-bench-disk-", dir=disk_parent))
    ram_file_root = Path(tempfile.mkdtemp(prefix="llamad-bench-ramfile-", dir="/dev/shm"))
    tiers = [
        Tier(TierConfig(TierKind.RAM, Path("/dev/shm"), 1 << 34, f"bench{os.getpid()}")),
        Tier(TierConfig(TierKind.RAM_FILE, ram_file_root, 1 << 34)),
        Tier(TierConfig(TierKind.DISK, disk_root, 1 << 34)),
    ]
    measured = []
    try:
        for tier in tiers:
            tier.prepare()
            measured.append(
                {"tier": tier.name, "kind": tier.kind.value, **bench_tier(tier, payload, args.reps)}
            )
    finally:
        shutil.rmtree(disk_root, ignore_errors=True)
        shutil.rmtree(ram_file_root, ignore_errors=True)
        tiers[0].purge()

    params = {
        "reps": args.reps,
        "n_tokens": N_TOKENS,
        "bytes_per_token": BYTES_PER_TOKEN,
        "disk_parent": str(disk_parent),
    }
    data = {"tiers": measured}
    print(show(RENDER, params, data))
    if args.record:
        path = record("cache-io", "Cache I/O: save and load per tier", RENDER, params, data)
        print(f"recorded {path}", file=sys.stderr)
    return 0


HEADERS = [
    "tier",
    "save ms",
    "plain write+fdatasync ms",
    "first load ms",
    "load ms (p50)",
    "load ms (p90)",
    "mapped, no copy ms",
    "map (writer warms) ms",
    "memcpy ms",
    "plain read ms",
    "load/memcpy",
    "load/read",
]


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body from :func:`main`'s ``params`` and ``data``: each tier's
    times in seconds as :func:`bench_tier` measured them; medians and bars here."""
    rows = []
    verdicts = []
    for r in data["tiers"]:
        load, memcpy, read = median(r["load"]), median(r["memcpy"]), median(r["read"])
        rows.append(
            [
                r["tier"],
                ms(median(r["save"])),
                ms(median(r["write"])),
                ms(median(r["first_load"])),
                ms(load),
                ms(percentile(r["load"], 90)),
                ms(median(r["mapped"])) if r["mapped"] else "-",
                ms(median(r["warm"])) if r["warm"] else "-",
                ms(memcpy),
                ms(read),
                f"{load / memcpy:.2f}",
                f"{load / read:.2f}",
            ]
        )
        if r["kind"] == TierKind.RAM.value:
            met = "met" if load <= 2 * memcpy else "NOT met"
            verdicts.append(f"- ram load <= 2x memcpy: {load / memcpy:.2f}x, {met}")
        if r["kind"] == TierKind.DISK.value:
            met = "met" if load <= 3 * read else "NOT met"
            verdicts.append(f"- disk load <= 3x plain read: {load / read:.2f}x, {met}")
    payload = params["n_tokens"] * params["bytes_per_token"]
    return (
        f"Payload {params['n_tokens']} tokens x {params['bytes_per_token']} bytes = "
        f"{payload / 1e6:.1f} MB; {params['reps']} saves, each followed by its first load and "
        "3 more loads interleaved with memcpy and plain reads (medians unless noted); "
        f"disk tier under {params['disk_parent']}.\n\n"
        + table(HEADERS, rows)
        + "\n\n"
        + "\n".join(verdicts)
        + "\n"
    )


if __name__ == "__main__":
    raise SystemExit(main())
