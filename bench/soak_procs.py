"""bench/soak.py's view of the daemon's processes, through ``/proc``.

The tree under the root (every task's ``children``), each process's role
(its supervisor child id: ``cache_sup``, ``cache-meta``, ``model_sup``,
``front``, ``model.<id>``; the root itself), and every ``SAMPLE_EVERY_S``
a :class:`~bench.soak_report.Sample` of each: RSS, own RSS (see
:mod:`bench.soak_report`), open fds and what they are, threads.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import Counter
from pathlib import Path

from bench.soak_report import Sample

SAMPLE_EVERY_S = 5.0


def children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            out += [int(c) for c in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    except OSError:
        pass
    return out


def tree(root: int) -> list[int]:
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children(pid)
    return out


def role(pid: int, root: int) -> str | None:
    """The supervisor child id ``pid`` runs as; ``None`` once it has exited (a
    zombie's cmdline is empty)."""
    if pid == root:
        return "root"
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    if not raw:
        return None
    args = raw.split(b"\0")
    if b"--id" in args:
        return args[args.index(b"--id") + 1].decode()
    return f"other:{pid}"


def status_fields(text: str) -> dict[str, int]:
    """``VmRSS``, ``RssShmem`` (kB) and ``Threads`` from ``/proc/PID/status``."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssShmem", "Threads"):
            out[key] = int(value.split()[0])
    return out


def gguf_rss_kb(smaps: str) -> int:
    """Resident kB of every mapping of a ``.gguf`` file in ``/proc/PID/smaps``."""
    total, in_gguf = 0, False
    for line in smaps.splitlines():
        if line[:1] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:
            in_gguf = line.rstrip().endswith(".gguf")
        elif in_gguf and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def fd_kinds(pid: int) -> Counter[str]:
    """What ``pid``'s open fds are: sockets, pipes, anon inodes by kind, files by
    name with long hex and digit runs folded (row files of one kind count together)."""
    out: Counter[str] = Counter()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for fd in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        kind = target.split(":[", 1)[0] if target.startswith(("socket:", "pipe:")) else target
        out[re.sub(r"[0-9a-f]{8,}|[0-9]+", "*", kind)] += 1
    return out


def sample(pid: int, root: int, t: float) -> Sample | None:
    try:
        st = status_fields(Path(f"/proc/{pid}/status").read_text())
        gguf = gguf_rss_kb(Path(f"/proc/{pid}/smaps").read_text())
        fds = len(os.listdir(f"/proc/{pid}/fd"))
        name = role(pid, root)
    except (OSError, ValueError, IndexError):
        return None  # gone between the walk and the read
    if name is None or "VmRSS" not in st:
        return None  # exited (a killed worker not yet reaped)
    rss = st["VmRSS"]
    return Sample(t, pid, name, rss, rss - st.get("RssShmem", 0) - gguf, fds, st.get("Threads", 0))


class Sampler(threading.Thread):
    def __init__(self, root: int, t0: float, stop: threading.Event) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.root, self.t0, self.stop = root, t0, stop
        self.samples: list[Sample] = []
        self.load: list[float] = []
        self.fds: dict[tuple[float, int], Counter[str]] = {}  # (t, pid) -> fd kinds

    def once(self) -> None:
        t = time.monotonic() - self.t0
        self.load.append(os.getloadavg()[0])
        for pid in tree(self.root):
            if (s := sample(pid, self.root, t)) is not None:
                self.samples.append(s)
                self.fds[(t, pid)] = fd_kinds(pid)

    def run(self) -> None:
        while True:
            self.once()
            if self.stop.wait(SAMPLE_EVERY_S):
                return
