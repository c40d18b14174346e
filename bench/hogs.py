"""Busy-loop processes, one per core, for the benches that measure beside them.

One implementation for every bench: each hog ends on its own once the bench
that started it is gone (a bench killed before its ``finally`` ran leaves no
spinning process behind, which would load every later measurement), and the
context manager kills and reaps them however its block ends. A ``timeout 600
sh -c 'while :; ...'`` hog, as ``cancel_bench`` had, leaked: killing the
``timeout`` left its ``sh`` spinning.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from types import TracebackType

__all__ = ["HOG_CODE", "Hogs"]

# A busy loop that checks, every few milliseconds of spinning, that the
# process that started it (its first argument: a parent that died before the
# hog's interpreter came up must not be missed) is still its parent;
# reparented (the bench died without killing it), it ends.
HOG_CODE = (
    "import os, sys\n"
    "parent = int(sys.argv[1])\n"
    "while os.getppid() == parent:\n"
    "    for _ in range(100_000):\n"
    "        pass\n"
)


class Hogs:
    """``n`` busy-loop child processes, one per core, as a context manager:
    started on entry, killed and reaped on exit however the block ends."""

    def __init__(self, n: int, *, code: str = HOG_CODE, python: str = sys.executable) -> None:
        self.n = n
        self.code = code
        self.python = python
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def start(self) -> None:
        try:
            for _ in range(self.n):
                self.procs.append(
                    subprocess.Popen(
                        [self.python, "-S", "-c", self.code, str(os.getpid())],
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                )
        except BaseException:
            self.stop()
            raise

    def running(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def stop(self) -> None:
        """Kill every hog and reap it (idempotent)."""
        procs, self.procs = self.procs, []
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.kill()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)

    def __enter__(self) -> Hogs:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
