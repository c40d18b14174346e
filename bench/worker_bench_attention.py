"""Flash attention on the CPU: what the worker's decodes cost with it on and off (issue 8).

    python -m bench.worker_bench_attention [--rounds 5] [--reps 6] [--threads 2] [--no-record]

On the binding, with the model worker's own context (``n_ctx`` 4096,
``n_seq_max`` 4, ``kv_unified``, ``n_batch`` = ``n_ubatch`` 512) and its
decode shapes: a cold prefill in 128-row chunks (the worker's default
``prefill_chunk_size``), timed to 512 and to 2,048 tokens, and one-row
decodes (a warm hit's held-back token, a generated token) with the sequence
holding 16, 512 and 2,048 cells; and a one-row decode of a short sequence
while *another* sequence holds 2,048 cells (with ``kv_unified`` llama.cpp
attends over every used cell, masked per sequence, so a short stream beside
a long session pays for the session's cells too).

One context per flash-attention setting (``on``, ``off``, ``auto``), all made
before the first round; the settings' order rotates between rounds. A
one-row figure is the median of ``--reps`` decodes (each re-decodes the same
position after dropping it). The table shows each setting's median over
rounds (range), and the per-round ratio off / on (below 1: off is faster).
Results are written only by this script (``bench/results/worker-attention-<date>.md``,
rendered by :func:`render` from ``worker-attention-<date>.json`` beside it: per
setting and round, every decode's ms behind each figure).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from typing import Any

from bench.common import record, show, table
from llamad import paths
from llamad.llama_ffi import Batch, Context, ContextOptions, FlashAttn, Model
from llamad.llama_ffi.build_info import compute_backend

N_CTX, N_BATCH, N_SEQ, CHUNK = 4096, 512, 4, 128
SETTINGS = (FlashAttn.ON, FlashAttn.OFF, FlashAttn.AUTO)
MIN_ROUNDS = 5
RENDER = "bench.worker_bench_attention:render"
METRICS = (
    "prefill 512, ms",
    "prefill 2048, ms",
    "1 row over 16 cells, ms",
    "1 row over 512 cells, ms",
    "1 row over 2048 cells, ms",
    "1 row of a 16-cell seq beside a 2048-cell seq, ms",
)


class Probe:
    """One context of one flash-attention setting, and the decodes the worker makes."""

    def __init__(self, model: Model, fa: FlashAttn, threads: int, tokens: list[int]) -> None:
        self.ctx: Context = model.context(
            ContextOptions(
                n_ctx=N_CTX,
                n_batch=N_BATCH,
                n_ubatch=N_BATCH,
                n_seq_max=N_SEQ,
                kv_unified=True,
                n_threads=threads,
                n_threads_batch=threads,
                flash_attn=fa,
            )
        )
        self.batch = Batch(N_BATCH)
        self.tokens = tokens

    def _decode(self, seq: int, pos: int, tokens: list[int]) -> float:
        b = self.batch
        b.clear()
        b.add_tokens(tokens, seq, pos, logits_last=True)
        t0 = time.perf_counter()
        self.ctx.decode(b)
        return time.perf_counter() - t0

    def _one_row(self, seq: int, pos: int, reps: int) -> list[float]:
        """The ms of ``reps`` one-row decodes at ``pos`` (the cell dropped between)."""
        out = []
        for _ in range(reps):
            out.append(self._decode(seq, pos, [self.tokens[pos % len(self.tokens)]]) * 1e3)
            self.ctx.seq_remove(seq, pos)
        return out

    def round(self, reps: int) -> dict[str, list[float]]:
        """Per metric, its decodes' ms (a prefill: its one time)."""
        ctx, got = self.ctx, {}
        ctx.clear()
        spent = 0.0
        for pos in range(0, 2048, CHUNK):
            spent += self._decode(0, pos, self.tokens[pos : pos + CHUNK])
            if pos + CHUNK == 512:
                got[METRICS[0]] = [spent * 1e3]
        got[METRICS[1]] = [spent * 1e3]
        got[METRICS[4]] = self._one_row(0, 2048, reps)
        self._decode(1, 0, self.tokens[:16])
        got[METRICS[5]] = self._one_row(1, 16, reps)
        ctx.seq_remove(1, 0)
        ctx.seq_remove(0, 512)
        got[METRICS[3]] = self._one_row(0, 512, reps)
        ctx.seq_remove(0, 16)
        got[METRICS[2]] = self._one_row(0, 16, reps)
        return got

    def close(self) -> None:
        self.batch.close()
        self.ctx.close()


