"""P9: idle memory of every llamad process less weights and KV, against llama-server's.

Both run one model with the same context; after one short request each sits
idle for a moment, then the RSS of every process of its tree is summed. The
weights' and the KV cache's sizes are what llama.cpp itself reports for this
model and context (llama-server's log at ``-lv 4``: the mapped model buffers
and ``llama_kv_cache: size``), subtracted once per process that holds a model
(each llamad worker; the server). Whatever else is resident (interpreters,
libraries, sockets, the compute buffer) is overhead, for both.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable

import psutil

MB = 1e6
MIB = 1 << 20


def rss_bytes(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total


def settle(seconds: float = 2.0) -> None:
    """Let the request's after-work (a finish save, freed buffers) finish."""
    time.sleep(seconds)


def overhead_mb(rss: int, holders: int, model_mib: float, kv_mib: float) -> float:
    """RSS less ``holders`` copies of the weights and the KV, in MB (10^6 bytes)."""
    return (rss - holders * (model_mib + kv_mib) * MIB) / MB


def describe(pids: Iterable[int]) -> str:
    """``name RSS`` of each process (the module a Python process runs), MB."""
    parts = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            cmd = proc.cmdline()
            rss = proc.memory_info().rss / MB
        except psutil.Error:
            continue
        exe = cmd[0].rsplit("/", 1)[-1] if cmd else "?"
        name = cmd[2] if exe.startswith("python") and len(cmd) > 2 and cmd[1] == "-m" else exe
        if "--id" in cmd[:-1]:  # a supervised child: its id says what it is
            name = cmd[cmd.index("--id") + 1]
        parts.append(f"{name} {rss:.0f}")
    return ", ".join(parts)
