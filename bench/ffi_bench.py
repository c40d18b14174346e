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


def run_llama_bench(model: Path, threads: int, reps: int) -> dict[str, list[float]]:
    """Per-rep tok/s samples of one llama-bench invocation (pp sizes and tg)."""
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
    results: dict[str, list[float]] = {}
    for row in json.loads(out):
        samples = [float(x) for x in row["samples_ts"]]
        if row["n_prompt"] and not row["n_gen"]:
            results[f"pp{row['n_prompt']}"] = samples
        elif row["n_gen"] and not row["n_prompt"]:
            results[f"tg{row['n_gen']}"] = samples
    return results


def samples(fn: object, reps: int) -> list[float]:
    """Seconds of each of ``reps`` runs, after one warm-up."""
    assert callable(fn)
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def timed(fn: object, reps: int) -> float:
    """Median seconds of ``reps`` runs after one warm-up."""
    return median(samples(fn, reps))


class FfiRunner:
    """One loaded model and context, measured in rounds between llama-bench runs."""

    def __init__(self, model_path: Path, threads: int) -> None:
        self.rng = random.Random(0)
        self.model = Model(model_path)
        self.opts = ContextOptions(
            n_ctx=4096,
            n_batch=N_BATCH,
            n_ubatch=N_UBATCH,
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=FlashAttn.AUTO,
        )
        self.ctx = self.model.context(self.opts)
        # Random ids below the special tokens, as llama-bench feeds random tokens.
        self.vocab_hi = self.model.n_vocab - 1
        self.prompts = {n: self._random(n) for n in PP_SIZES}
        self.batch = Batch(1)
        self.greedy = Sampler(self.model, SamplerParams(greedy=True))

    def _random(self, n: int) -> list[int]:
        return [self.rng.randrange(1, self.vocab_hi) for _ in range(n)]

    def speeds(self, reps: int) -> dict[str, list[float]]:
        """tok/s samples per test."""
        ctx, batch, first = self.ctx, self.batch, 1 + self.vocab_hi // 2
        out: dict[str, list[float]] = {}
        for n, tokens in self.prompts.items():

            def prefill(tokens: list[int] = tokens) -> None:
                ctx.clear()
                ctx.prefill(tokens)

            out[f"pp{n}"] = [n / t for t in samples(prefill, reps)]

        def decode_only() -> None:
            ctx.clear()
            token = first
            for pos in range(TG_TOKENS):
                batch.clear()
                batch.add(token, pos, 0, logits=True)
                ctx.decode(batch)
                token = (token * 7 + 13) % self.vocab_hi  # no sampling, like llama-bench tg

        def decode_greedy() -> None:
            ctx.clear()
            ctx.prefill([first])
            ctx.generate(self.greedy, TG_TOKENS, stop_at_eog=False)

        out[f"tg{TG_TOKENS}"] = [TG_TOKENS / t for t in samples(decode_only, reps)]
        out[f"tg{TG_TOKENS}+greedy"] = [TG_TOKENS / t for t in samples(decode_greedy, reps)]
        return out

    def state(self, reps: int) -> dict[str, float]:
        """Pack/unpack of a 2048-token sequence beside plain copies (ms)."""
        ctx = self.ctx
        ctx.clear()
        ctx.prefill(self._random(2048))
        size = ctx.seq_state_size(0)
        buf, dst = StateBuffer(size), StateBuffer(size)
        nbytes = ctx.pack_seq(0, buf.memory)
        with self.model.context(self.opts) as other:
            pack_s = timed(lambda: ctx.pack_seq(0, buf.memory), reps)
            unpack_s = timed(lambda: other.unpack_seq(0, buf.memory, nbytes), reps)
        src_addr = ctypes.addressof(ctypes.c_char.from_buffer(buf.memory))
        dst_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst.memory))
        copy_s = timed(lambda: ctypes.memmove(dst_addr, src_addr, nbytes), reps)

        def fresh_copy() -> None:
            fresh = bytearray(nbytes)  # new pages: every one faults on first write
            ctypes.memmove(ctypes.addressof(ctypes.c_char.from_buffer(fresh)), src_addr, nbytes)

        fresh_s = timed(fresh_copy, reps)
        return {
            "bytes": float(nbytes),
            "pack_ms": pack_s * 1e3,
            "unpack_ms": unpack_s * 1e3,
            "copy_ms": copy_s * 1e3,
            "fresh_copy_ms": fresh_s * 1e3,
        }

    def close(self) -> None:
        self.ctx.close()
        self.model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of both sides")
    ap.add_argument("--reps", type=int, default=2, help="repetitions per side per round")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    model = paths.default_model_path()

    # A shared VM drifts by +-15% over minutes: interleave the two sides in
    # rounds (alternating which goes first) and compare medians of all samples.
    runner = FfiRunner(model, args.threads)
    ours: dict[str, list[float]] = {}
    peer: dict[str, list[float]] = {}
    for i in range(args.rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            got = (
                runner.speeds(args.reps)
                if side == 0
                else run_llama_bench(model, args.threads, args.reps)
            )
            for name, values in got.items():
                (ours if side == 0 else peer).setdefault(name, []).extend(values)
    state = runner.state(max(9, args.reps * 3))
    runner.close()

    rows = []
    for name in [f"pp{n}" for n in PP_SIZES] + [f"tg{TG_TOKENS}", f"tg{TG_TOKENS}+greedy"]:
        mine = median(ours[name])
        ref = median(peer[name.split("+")[0]])
        ratio = mine / ref
        verdict = "ok" if ratio >= 0.95 else "BELOW BAR"
        if "+" in name:
            verdict = "info: peer does not sample"
        spread = f"{min(ours[name]):.0f}-{max(ours[name]):.0f}"
        ref_key = name.split("+")[0]
        ref_spread = f"{min(peer[ref_key]):.0f}-{max(peer[ref_key]):.0f}"
        rows.append(
            [name, f"{mine:.1f} ({spread})", f"{ref:.1f} ({ref_spread})", f"{ratio:.3f}", verdict]
        )
    speed_table = table(
        ["test", "llama_ffi tok/s (range)", "llama-bench tok/s (range)", "ratio", "bar >= 0.95"],
        rows,
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
        f"model `{model.name}`, threads {args.threads}, n_batch {N_BATCH}, "
        f"n_ubatch {N_UBATCH}, flash_attn auto; {args.rounds} alternating rounds x "
        f"{args.reps} reps per side; medians of all samples"
    )
    body = f"{settings}\n\n{speed_table}\n\n{state_table}\n"
    print(body)
    if not args.no_record:
        print(f"recorded {record('ffi', 'llama_ffi vs llama-bench (issue 2)', body)}")


if __name__ == "__main__":
    main()
