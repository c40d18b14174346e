"""Small hand-made runs of every bench, as their result JSON holds them.

Each function returns ``(render, params, data)``: the ``bench`` field of a
result file (``module:function``), and ``params`` and ``data`` shaped as the
bench records them, small enough to reason about. Keyword arguments move the
measured values across a bar, so a test can check the verdict both ways.
The values are what :func:`json.loads` gives back (lists, not tuples), as
:func:`bench.common.record` renders from.
"""

from __future__ import annotations

from typing import Any

Sample = tuple[str, dict[str, Any], dict[str, Any]]


def hist(*values: int) -> dict[str, list[int]]:
    keys = sorted(set(values))
    return {"us": keys, "n": [values.count(k) for k in keys]}


def actors(call_us: int = 90, events: int = 100_000) -> Sample:
    rounds = [
        {
            "call_us": hist(call_us, call_us, 200),
            "busy_s": 0.001,
            "floor_us": hist(80, 85, 90),
            "floor_s": 0.0003,
        }
        for _ in range(2)
    ]
    clients = [{"call_us": hist(400, 500), "begin": 0.0, "end": 0.002} for _ in range(2)]
    stream = [{"events": events, "begin": 0.0, "end": 1.0}]
    params = {
        "calls": 6,
        "events": events,
        "clients": 2,
        "rounds": 2,
        "uname": "Linux vm",
        "load_before": 0.5,
        "load_after": 0.7,
    }
    data = {"alternating": rounds, "calls": clients, "stream_1": stream, "stream_many": stream}
    return "bench.actors_bench:render", params, data


def cache_io(ram_load_s: float = 0.008, disk_load_s: float = 0.010) -> Sample:
    def tier(name: str, load: float, ram: bool) -> dict[str, Any]:
        return {
            "tier": name,
            "kind": name,
            "save": [0.02, 0.018],
            "write": [0.015, 0.014],
            "first_load": [0.012, 0.011],
            "load": [load, load, load],
            "mapped": [0.003, 0.003] if ram else [],
            "warm": [0.0028] if ram else [],
            "memcpy": [0.005, 0.005, 0.005],
            "read": [0.004, 0.004, 0.004],
        }

    data = {
        "tiers": [
            tier("ram", ram_load_s, True),
            tier("ram_file", 0.012, False),
            tier("disk", disk_load_s, False),
        ]
    }
    params = {"reps": 1, "n_tokens": 2048, "bytes_per_token": 23040, "disk_parent": "/var/tmp"}
    return "bench.cache_io_bench:render", params, data


def cache_lookup(lp2k_us: int = 150, lp30k_us: int = 900) -> Sample:
    def lp(us: int, hit: bool) -> list[dict[str, Any]]:
        one = {"us": hist(us, us, us + 50), "hits": 3 if hit else 0, "server_ns": 30_000}
        return [one | {"probes": 12}, one | {"probes": 12}]

    rows = {
        "raw": [{"us": hist(30, 31)}, {"us": hist(32, 33)}],
        "ping": [{"us": hist(60, 61)}, {"us": hist(62, 63)}],
        "exact": [{"us": hist(80, 81)}, {"us": hist(82, 83)}],
        "longest_prefix 2,000 tok (hit)": lp(lp2k_us, True),
        "longest_prefix 2,000 tok (miss)": lp(100, False),
        "longest_prefix 30,000 tok (hit)": lp(lp30k_us, True),
        "longest_prefix 30,000 tok (miss)": lp(500, False),
    }
    params = {
        "rows": 100,
        "conversations": 5,
        "per_conversation": 20,
        "min_len": 256,
        "max_len": 32768,
        "samples": 4,
        "rounds": 2,
        "write_s": 0.5,
        "start_s": 1.5,
        "pins_after": 0,
        "load_before": 1.0,
        "load_after": 1.1,
    }
    return "bench.cache_lookup_bench:render", params, {"rows": rows}


