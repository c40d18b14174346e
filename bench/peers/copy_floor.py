"""P1's floor copy: ``python -m bench.peers.copy_floor NBYTES`` prints its ms.

Imports nothing of llamad or the bench, so :func:`bench.peers.scenarios.copy_ms_past_cache`
can run it in a fresh interpreter started as a model worker is (glibc reads
its tunables once, when a process starts).
"""

from __future__ import annotations

import sys
import time

import numpy as np


def copy_ms(nbytes: int) -> float:
    """Best of five copies of ``nbytes`` between two resident buffers."""
    src = np.ones(nbytes, dtype=np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


if __name__ == "__main__":
    print(copy_ms(int(sys.argv[1])))
