"""``make bench``: every benchmark, one after another, each recording its result.

    python -m bench.run_all [--only NAME ...]

Benchmarks run sequentially (never side by side: they measure the same
cores) and each writes ``bench/results/<name>-<date>.json`` (the machine it
ran on, its parameters, every round's data) and the ``.md`` its report
renders from it (``python -m bench.report --check bench/results/*.json``
renders them again). A failing benchmark does not stop the others; the exit
status says whether all of them ran.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

# name -> (module, arguments that make it record its result)
BENCHES: dict[str, tuple[str, list[str]]] = {
    "ffi": ("bench.ffi_bench", []),
    "actors": ("bench.actors_bench", []),
    "cache-io": ("bench.cache_io_bench", ["--record"]),
    "cache-lookup": ("bench.cache_lookup_bench", ["--record"]),
    "threads": ("bench.threads_bench", []),  # records unless --no-record
    "worker": ("bench.worker_bench", []),  # records unless --no-record
    "client": ("bench.client_bench", []),  # records unless --no-record
    "peers": ("bench.peers_bench", []),  # records unless --no-record
    "daemon": ("bench.daemon_bench", []),  # records unless --no-record
    "soak": ("bench.soak", []),  # 10 minutes; records unless --no-record
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", choices=sorted(BENCHES), default=None)
    args = ap.parse_args()
    env = {**os.environ, "LLAMAD_LOG_LEVEL": os.environ.get("LLAMAD_LOG_LEVEL", "warning")}
    failed = []
    for name in args.only or list(BENCHES):
        module, extra = BENCHES[name]
        print(f"\n=== {name} ({module}) ===", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run([sys.executable, "-m", module, *extra], env=env, check=False).returncode
        print(f"=== {name}: exit {rc} after {time.monotonic() - t0:.0f} s ===", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
