"""P9: idle memory of every llamad process less weights and KV, against llama-server's.

Both run one model with the same context; after one short request each sits
idle for a moment, then the RSS of every process of its tree is summed. The
weights' and the KV cache's sizes are what llama.cpp itself reports for this
model and context (llama-server's log at ``-lv 4``: the mapped model buffers
and ``llama_kv_cache: size``), subtracted once per process that holds a model
(each llamad worker; the server). Whatever else is resident (interpreters,
libraries, sockets, the compute buffer) is overhead, for both.

The verdict is on RSS, as SPEC P9 states it. RSS counts a shared page once
per process that maps it: every llamad Python process holds its own RSS
copy of libpython, libcrypto, libstdc++, libzmq (~13 MiB each), which the
machine holds once. PSS (proportional set size) splits each shared page
among the processes that map it, so a tree's PSS sum counts it once;
:func:`pss_overhead_mb` is the same overhead on PSS, reported alongside. The
weights' pages are shared with any other process that maps the same GGUF
(the llama-server probe, running at the same time), so the PSS overhead
subtracts the weights' own measured PSS, never their size.
"""

from __future__ import annotations

import contextlib
import os
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


def pss_bytes(pids: Iterable[int]) -> int:
    """The PSS of ``pids`` summed (bytes); a process that is gone counts 0."""
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_full_info().pss
    return total


def mapped_pss_bytes(pid: int, path: str | os.PathLike[str]) -> int:
    """The PSS of ``pid``'s mappings of the file ``path`` (bytes; 0 if none or gone)."""
    want = os.path.realpath(path)
    total = 0
    inside = False
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                head = line.split(maxsplit=5)
                if "-" in head[0] and not head[0].endswith(":"):  # a mapping's header
                    inside = len(head) > 5 and head[5].rstrip("\n") == want
                elif inside and head[0] == "Pss:":
                    total += int(head[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return total


def pss_overhead_mb(
    pids: Iterable[int], holders: Iterable[int], model: str | os.PathLike[str], kv_mib: float
) -> float:
    """PSS of ``pids`` less each holder's PSS of the ``model`` file and one KV each, MB.

    The KV cache is private anonymous memory (its PSS is its size); the
    weights are the file's pages, shared with whoever else maps it."""
    held = list(holders)
    weights = sum(mapped_pss_bytes(pid, model) for pid in held)
    return (pss_bytes(pids) - weights - len(held) * kv_mib * MIB) / MB


def settle(seconds: float = 2.0) -> None:
    """Let the request's after-work (a finish save, freed buffers) finish."""
    time.sleep(seconds)


def overhead_mb(rss: int, holders: int, model_mib: float, kv_mib: float) -> float:
    """RSS less ``holders`` copies of the weights and the KV, in MB (10^6 bytes)."""
    return (rss - holders * (model_mib + kv_mib) * MIB) / MB


def describe(pids: Iterable[int], *, pss: bool = False) -> str:
    """``name RSS`` of each process (the module a Python process runs), MB;
    with ``pss``, ``name RSS/PSS``."""
    parts = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            cmd = proc.cmdline()
            mem = proc.memory_full_info()
        except psutil.Error:
            continue
        exe = cmd[0].rsplit("/", 1)[-1] if cmd else "?"
        name = cmd[2] if exe.startswith("python") and len(cmd) > 2 and cmd[1] == "-m" else exe
        if "--id" in cmd[:-1]:  # a supervised child: its id says what it is
            name = cmd[cmd.index("--id") + 1]
        parts.append(f"{name} {mem.rss / MB:.0f}" + (f"/{mem.pss / MB:.0f}" if pss else ""))
    return ", ".join(parts)
