"""Record the GPU warm-path probe (issue 21, item 5) as a result file.

    python -m bench.gpu_restore RESTORE.jsonl MACHINE.txt [--results DIR]

``bench/gpu/device_run.sh`` runs ``bench/gpu/restore_bench`` on a lent GPU
machine and then this module there, so the result file is written by the
script that measured it (the device's CPU, kernel and date in its header, the
GPU from ``nvidia-smi`` in its parameters). The probe runs at the library
level (the pinned, patched libllama built with CUDA, called from C++), not
through a daemon: the daemon's Python does not travel to that machine, and
what is measured here is what the worker's restore costs at its floor.

What the report shows, per row size: a cold miss (prefill of N-1 tokens plus
one 1-token decode), a warm hit (``llama_state_seq_set_data`` of the N-1 row
plus the same decode) from each kind of host buffer, the same row kept on the
device (``LLAMA_STATE_SEQ_FLAGS_ON_DEVICE``), and the floors: one
``cudaMemcpy`` of the row's bytes from pinned and from pageable memory. The
bar (issue 21: "GPU restore bandwidth recorded against the pinned-memcpy
floor") is a record, not a threshold: the verdict says it was recorded and
whether every warm reply was bit-identical to its cold run.

The model is a random-weight stand-in of the default model's shape
(``bench/gpu/synth_model.py``): a row's bytes per token depend on the shape
only, and the real model's 98 MB do not fit the device call's 64 MiB.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.common import record

KIND_LABEL = {
    "pageable_malloc": "pageable (malloc)",
    "pinned_cudaHostAlloc": "pinned (cudaHostAlloc)",
    "registered_malloc": "malloc + cudaHostRegister",
    "shm_mmap": "/dev/shm mmap (ram_file tier)",
    "shm_mmap_registered": "/dev/shm mmap + cudaHostRegister",
    "on_device": "kept on device (ON_DEVICE flag)",
}


def _rows(lines: list[dict[str, Any]], n: int, what: str) -> list[dict[str, Any]]:
    return [d for d in lines if d.get("tokens") == n and d.get("what") == what]


def report(params: Mapping[str, Any], data: Mapping[str, Any]) -> str:
    """The body of the result file, from the probe's JSON lines."""
    lines: list[dict[str, Any]] = data["lines"]
    out = [
        f"GPU: {params['gpu']}; CUDA {params['cuda']}; llama.cpp {params['llama_cpp']}; "
        f"model: {params['model']}; {params['reps']} timed repetitions per cell (median, "
        "min-max); KV f16, flash attention on, all layers on the GPU.",
        "",
    ]
    all_exact = True
    for n in params["tokens"]:
        cold = _rows(lines, n, "cold_prefill_plus_sample")[0]
        floor = _rows(lines, n, "memcpy_h2d_pinned")[0]
        pageable_floor = _rows(lines, n, "memcpy_h2d_pageable")[0]
        out += [
            f"### Row of {n:,} tokens ({floor['bytes'] / 1e6:.1f} MB)",
            "",
            f"Cold (prefill {n - 1:,} + one decode): {cold['ms_median']:.2f} ms "
            f"({cold['ms_min']:.2f}-{cold['ms_max']:.2f}). Floor: one cudaMemcpy of the row "
            f"from pinned memory {floor['ms_median']:.3f} ms "
            f"({floor['gb_per_s_median']:.1f} GB/s), "
            f"from pageable memory {pageable_floor['ms_median']:.3f} ms "
            f"({pageable_floor['gb_per_s_median']:.1f} GB/s).",
            "",
            "| restored from | set_data ms | GB/s | x pinned floor | warm TTFT ms "
            "| cold / warm | logits vs cold | source overwritten at return |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for s in _rows(lines, n, "warm_set_data"):
            kind = s["kind"]
            t = next(d for d in _rows(lines, n, "warm_restore_plus_sample") if d["kind"] == kind)
            over = [
                d for d in _rows(lines, n, "source_overwritten_after_set_data") if d["kind"] == kind
            ]
            exact = s["max_abs_vs_cold"] == 0 and t["max_abs_vs_cold"] == 0
            all_exact = all_exact and exact and all(d["max_abs_vs_cold"] == 0 for d in over)
            over_txt = (
                "n/a (no host copy)"
                if not over
                else ("same logits" if over[0]["max_abs_vs_cold"] == 0 else "DIFFERENT logits")
            )
            out.append(
                f"| {KIND_LABEL.get(kind, kind)} | {s['ms_median']:.3f} "
                f"({s['ms_min']:.3f}-{s['ms_max']:.3f}) | {s['gb_per_s_median']:.1f} "
                f"| {s['ms_median'] / floor['ms_median']:.2f} | {t['ms_median']:.3f} "
                f"| {cold['ms_median'] / t['ms_median']:.1f}x "
                f"| {'bit-identical' if exact else 'DIFFER'} | {over_txt} |"
            )
        for reg in _rows(lines, n, "cudaHostRegister_shm"):
            out += [
                "",
                f"Registering the row's /dev/shm mapping once (cudaHostRegister) took "
                f"{reg['ms']:.2f} ms ({reg['bytes'] / reg['ms'] / 1e6:.1f} GB/s).",
            ]
        out.append("")
    verdict = (
        "recorded; every warm reply bit-identical to its cold run"
        if all_exact
        else "recorded; some warm reply DIFFERS from its cold run"
    )
    out += [f"**Verdict (GPU restore bandwidth against the pinned-memcpy floor): {verdict}.**", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jsonl", type=Path, help="restore_bench's output")
    ap.add_argument("machine_txt", type=Path, help="nvidia-smi and nvcc lines (device_run.sh)")
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--commit", default="unknown", help="the llamad commit measured")
    args = ap.parse_args(argv)
    lines = [json.loads(x) for x in args.jsonl.read_text().splitlines() if x.strip()]
    txt = args.machine_txt.read_text().splitlines()
    gpu = txt[1].strip() if len(txt) > 1 else "unknown"
    cuda = next((x.strip() for x in txt if "release" in x), "unknown")
    tokens = sorted({d["tokens"] for d in lines if "tokens" in d})
    reps = max((d.get("reps", 0) for d in lines), default=0)
    params = {
        "gpu": gpu,
        "cuda": cuda,
        "llama_cpp": "pinned source with llamad's patches (src/llamad/_pins.py)",
        "model": "random-weight stand-in of SmolLM2-135M's shape, f16 (bench/gpu/synth_model.py)",
        "tokens": tokens,
        "reps": reps,
        "commit": args.commit,
    }
    path = record(
        "gpu-restore",
        "GPU warm path: restore bandwidth against the pinned-memcpy floor",
        "bench.gpu_restore:report",
        params,
        {"lines": lines},
        results=args.results,
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
