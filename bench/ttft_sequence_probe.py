"""TTFT sequence probe (issue 21): each cold prompt's prefill rate, and the
thread governor's state after it, in the peers bench's TTFT sequence.

    PYTHONPATH=src python -m bench.ttft_sequence_probe [--passes 2] [--runs 1]

Starts a real daemon (:class:`bench.peers.llamad_sys.LlamadDaemon`: the
default GGUF, 2 threads, 4 sequences, the cache's default configuration) and
sends, at 512, 1,024 and 2,048 tokens, what the peers bench's ``ttft`` step
sends llamad, back to back: a fresh prompt (cold), the same again (its idle
entry), 4 short fillers (every sequence taken), the prompt again (from
``ram``). For each cold prompt it prints the worker's prefill rate
(``stats.prefill_tokens`` over ``stats.prefill_ms``) and the governor's
:class:`~llamad.model.wire.ThreadStatus` read right after it: the count, the
ceiling, fallbacks, collapses and the last collapse.

Written for a finding left open (issue 21's note of 2026-11-28): on a quiet
machine, the second pass's cold prompts often run on 1 thread, at about half
their rate. A one-row step took 23-42 ms against a median of 6, the governor
judged a collapse, and its ceiling stayed at 1 through every cold prompt that
followed (16 s). Run it on a quiet machine; ``--runs`` repeats the whole
sequence with a fresh daemon each time. Not a recorded bench: it writes no
result file.

What it found (issue 21's note of 2026-11-29; the causes, sampled per thread
from ``/proc/*/task/*/schedstat`` around each collapse): the one-row step that
"collapsed" ran beside cache-meta's mover copying the 2,048-token row to disk
(20-70 ms of a core), or beside the worker's own save; a probe back up then
failed on one-row steps, which run as fast on 1 thread as on 2, and the
cool-down doubled; and an exploration of 1 thread "won" on the noise of four
one-row steps on a quiet machine. With the governor's fixes for all three
(``llamad.model.threads``): 30 of 30 cold prompts over 5 runs on 2 threads,
where 9 of 20 had run on 1.
"""

from __future__ import annotations

import argparse
from typing import Any

from bench.peers import workload
from bench.peers.llamad_sys import LlamadDaemon, ModelTable

MODEL = "main"
SIZES = (512, 1024, 2048)
FILLERS = 4
FILLER_TOKENS = 24


def _threads(client: Any) -> str:
    t = client.status(MODEL).worker.threads
    if t is None:
        return "threads: not governed"
    return (
        f"threads {t.threads} ceiling {t.ceiling} fallback {t.fallback} "
        f"fallbacks {t.fallbacks} collapses {t.collapses} bursts {t.bursts} "
        f"beside saves {t.beside_own_work} explorations {t.explorations_kept}/{t.explorations} "
        f"last {t.last_collapse}"
    )


def run_once(passes: int) -> None:
    daemon = LlamadDaemon("probe", [ModelTable(MODEL, n_ctx=8192, n_seq_max=4, threads=2)], 2)
    try:
        client = daemon.start()

        def tokenize(text: str) -> list[int]:
            return list(client.tokenize(MODEL, text))

        for rnd in range(passes):
            for n in SIZES:
                ids = workload.exact_tokens(tokenize, f"t{rnd}-{n}", n)
                fillers = [
                    workload.exact_tokens(tokenize, f"filler{rnd}-{n}-{i}", FILLER_TOKENS)
                    for i in range(FILLERS)
                ]
                _, cold = daemon.first_token(MODEL, ids)
                s = cold.stats
                rate = s.prefill_tokens / (s.prefill_ms / 1e3) if s.prefill_ms > 0 else 0.0
                print(f"pass {rnd + 1} cold {n}: {rate:.0f} tok/s; {_threads(client)}", flush=True)
                daemon.first_token(MODEL, ids)
                for filler in fillers:
                    daemon.first_token(MODEL, filler)
                daemon.first_token(MODEL, ids)
    finally:
        daemon.remove()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    for run in range(args.runs):
        print(f"run {run + 1}", flush=True)
        run_once(args.passes)


if __name__ == "__main__":
    main()