def cache_view(ram_restore_s: float = 0.012) -> Sample:
    cases = {
        "memcpy": [0.010, 0.011, 0.009],
        "unpack": [0.008, 0.008, 0.009],
        "ram restore": [ram_restore_s] * 3,
        "ram lookup + read only": [0.004, 0.004, 0.004],
        "disk restore (warm)": [0.02, 0.021, 0.02],
        "disk restore (cold)": [0.03, 0.031, 0.03],
    }
    params = {"rounds": 3, "n_tokens": 2048, "nbytes": 47_185_920}
    return "bench.cache_view_bench:render", params, {"cases": cases}


def client() -> Sample:
    transport = {
        "blocking": [{"call_us": hist(100, 110, 120), "events": 1000, "stream_s": 0.01}] * 2,
        "asyncio": [{"call_us": hist(150, 160, 170), "events": 1000, "stream_s": 0.02}] * 2,
    }
    loop = {
        "tokens": [32, 32],
        "elapsed_s": 2.0,
        "cpu_s": 0.064,
        "ttft_s": [0.1, 0.3],
        "tick_late_us": hist(100, 200, 5000),
    }
    threads = {"tokens": [32, 32], "elapsed_s": 4.0, "cpu_s": 0.128, "ttft_s": [0.2, 0.4]}
    streams = {"AsyncClient, one loop": [loop, loop], "Client, 16 threads": [threads, threads]}
    params = {"rounds": 2, "load": 0.5, "calls": 3, "events": 1000, "streams": 2, "tokens": 32}
    return "bench.client_bench:render", params, {"transport": transport, "streams": streams}


def front_relay() -> Sample:
    def path(first: int, paced: int, rate: float, relay: bool) -> list[dict[str, Any]]:
        got: dict[str, Any] = {
            "first_us": hist(first, first + 10),
            "paced_us": hist(paced, paced + 10),
            "burst_events_s": rate,
        }
        if relay:
            got["relay_cpu_us"] = 25.0
        return [got, got]

    data = {"direct": path(300, 100, 50_000.0, False), "relay": path(450, 180, 20_000.0, True)}
    params = {
        "rounds": 2,
        "first_samples": 2,
        "paced_events": 2,
        "pace_s": 0.01,
        "burst_events": 100,
        "load_end": 1.25,
    }
    return "bench.front_relay_bench:report", params, data


def ffi(tg_ratios: tuple[float, ...] = (1.0, 1.02), unpack_ms: float = 6.0) -> Sample:
    rounds = []
    for r in tg_ratios:
        ours = {name: [100.0, 100.0] for name in ("pp512", "pp1024", "pp2048", "tg128+greedy")}
        ours["tg128"] = [50.0 * r, 50.0 * r]
        peer = {name: [100.0, 100.0] for name in ("pp512", "pp1024", "pp2048")}
        peer["tg128"] = [50.0, 50.0]
        state = {
            "pack": [4.0, 4.0, 4.0],
            "unpack": [unpack_ms] * 3,
            "copy": [4.0, 4.0, 4.0],
            "fresh_copy": [9.0, 9.0, 9.0],
        }
        rounds.append({"ours": ours, "peer": peer, "state_ms": state})
    n_ctx = {"pp512": 512, "pp1024": 1024, "pp2048": 2048, "tg128": 128, "tg128+greedy": 129}
    params = {
        "model": "m.gguf",
        "backend": "cpu",
        "threads": 2,
        "rounds": len(rounds),
        "reps": 2,
        "n_batch": 2048,
        "n_ubatch": 512,
        "state_tokens": 2048,
    }
    data = {"n_ctx": n_ctx | {"state": 2048}, "state_bytes": 47_000_000, "rounds": rounds}
    return "bench.ffi_bench:render", params, data


def _loop(tok_s: float, governed: bool) -> dict[str, Any]:
    n = 3 if governed else None
    return {
        "tok_s": tok_s,
        "tokens": int(tok_s * 2),
        "worst_step_s": 0.05,
        "spin": "bounded" if governed else "libgomp default",
        "gomp_spincount": None if governed else "300000",
        "fallbacks": n,
        "collapses": n,
        "probes": n,
        "probes_kept": n,
        "explorations": n,
        "explorations_kept": n,
        "threads_end": 2,
    }


