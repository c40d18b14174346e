"""llama_ffi beside llama-bench, built from the same pinned llama.cpp (issues 2, 7).

    python -m bench.ffi_bench [--rounds 5] [--reps 2] [--no-record]

Measures, in one invocation on one machine:

* prefill tok/s at 512/1024/2048 tokens and decode tok/s (128 tokens) through
  ``llamad.llama_ffi``, beside ``llama-bench -p 512,1024,2048 -n 128`` with the
  same threads, batch sizes, flash-attention setting and context size (llama-bench
  sizes each test's context to its tokens, ``n_ctx = n_prompt + n_gen``, and so
  does this bench); bar: >= 0.95x (SPEC P4/P5 precursors);
* pack and unpack of a 2048-token sequence state into a reused, pre-faulted
  buffer, beside a plain copy of the same bytes into pre-faulted memory and a
  copy into freshly allocated memory (bar: unpack <= 2x the plain copy).

A shared VM drifts by +-15% over minutes, so the two sides run in at least 5
alternating rounds (which side goes first alternates). Each round gives one
ratio of medians; the table shows every side's median and range over all
samples, the median of the round ratios and their range (the spread). The
verdict is computed here: "met" only when the whole spread clears the bar,
"below bar" when none of it does, and "within noise" when the bar lies inside
the spread. Results are recorded only by this script, never edited.

llama-bench's decode test feeds tokens without sampling; ours is measured both
ways (``decode`` = batch + llama_decode per token, ``decode+greedy`` adds the
sampler), so the ratio held to the bar compares like with like.

Recorded (``ffi-<date>.json`` beside the ``.md``): every round's samples of
both sides (tok/s) and of the state copies (ms), and each test's ``n_ctx``;
:func:`render` computes the ratios and the verdicts from them.
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
from typing import Any

from bench.common import median, record, show, table
from llamad import paths
from llamad.llama_ffi import (
    Batch,
    Context,
    ContextOptions,
    FlashAttn,
    Model,
    Sampler,
    SamplerParams,
    StateBuffer,
    default_threads,
)
from llamad.llama_ffi.build_info import build_record

PP_SIZES = (512, 1024, 2048)
TG_TOKENS = 128
N_BATCH = 2048
N_UBATCH = 512
STATE_TOKENS = 2048
MIN_ROUNDS = 5
SPEED_BAR = 0.95  # llama_ffi tok/s / llama-bench tok/s, at least
STATE_BAR = 2.0  # unpack ms / plain copy ms, at most
GREEDY = f"tg{TG_TOKENS}+greedy"
RENDER = "bench.ffi_bench:render"


def llama_bench_binary() -> Path:
    """llama-bench of the build the extension links against (same folder)."""
    exe = Path(build_record()["lib_dir"]) / "llama-bench"
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


class FfiRunner:
    """One loaded model, and one context per test sized as llama-bench sizes its own."""

    def __init__(self, model_path: Path, threads: int) -> None:
        self.rng = random.Random(0)
        self.model = Model(model_path)
        self.threads = threads
        # llama-bench: n_ctx = n_prompt + n_gen for each test. The greedy
        # variant prefills one token before its 128, so it needs one more.
        sizes = {f"pp{n}": n for n in PP_SIZES}
        sizes |= {f"tg{TG_TOKENS}": TG_TOKENS, GREEDY: TG_TOKENS + 1, "state": STATE_TOKENS}
        self.ctxs: dict[str, Context] = {name: self._context(n) for name, n in sizes.items()}
        # Random ids below the special tokens, as llama-bench feeds random tokens.
        self.vocab_hi = self.model.n_vocab - 1
        self.prompts = {n: self._random(n) for n in PP_SIZES}
        self.batch = Batch(1)
        self.greedy = Sampler(self.model, SamplerParams(greedy=True))
        self._state_ready = False

    def _context(self, n_ctx: int) -> Context:
        return self.model.context(
            ContextOptions(
                n_ctx=n_ctx,
                n_batch=N_BATCH,
                n_ubatch=N_UBATCH,
                n_threads=self.threads,
                n_threads_batch=self.threads,
                flash_attn=FlashAttn.AUTO,
            )
        )

    def n_ctx(self) -> dict[str, int]:
        """The context size llama.cpp gave each test (it may round up)."""
        return {name: ctx.n_ctx for name, ctx in self.ctxs.items()}

    def _random(self, n: int) -> list[int]:
        return [self.rng.randrange(1, self.vocab_hi) for _ in range(n)]

    def speeds(self, reps: int) -> dict[str, list[float]]:
        """tok/s samples per test."""
        batch, first = self.batch, 1 + self.vocab_hi // 2
        out: dict[str, list[float]] = {}
        for n, tokens in self.prompts.items():
            ctx = self.ctxs[f"pp{n}"]

            def prefill(ctx: Context = ctx, tokens: list[int] = tokens) -> None:
                ctx.clear()
                ctx.prefill(tokens)

            out[f"pp{n}"] = [n / t for t in samples(prefill, reps)]

        tg = self.ctxs[f"tg{TG_TOKENS}"]

        def decode_only() -> None:
            tg.clear()
            token = first
            for pos in range(TG_TOKENS):
                batch.clear()
                batch.add(token, pos, 0, logits=True)
                tg.decode(batch)
                token = (token * 7 + 13) % self.vocab_hi  # no sampling, like llama-bench tg

        greedy_ctx = self.ctxs[GREEDY]

        def decode_greedy() -> None:
            greedy_ctx.clear()
            greedy_ctx.prefill([first])
            greedy_ctx.generate(self.greedy, TG_TOKENS, stop_at_eog=False)

        out[f"tg{TG_TOKENS}"] = [TG_TOKENS / t for t in samples(decode_only, reps)]
        out[GREEDY] = [TG_TOKENS / t for t in samples(decode_greedy, reps)]
        return out

    def state(self, reps: int) -> dict[str, list[float]]:
        """ms samples of pack/unpack of a 2048-token sequence beside plain copies."""
        ctx = self.ctxs["state"]
        if not self._state_ready:
            ctx.clear()
            ctx.prefill(self._random(STATE_TOKENS))
            size = ctx.seq_state_size(0)
            self.buf, self.dst = StateBuffer(size), StateBuffer(size)
            self.nbytes = ctx.pack_seq(0, self.buf.memory)
            self.other = self._context(STATE_TOKENS)
            self._state_ready = True
        buf, dst, nbytes, other = self.buf, self.dst, self.nbytes, self.other
        src_addr = ctypes.addressof(ctypes.c_char.from_buffer(buf.memory))
        dst_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst.memory))

        def fresh_copy() -> None:
            fresh = bytearray(nbytes)  # new pages: every one faults on first write
            ctypes.memmove(ctypes.addressof(ctypes.c_char.from_buffer(fresh)), src_addr, nbytes)

        def ms(fn: object) -> list[float]:
            return [t * 1e3 for t in samples(fn, reps)]

        return {
            "pack": ms(lambda: ctx.pack_seq(0, buf.memory)),
            "unpack": ms(lambda: other.unpack_seq(0, buf.memory, nbytes)),
            "copy": ms(lambda: ctypes.memmove(dst_addr, src_addr, nbytes)),
            "fresh_copy": ms(fresh_copy),
        }

    def close(self) -> None:
        if self._state_ready:
            self.other.close()
        for ctx in self.ctxs.values():
            ctx.close()
        self.greedy.close()
        self.model.close()


def verdict(ratios: list[float], bar: float, *, at_least: bool) -> str:
    """Met only if every round clears the bar; within noise if the bar is inside the spread."""
    lo, hi = min(ratios), max(ratios)
    if at_least:
        if lo >= bar:
            return "met"
        return "BELOW BAR" if hi < bar else "within noise"
    if hi <= bar:
        return "met"
    return "ABOVE BAR" if lo > bar else "within noise"


def spread(values: list[float], fmt: str) -> str:
    return f"{median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS, help="alternating rounds")
    ap.add_argument("--reps", type=int, default=2, help="repetitions per side per round")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.rounds < MIN_ROUNDS and not args.no_record:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps must be >= 1")
    model = paths.default_model_path()
    backend = build_record()["backend"]

    runner = FfiRunner(model, args.threads)
    # Per round: our samples and the peer's per test, and the state samples.
    rounds: list[dict[str, dict[str, list[float]]]] = []
    for i in range(args.rounds):
        got: dict[str, dict[str, list[float]]] = {}
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            if side == 0:
                got["ours"] = runner.speeds(args.reps)
                got["state_ms"] = runner.state(max(3, args.reps))
            else:
                got["peer"] = run_llama_bench(model, args.threads, args.reps)
        rounds.append(got)
        print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    n_ctx = runner.n_ctx()
    runner.close()
    params = {
        "model": model.name,
        "backend": backend,
        "threads": args.threads,
        "rounds": args.rounds,
        "reps": args.reps,
        "n_batch": N_BATCH,
        "n_ubatch": N_UBATCH,
        "state_tokens": STATE_TOKENS,
    }
    data = {"n_ctx": n_ctx, "state_bytes": runner.nbytes, "rounds": rounds}
    print(show(RENDER, params, data))
    if not args.no_record:
        title = "llama_ffi vs llama-bench (issues 2, 7)"
        print(f"recorded {record('ffi', title, RENDER, params, data)}")


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body from :func:`main`'s ``params`` and ``data``: per round,
    ``ours`` and ``peer`` (tok/s samples per test) and ``state_ms``."""
    rounds = data["rounds"]
    rows = []
    names = [f"pp{n}" for n in PP_SIZES] + [f"tg{TG_TOKENS}", GREEDY]
    for name in names:
        ref_name = name.split("+")[0]
        mine = [x for r in rounds for x in r["ours"][name]]
        theirs = [x for r in rounds for x in r["peer"][ref_name]]
        ratios = [median(r["ours"][name]) / median(r["peer"][ref_name]) for r in rounds]
        if name == GREEDY:
            judged = "info: peer does not sample"
        else:
            judged = verdict(ratios, SPEED_BAR, at_least=True)
        rows.append(
            [
                name,
                str(data["n_ctx"][name]),
                spread(mine, ".1f"),
                spread(theirs, ".1f"),
                f"{median(ratios):.3f}",
                f"{min(ratios):.3f}-{max(ratios):.3f}",
                judged,
            ]
        )
    speed_table = table(
        [
            "test",
            "n_ctx",
            "llama_ffi tok/s (range)",
            "llama-bench tok/s (range)",
            "ratio",
            "ratio spread",
            f"bar >= {SPEED_BAR}",
        ],
        rows,
    )

    def all_ms(key: str) -> list[float]:
        return [x for r in rounds for x in r["state_ms"][key]]

    state_ratios = [median(r["state_ms"]["unpack"]) / median(r["state_ms"]["copy"]) for r in rounds]
    state_table = table(
        [f"{params['state_tokens']}-token state", "ms (range)"],
        [
            ["bytes", f"{data['state_bytes']:,}"],
            ["pack into pre-faulted buffer", spread(all_ms("pack"), ".2f")],
            ["unpack from buffer", spread(all_ms("unpack"), ".2f")],
            ["plain copy, pre-faulted dst", spread(all_ms("copy"), ".2f")],
            ["plain copy, fresh memory", spread(all_ms("fresh_copy"), ".2f")],
            [
                f"unpack / plain copy, per round (bar <= {STATE_BAR:g})",
                f"{median(state_ratios):.2f} ({min(state_ratios):.2f}-{max(state_ratios):.2f}) "
                + verdict(state_ratios, STATE_BAR, at_least=False),
            ],
        ],
    )
    settings = (
        f"model `{params['model']}`, backend {params['backend']}, threads {params['threads']}, "
        f"n_batch {params['n_batch']}, n_ubatch {params['n_ubatch']}, flash_attn auto, n_ctx "
        "per test as llama-bench sets it (n_prompt + n_gen); "
        f"{params['rounds']} alternating rounds x {params['reps']} reps per side "
        "(after one warm-up each). Tok/s: median (range) of all samples. Ratio: median of the "
        "per-round ratios of medians; spread: their range. Verdict: met if the whole spread "
        "clears the bar, within noise if the bar lies inside it."
    )
    note = (
        f"`{GREEDY}` adds our greedy sampler per token; llama-bench's tg test does not "
        f"sample, so only `tg{TG_TOKENS}` is held to the bar (its ratio uses llama-bench's "
        f"tg{TG_TOKENS})."
    )
    return f"{settings}\n\n{speed_table}\n\n{state_table}\n\n{note}\n"


if __name__ == "__main__":
    main()
