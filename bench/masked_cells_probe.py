"""Masked cells probe (issue 21; llama.cpp patch 0005): what other sequences'
cells cost a prompt and a decode.

    PYTHONPATH=src python -m bench.masked_cells_probe [--rounds 6] [--threads 2]
        [--prompt-idle 760] [--decode-idle 1500] [--lib DIR ...]

In a unified KV cache every row attends over the whole view; the cells that
idle entries hold (SPEC M18 keeps finished requests live for reuse) are
masked, not skipped. This probe measures, in one process through the binding
(the default GGUF, a unified 4,096-cell context, ``--threads`` threads):

- ``prompt``: a 512-token prefill alone, then the same above ``--prompt-idle``
  cells of another sequence (tok/s);
- ``decode``: 128 one-token decodes after a 100-token prompt, alone, then
  beside ``--decode-idle`` cells of another sequence (tok/s).

Each round runs one child process per ``--lib`` (a folder holding
``libggml-cpu.so.0`` and its siblings, put first on ``LD_LIBRARY_PATH``,
which the binding's RUNPATH yields to), alternating which goes first, so two
builds of llama.cpp compare on the same machine at the same time: pass the
build folders of two patch sets (``~/.cache/llamad/llama.cpp/*/build/bin``).
Without ``--lib`` it measures the build the binding links. It prints each
library's medians and ``beside / alone``: what the masked cells cost.

``--threads`` defaults to 2, all the cores of the 2-core machines this
project runs on (what the peers bench gives P5); run it on a quiet machine.
Not a recorded bench: it writes no result file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT_TOKENS = 512
DECODE_PROMPT = 100
DECODE_TOKENS = 128


def _measure(threads: int, prompt_idle: int, decode_idle: int, reps: int) -> dict[str, float]:
    """In this process: the four rates, each the median of ``reps`` runs."""
    from llamad.llama_ffi import Batch, ContextOptions, Model  # noqa: PLC0415
    from llamad.paths import default_model_path  # noqa: PLC0415

    model = Model(default_model_path())
    opts = ContextOptions(
        n_ctx=4096,
        n_batch=512,
        n_ubatch=512,
        n_seq_max=4,
        kv_unified=True,
        n_threads=threads,
        n_threads_batch=threads,
    )
    ctx = model.context(opts)
    rng = random.Random(1)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, 30000) for _ in range(n)]

    prompt, decode_prompt = tokens(PROMPT_TOKENS), tokens(DECODE_PROMPT)
    beside_prompt, beside_decode = tokens(prompt_idle), tokens(decode_idle)
    batch = Batch(1)

    def clear() -> None:
        for seq in range(opts.n_seq_max):
            ctx.seq_remove(seq)

    def prefill(idle: list[int]) -> float:
        clear()
        if idle:
            ctx.prefill(idle, 1, 0)
        started = time.perf_counter()
        ctx.prefill(prompt, 0, 0)
        return PROMPT_TOKENS / (time.perf_counter() - started)

    def decode(idle: list[int]) -> float:
        clear()
        if idle:
            ctx.prefill(idle, 1, 0)
        pos = ctx.prefill(decode_prompt, 0, 0)
        started = time.perf_counter()
        for i in range(DECODE_TOKENS):
            batch.clear()
            batch.add(decode_prompt[i % DECODE_PROMPT], pos + i, 0, logits=True)
            ctx.decode(batch)
        return DECODE_TOKENS / (time.perf_counter() - started)

    prefill([])  # warm-up: weights paged in, the graph allocated
    runs: dict[str, list[float]] = {
        k: [] for k in ("prompt", "prompt_beside", "decode", "decode_beside")
    }
    for _ in range(reps):
        runs["prompt"].append(prefill([]))
        runs["prompt_beside"].append(prefill(beside_prompt))
        runs["decode"].append(decode([]))
        runs["decode_beside"].append(decode(beside_decode))
    ctx.close()
    model.close()
    return {k: statistics.median(v) for k, v in runs.items()}


def _child(lib: str | None, args: argparse.Namespace) -> dict[str, float]:
    env = dict(os.environ)
    if lib:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [lib, env.get("LD_LIBRARY_PATH")]))
    cmd = [
        sys.executable,
        "-m",
        "bench.masked_cells_probe",
        "--child",
        "--threads",
        str(args.threads),
        "--prompt-idle",
        str(args.prompt_idle),
        "--decode-idle",
        str(args.decode_idle),
    ]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-idle", type=int, default=760)
    ap.add_argument("--decode-idle", type=int, default=1500)
    ap.add_argument("--lib", action="append", default=[], help="a llama.cpp build's bin folder")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_measure(args.threads, args.prompt_idle, args.decode_idle, reps=2)))
        return
    libs: list[str | None] = [str(Path(p).expanduser()) for p in args.lib] or [None]
    results: dict[str | None, list[dict[str, float]]] = {lib: [] for lib in libs}
    for r in range(args.rounds):
        order = libs if r % 2 == 0 else libs[::-1]
        for lib in order:
            got = _child(lib, args)
            results[lib].append(got)
            print(
                f"round {r + 1} {lib or 'linked'}: "
                + json.dumps({k: round(v) for k, v in got.items()})
            )
    for lib, rows in results.items():
        med = {k: statistics.median(row[k] for row in rows) for k in rows[0]}
        prompt, decode = med["prompt_beside"] / med["prompt"], med["decode_beside"] / med["decode"]
        print(
            f"{lib or 'linked'}: prompt {med['prompt']:.0f} tok/s, beside {args.prompt_idle} "
            f"masked cells {med['prompt_beside']:.0f} ({prompt:.3f}); "
            f"decode {med['decode']:.0f} tok/s, beside {args.decode_idle} "
            f"{med['decode_beside']:.0f} ({decode:.3f})"
        )


if __name__ == "__main__":
    main()
