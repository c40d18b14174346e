"""What idle entries cost the decode beside them (SPEC M18, issue 21's P3/P4).

    python -m bench.idle_kv_probe [--threads 2] [--rounds 3] [--tokens 200]

One context as a worker makes it (the default model, ``n_ctx`` 4096, 4
sequences, unified KV), driven directly through the binding: sequence 0
prefills a 50-token prompt and decodes ``--tokens`` single-row steps while the
other sequences hold nothing, one idle entry of 2,000 cells, or two (2,000 +
1,500), in alternating rounds. llama.cpp's unified KV attends over every
used cell (``n_kv`` runs to the highest used cell; other sequences' cells are
masked, not skipped), so an idle entry slows every decode beside it; llama-
server's ``--cache-idle-slots`` (on with ``--cache-ram``) clears idle slots
when a new task starts for this reason, where llamad keeps them for live
reuse (docs/internals/model-worker.md, "What idle entries cost").

Not a recorded bench (no result file, no peer): it prints ms per token for
each case and the ratio to the empty KV, median over rounds, with the load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

CASES = {"empty": (), "idle 2000": (2000,), "idle 2000+1500": (2000, 1500)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=200)
    args = ap.parse_args()

    from llamad.llama_ffi import ContextOptions, Model  # noqa: PLC0415
    from llamad.llama_ffi.batch import Batch  # noqa: PLC0415
    from llamad.paths import default_model_path  # noqa: PLC0415

    model = Model(str(default_model_path()))
    n = args.threads
    ctx = model.context(
        ContextOptions(n_ctx=4096, n_seq_max=4, kv_unified=True, n_threads=n, n_threads_batch=n)
    )
    batch = Batch(512)

    def fill(seq: int, count: int, base: int) -> None:
        for start in range(0, count, 512):
            batch.clear()
            for pos in range(start, min(count, start + 512)):
                batch.add(base + pos % 1000, pos, seq)
            ctx.decode(batch)

    def decode_ms(idle: tuple[int, ...]) -> float:
        ctx.clear()
        for i, cells in enumerate(idle):
            fill(i + 1, cells, 200 + 100 * i)
        fill(0, 50, 100)
        token, pos = 300, 50
        started = time.perf_counter()
        for k in range(args.tokens):
            batch.clear()
            batch.add(token, pos, 0, logits=True)
            ctx.decode(batch)
            token, pos = 300 + k % 50, pos + 1
        return float((time.perf_counter() - started) * 1000.0 / args.tokens)

    times: dict[str, list[float]] = {name: [] for name in CASES}
    for rnd in range(args.rounds):
        names = list(CASES)
        for name in names[rnd % len(names) :] + names[: rnd % len(names)]:
            times[name].append(decode_ms(CASES[name]))
    empty = statistics.median(times["empty"])
    print(f"threads {n}, {args.rounds} rounds, load {os.getloadavg()[0]:.2f}")
    for name, values in times.items():
        ms = statistics.median(values)
        spread = f"{min(values):.2f}-{max(values):.2f}"
        print(f"  {name:16} {ms:6.2f} ms/token ({spread})  x{ms / empty:.3f} of empty")
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
