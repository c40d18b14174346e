"""After-hogs probe (issue 21): does the first cold prompt after CPU hogs
leave run on every thread?

    PYTHONPATH=src python -m bench.after_hogs_probe [--rounds 2]

Starts a real daemon (:class:`bench.peers.llamad_sys.LlamadDaemon`: the
default GGUF, 2 threads, the cache's default configuration) and, each round,
streams a counting prompt for 12 s beside one busy-loop process per core (as
P14 does), kills the hogs, waits 1 s, then sends three fresh 512-token
prompts back to back. For each it prints the worker's prefill rate
(``stats.prefill_tokens`` over ``stats.prefill_ms``) and the governor's
:class:`~llamad.model.wire.ThreadStatus`.

Written for a finding left open (issue 21's note of 2026-11-29): in the
peers run at f0a8ef6, two rounds' first cold 512-token prompt took 1.22 s
against llama-server's 1.08 (P5 0.946, within noise). Measured with this
probe: the first prompt after the hogs prefilled at 248 tok/s (1 thread)
and the next ones at 450-475. The governor is still falling back (its
cool-down doubled while probes failed beside the hogs), and its quiet probe
never fires (``quiet_probes`` 0): the load gauge answers None on its first
reading after a pause (``OthersGauge``, ``max_age_s``), and a one-chunk
prompt is one step, so no second reading comes before the chunk runs.
Since then the governor reads the gauge as the worker goes idle while
falling back, and the worker's gauge averages over an idle gap of up to 30 s:
2 rounds, the first cold prompt after the hogs at 479-483 tok/s (the quiet
probe fired), the next ones at 459-481. Not a recorded bench: it writes no
result file.

``--idle S`` keeps the hogs running S seconds after the stream with the
daemon idle, and ``--gap`` sets the wait between the hogs and the prompts,
as in the peers bench (the other systems' P14 streams follow llamad's, and
the next round's first prompt follows the last stream at once). In the
peers run at a0e44d6, llamad's first cold 512 of two rounds prefilled at
426-431 tok/s against 478; ``--idle 60 --gap 0``, 2 rounds: 478-505 tok/s
on 2 threads, so this sequence alone does not reproduce it.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from bench.hogs import Hogs
from bench.peers import workload
from bench.peers.llamad_sys import LlamadDaemon, ModelTable

MODEL = "main"
HOGS_S = 12.0


def _threads(client: Any) -> str:
    t = client.status(MODEL).worker.threads
    if t is None:
        return "threads: not governed"
    return (
        f"threads {t.threads} ceiling {t.ceiling} fallbacks {t.fallbacks} "
        f"collapses {t.collapses} probes {t.probes_kept}/{t.probes} quiet {t.quiet_probes} "
        f"cooldown {t.cooldown_s} next {t.next_probe_s} "
        f"explorations {t.explorations_kept}/{t.explorations}"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--idle",
        type=float,
        default=0.0,
        help="seconds the hogs run on after the stream, the daemon idle (as in the peers "
        "bench, where the other systems' P14 streams follow llamad's)",
    )
    ap.add_argument(
        "--gap", type=float, default=1.0, help="seconds between the hogs and the prompts"
    )
    args = ap.parse_args()
    daemon = LlamadDaemon("afterhogs", [ModelTable(MODEL, n_ctx=8192, n_seq_max=4, threads=2)], 2)
    try:
        client = daemon.start()

        def tokenize(text: str) -> list[int]:
            return list(client.tokenize(MODEL, text))

        for rnd in range(args.rounds):
            ids = workload.counting_tokens(tokenize, 100 + rnd, 12)
            with Hogs(2):
                time.sleep(0.3)
                started, events = time.monotonic(), 0
                for _ in client.infer(MODEL, ids, max_tokens=4000, temperature=0.0):
                    events += 1
                    if time.monotonic() - started > HOGS_S:
                        break
                time.sleep(args.idle)
            print(f"round {rnd + 1}: {events} events beside the hogs; {_threads(client)}")
            time.sleep(args.gap)
            for k in range(3):
                prompt = workload.exact_tokens(tokenize, f"afterhogs{rnd}-{k}", 512)
                _, cold = daemon.first_token(MODEL, prompt)
                s = cold.stats
                rate = s.prefill_tokens / (s.prefill_ms / 1e3) if s.prefill_ms > 0 else 0.0
                print(f"  cold 512 #{k + 1}: {rate:.0f} tok/s; {_threads(client)}", flush=True)
    finally:
        daemon.remove()


if __name__ == "__main__":
    main()