def threads(hogs_tok_s: tuple[float, ...] = (30.0, 35.0)) -> Sample:
    rounds = []
    for hog in hogs_tok_s:
        cells = {
            mode: {
                "quiet": [_loop(100.0, mode == "governed")],
                "hogs_first": [_loop(hog, mode == "governed")],
                "hogs_later": [_loop(hog, mode == "governed")],
                "pair": [_loop(50.0, mode == "governed"), _loop(48.0, mode == "governed")],
            }
            for mode in ("plain", "governed")
        }
        rounds.append({"load": 1.5, "cells": cells})
    params = {
        "cores": 2,
        "rounds": len(rounds),
        "seconds": 1.0,
        "warmup_steps": 40,
        "warmup_max_s": 3.0,
        "starting_steps": 2,
    }
    return "bench.threads_bench:render", params, {"rounds": rounds}


def threads_matrix() -> Sample:
    configs = {
        "1 thread": {"quiet": _loop(50.0, False), "hogs": _loop(25.0, False)},
        "2 threads, GOMP_SPINCOUNT=1000": {
            "quiet": _loop(100.0, False),
            "hogs": _loop(20.0, False),
        },
    }
    rounds = [{"load": 1.0, "configs": configs}, {"load": 1.2, "configs": configs}]
    params = {
        "cores": 2,
        "rounds": 2,
        "seconds": 1.0,
        "warmup_steps": 40,
        "warmup_max_s": 3.0,
        "starting_steps": 2,
    }
    return "bench.threads_bench:render_matrix", params, {"rounds": rounds}


def worker_attention(off_ms: float = 6.0) -> Sample:
    metrics = (
        "prefill 512, ms",
        "prefill 2048, ms",
        "1 row over 16 cells, ms",
        "1 row over 512 cells, ms",
        "1 row over 2048 cells, ms",
        "1 row of a 16-cell seq beside a 2048-cell seq, ms",
    )

    def one(ms: float) -> dict[str, list[float]]:
        return {m: [ms] if m.startswith("prefill") else [ms, ms + 1.0, ms - 1.0] for m in metrics}

    settings = {"on": [one(5.0)] * 2, "off": [one(off_ms)] * 2, "auto": [one(5.0)] * 2}
    params = {
        "backend": "cpu",
        "threads": 2,
        "rounds": 2,
        "reps": 3,
        "n_ctx": 4096,
        "n_seq_max": 4,
        "n_batch": 512,
        "chunk": 128,
        "load_start": [1.0, 1.0, 1.0],
        "load_end": [1.1, 1.0, 1.0],
        "loads": [1.0, 1.05],
    }
    return "bench.worker_bench_attention:render", params, {"settings": settings}


def worker_restore() -> Sample:
    names = (
        "resolve + checkin",
        "read (validate in place)",
        "crc32c",
        "unpack",
        "truncate",
        "restore (as the worker)",
        "restore, crc beside unpack",
        "exact hit through WorkerCore",
    )
    parts = {name: [1.0 + i, 2.0 + i] for i, name in enumerate(names)}
    # The core's stats and calls: the warm-up's hit first (left out of the table).
    core = {"restore_ms": [99.0, 10.0, 12.0], "prefill_ms": [99.0, 5.0, 6.0]}
    calls = {"view.resolve": [99.0, 0.2, 0.3], "between the calls": [99.0, 0.5, 0.7]}
    params = {
        "backend": "cpu",
        "n_ctx": 4096,
        "n_seq_max": 4,
        "flash_attn": "auto",
        "n_tokens": 2048,
        "state_bytes": 47_000_000,
        "rounds": 2,
        "load_start": [1.0, 1.0, 1.0],
        "loads": [1.0, 1.1],
    }
    data = {"parts_ms": parts, "core_stats_ms": core, "core_calls_ms": calls}
    return "bench.worker_bench_restore:render", params, data


GOVERNOR = {
    "spin": "bounded",
    "threads": {
        "threads": 2,
        "budget": 2,
        "ceiling": 2,
        "collapses": 0,
        "fallbacks": 0,
        "probes": 1,
        "probes_kept": 0,
        "explorations": 1,
        "explorations_kept": 1,
    },
}
