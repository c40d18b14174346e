"""llama_ffi beside llama-bench, built from the same pinned llama.cpp (issue 2).

    python -m bench.ffi_bench [--reps 3] [--no-record]

Measures, in one invocation on one machine:

* prefill tok/s at 512/1024/2048 tokens and decode tok/s (128 tokens) through
  ``llamad.llama_ffi``, beside ``llama-bench -p 512,1024,2048 -n 128`` with the
  same threads, batch sizes and flash-attention setting; printed as ratios
  (bar: >= 0.95x, SPEC P4/P5 precursors);
* pack and unpack of a 2048-token sequence state into a reused, pre-faulted
  buffer, beside a plain copy of the same bytes into pre-faulted memory and a
  copy into freshly allocated memory (bar: unpack <= 2x the plain copy).

llama-bench's decode test feeds tokens without sampling; ours is measured both
ways (``decode`` = batch + llama_decode per token, ``decode+greedy`` adds the
sampler), so the ratio compares like with like.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import random
import subprocess
import sys
import time
from pathlib import Path

from bench.common import median, record, table
from llamad import paths
from llamad.llama_ffi import (
    Batch,
    ContextOptions,
    FlashAttn,
    Model,
    Sampler,
    SamplerParams,
    StateBuffer,
    default_threads,
)

PP_SIZES = (512, 1024, 2048)
TG_TOKENS = 128
N_BATCH = 2048
N_UBATCH = 512


def llama_bench_binary() -> Path:
    exe = paths.llama_prefix() / "build" / "bin" / "llama-bench"
    if not exe.is_file():
        sys.exit(f"{exe} missing: run `python scripts/native.py llama --tools` (make bench does)")
    return exe


def run_llama_bench(model: Path, threads: int, reps: int) -> dict[str, float]:
    cmd = [
        str(llama_bench_binary()),
        "-m", str(model),
        "-p", ",".join(map(str, PP_SIZES)),
        "-n", str(TG_TOKENS),
        "-t", str(threads),
        "-b", str(N_BATCH),
        "-ub", str(N_UBATCH),
        "-fa", "auto",
        "-r", str(reps),
        "-o", "json",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    results: dict[str, float] = {}
    for row in json.loads(out):
        if row["n_prompt"] and not row["n_gen"]:
            results[f"pp{row['n_prompt']}"] = float(row["avg_ts"])
        elif row["n_gen"] and not row["n_prompt"]:
            results[f"tg{row['n_gen']}"] = float(row["avg_ts"])
    return results


def timed(fn: object, reps: int) -> float:
    """Median seconds of ``reps`` runs after one warm-up."""
    assert callable(fn)
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return median(samples)


def run_ffi(model_path: Path, threads: int, reps: int) -> tuple[dict[str, float], dict[str, float]]:
    rng = random.Random(0)
    model = Model(model_path)
    opts = ContextOptions(
        n_ctx=4096,
        n_batch=N_BATCH,
        n_ubatch=N_UBATCH,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=FlashAttn.AUTO,
    )
    ctx = model.context(opts)
    # Random ids below the special tokens, as llama-bench feeds random tokens.
    vocab_hi = model.n_vocab - 1
    speeds: dict[str, float] = {}

    for n in PP_SIZES:
        tokens = [rng.randrange(1, vocab_hi) for _ in range(n)]

        def prefill(tokens: list[int] = tokens) -> None:
            ctx.clear()
            ctx.prefill(tokens)

        speeds[f"pp{n}"] = n / timed(prefill, reps)

    batch = Batch(1)
    first = rng.randrange(1, vocab_hi)

    def decode_only() -> None:
        ctx.clear()
        token = first
        for pos in range(TG_TOKENS):
            batch.clear()
            batch.add(token, pos, 0, logits=True)
            ctx.decode(batch)
            token = (token * 7 + 13) % vocab_hi  # no sampling, like llama-bench tg

    speeds[f"tg{TG_TOKENS}"] = TG_TOKENS / timed(decode_only, reps)

    greedy = Sampler(model, SamplerParams(greedy=True))

    def decode_greedy() -> None:
        ctx.clear()
        ctx.prefill([first])
        ctx.generate(greedy, TG_TOKENS, stop_at_eog=False)

    speeds[f"tg{TG_TOKENS}+greedy"] = TG_TOKENS / timed(decode_greedy, reps)

    # State pack/unpack of a 2048-token sequence.
    ctx.clear()
    ctx.prefill([rng.randrange(1, vocab_hi) for _ in range(2048)])
    size = ctx.seq_state_size(0)
    buf = StateBuffer(size)
    nbytes = ctx.pack_seq(0, buf.memory)
    other = model.context(opts)
    pack_s = timed(lambda: ctx.pack_seq(0, buf.memory), reps * 3)
    unpack_s = timed(lambda: other.unpack_seq(0, buf.memory, nbytes), reps * 3)
    dst = StateBuffer(size)
    src_addr = ctypes.addressof(ctypes.c_char.from_buffer(buf.memory))
    dst_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst.memory))
    copy_s = timed(lambda: ctypes.memmove(dst_addr, src_addr, nbytes), reps * 3)

    def fresh_copy() -> None:
        fresh = bytearray(nbytes)  # new pages: every one faults on first write
        ctypes.memmove(ctypes.addressof(ctypes.c_char.from_buffer(fresh)), src_addr, nbytes)

    fresh_s = timed(fresh_copy, reps * 3)
    state = {
        "bytes": float(nbytes),
        "pack_ms": pack_s * 1e3,
        "unpack_ms": unpack_s * 1e3,
        "copy_ms": copy_s * 1e3,
        "fresh_copy_ms": fresh_s * 1e3,
    }
    other.close()
    ctx.close()
    model.close()
    return speeds, state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    model = paths.default_model_path()

    ours, state = run_ffi(model, args.threads, args.reps)
    peer = run_llama_bench(model, args.threads, args.reps)

    rows = []
    for name in [f"pp{n}" for n in PP_SIZES] + [f"tg{TG_TOKENS}", f"tg{TG_TOKENS}+greedy"]:
        ref = peer.get(name.split("+")[0])
        ratio = ours[name] / ref if ref else float("nan")
        verdict = "ok" if ratio >= 0.95 else "BELOW BAR"
        rows.append(
            [name, f"{ours[name]:.1f}", f"{ref:.1f}" if ref else "-", f"{ratio:.3f}", verdict]
        )
    speed_table = table(
        ["test", "llama_ffi tok/s", "llama-bench tok/s", "ratio", "bar >= 0.95"], rows
    )

    ratio = state["unpack_ms"] / state["copy_ms"]
    state_table = table(
        ["2048-token state", "ms"],
        [
            ["bytes", f"{int(state['bytes']):,}"],
            ["pack into pre-faulted buffer", f"{state['pack_ms']:.2f}"],
            ["unpack from buffer", f"{state['unpack_ms']:.2f}"],
            ["plain copy, pre-faulted dst", f"{state['copy_ms']:.2f}"],
            ["plain copy, fresh memory", f"{state['fresh_copy_ms']:.2f}"],
            [
                "unpack / plain copy (bar <= 2)",
                f"{ratio:.2f} {'ok' if ratio <= 2 else 'ABOVE BAR'}",
            ],
        ],
    )
    settings = (
        f"model `{model.name}`, threads {args.threads}, n_batch {N_BATCH}, n_ubatch {N_UBATCH}, "
        f"flash_attn auto, {args.reps} reps (median for llama_ffi, mean for llama-bench)"
    )
    body = f"{settings}\n\n{speed_table}\n\n{state_table}\n"
    print(body)
    if not args.no_record:
        print(f"recorded {record('ffi', 'llama_ffi vs llama-bench (issue 2)', body)}")


if __name__ == "__main__":
    main()