def spread(values: list[float], fmt: str = ".1f") -> str:
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    ap.add_argument("--reps", type=int, default=6, help="one-row decodes per figure")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--no-record", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1 or args.reps < 1:
        ap.error("--rounds and --reps must be >= 1")
    if not args.no_record and args.rounds < MIN_ROUNDS:
        ap.error(f"a recorded result needs --rounds >= {MIN_ROUNDS} (or pass --no-record)")
    load_start = os.getloadavg()
    model = Model(paths.default_model_path())
    rng = random.Random(0)
    tokens = [rng.randrange(1, model.n_vocab - 1) for _ in range(2048 + 1)]
    probes = {fa: Probe(model, fa, args.threads, tokens) for fa in SETTINGS}
    results: dict[str, list[dict[str, list[float]]]] = {fa.name.lower(): [] for fa in SETTINGS}
    loads: list[float] = []
    try:
        for probe in probes.values():  # warm-up: page faults, thread start
            probe.round(1)
        for i in range(args.rounds):
            loads.append(os.getloadavg()[0])
            order = SETTINGS[i % 3 :] + SETTINGS[: i % 3]
            for fa in order:
                results[fa.name.lower()].append(probes[fa].round(args.reps))
            print(f"round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for probe in probes.values():
            probe.close()
        model.close()
    params = {
        "backend": compute_backend(),
        "threads": args.threads,
        "rounds": args.rounds,
        "reps": args.reps,
        "n_ctx": N_CTX,
        "n_seq_max": N_SEQ,
        "n_batch": N_BATCH,
        "chunk": CHUNK,
        "load_start": list(load_start),
        "load_end": list(os.getloadavg()),
        "loads": loads,
    }
    data = {"settings": results}
    print(show(RENDER, params, data))
    if not args.no_record:
        title = "Flash attention on the CPU: the worker's prefill and one-row decodes (issue 8)"
        print(f"recorded {record('worker-attention', title, RENDER, params, data)}")


def render(params: dict[str, Any], data: dict[str, Any]) -> str:
    """The recorded body from :func:`main`'s ``params`` and ``data``: per
    setting (on, off, auto), per round, each metric's decodes in ms (a figure
    is their median)."""
    results = data["settings"]

    def col(fa: str, metric: str) -> list[float]:
        return [statistics.median(r[metric]) for r in results[fa]]

    names = ("on", "off", "auto")  # SETTINGS' order
    rows: list[list[str]] = []
    for metric in METRICS:
        ratios = [off / on for off, on in zip(col("off", metric), col("on", metric), strict=True)]
        rows.append([metric, *(spread(col(fa, metric)) for fa in names), spread(ratios, ".2f")])

    def avg(xs: list[float]) -> str:
        return "/".join(f"{x:.2f}" for x in xs)

    return (
        f"Model `default`, compute backend {params['backend']}, {params['threads']} threads; "
        f"context n_ctx {params['n_ctx']}, n_seq_max {params['n_seq_max']}, kv_unified, "
        f"n_batch = n_ubatch {params['n_batch']}; prefill in {params['chunk']}-row chunks. "
        f"{params['rounds']} rounds after a warm-up, settings' order rotating; a one-row "
        f"figure is the median of {params['reps']} decodes. "
        "Values: median (range) over rounds; off / on: per-round ratio.\n\n"
        f"Load average (1/5/15 min) at start {avg(params['load_start'])}, "
        f"at end {avg(params['load_end'])}; 1-min at each round's start: "
        f"{', '.join(f'{x:.2f}' for x in params['loads'])}.\n\n"
        + table(["what", "flash attention on", "off", "auto", "off / on"], rows)
        + "\n"
    )


if __name__ == "__main__":
    main()
