"""The first repeat after a restart, part by part (SPEC P2; issue 21 item 2).

    python -m bench.restart_probe [--sizes 512,1024,2048] [--restarts 2]

Starts a real daemon with the default configuration (the peers bench's
:class:`~bench.peers.llamad_sys.LlamadDaemon`, 2 threads), sends one cold
prompt of each size (``exact_tokens``: that many tokens, a nonce of its own
so every run is cold), waits 3 s for their finish saves, then ``--restarts``
times: SIGTERM (the clean stop links each ``ram`` row into ``ram_file``), a
start over the same directories (which links them back into ``ram``), and
each prompt again, in the order given, the moment the previous reply ended.
For each repeat it prints the client's time to the first token and the
worker's own parts (``Completion.stats``): queue, restore, of it the lookup
and the load (the row's validated read and its unpack into the KV), and the
first token.

The first repeat after a start is the only one that finds nothing of the
row in its process: no mapping of the segment, no read buffer, no lazily
built handle. This probe shows what that costs against the peers bench's
P1 (the same row restored by the worker that saved it). Not a recorded
bench: it writes no result file; P2's recorded figure comes from the peers
bench.
"""

from __future__ import annotations

import argparse
import os
import time

from bench.peers import workload
from bench.peers.llamad_sys import LlamadDaemon, ModelTable

MODEL = "probe"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="512,1024,2048")
    ap.add_argument("--restarts", type=int, default=2)
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    daemon = LlamadDaemon("restart", [ModelTable(MODEL, 4096, 4, 2)], 2)
    client = daemon.start()
    try:
        nonce = os.urandom(4).hex()
        prompts = {
            n: workload.exact_tokens(lambda t: client.tokenize(MODEL, t), f"{nonce}-{n}", n)
            for n in sizes
        }
        for prompt in prompts.values():
            daemon.first_token(MODEL, prompt)
        time.sleep(3.0)  # the finish saves land (the restart's stop would wait for them)
        for r in range(args.restarts):
            daemon.stop()
            client = daemon.start()
            for n, prompt in prompts.items():
                ms, done = daemon.first_token(MODEL, prompt)
                s = done.stats
                print(
                    f"restart {r} tokens {n}: ttft {ms:.1f} ms, worker: queue {s.queue_ms:.2f}"
                    f" restore {s.restore_ms:.2f} (lookup {s.lookup_ms:.2f}, load {s.load_ms:.2f})"
                    f" first token {s.prefill_ms:.2f}, hit {done.cache_hit_kind.value}",
                    flush=True,
                )
    finally:
        daemon.remove()


if __name__ == "__main__":
    main()
