"""What the client tests need from the daemon besides the public client.

Observations and faults a user of the client cannot cause through it: the
worker's pid, SIGKILL, waiting for a finish save to be published, reading a
worker's status board. :class:`Served` is built over either the real daemon
(``daemon_proc.py``) or the stand-in front (``standin_front.py``).
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path

from llamad.actors import Registry
from llamad.cache.client import CacheClient
from llamad.model.status_board import WorkerSnapshot, read_status, status_path
from llamad.testing import wait_until

__all__ = ["ENDLESS", "EVENTUALLY", "MANY", "Served", "prompt_text", "wait_until"]

#: "Eventually" on a 2-core machine shared with other test runs.
EVENTUALLY = 60.0

#: A grammar that never lets the model stop: a request under it ends only at
#: its ``max_tokens`` or when it is cancelled, whatever the sampler draws.
ENDLESS = 'root ::= "la " root'

#: ``max_tokens`` for a request that must be cancelled: far more steps than the
#: cancel can take, far fewer than a 2-core machine decodes in :data:`EVENTUALLY`.
MANY = 1000


def prompt_text(i: int, words: int = 40) -> str:
    """A distinct prompt of about ``words`` words (no prefix shared between ``i``)."""
    vocab = ["river", "stone", "lamp", "cloud", "paper", "garden", "mirror", "copper"]
    body = " ".join(vocab[(i * 7 + j * 3) % len(vocab)] for j in range(words))
    return f"Story {i}: {body}."


class Served:
    """A running daemon (or stand-in) at ``endpoint`` whose actors register in
    ``registry_root``."""

    def __init__(self, endpoint: str, registry_root: Path, model_id: str) -> None:
        self.endpoint = endpoint
        self.registry = Registry(registry_root)
        self.model_id = model_id

    def worker_pid(self, model_id: str | None = None) -> int | None:
        entry = self.registry.lookup(f"model.{model_id or self.model_id}")
        return entry.pid if entry is not None else None

    def kill_worker(self, model_id: str | None = None) -> int:
        """SIGKILL the worker; return once it has exited (its pid is returned)."""
        pid = self.worker_pid(model_id)
        assert pid is not None, "no live worker to kill"
        fd = os.pidfd_open(pid)
        try:
            os.kill(pid, signal.SIGKILL)
            assert select.select([fd], [], [], 10)[0], f"worker {pid} survived SIGKILL"
        finally:
            os.close(fd)
        return pid

    def wait_worker_back(self, old_pid: int, model_id: str | None = None) -> int:
        def new_pid() -> int | None:
            pid = self.worker_pid(model_id)
            return pid if pid is not None and pid != old_pid else None

        return wait_until(new_pid, "the worker to come back", EVENTUALLY)

    def board(self, model_id: str | None = None) -> WorkerSnapshot | None:
        """The worker's published status (read without asking it)."""
        return read_status(status_path(self.registry.root, f"model.{model_id or self.model_id}"))

    def settled_board(self, model_id: str | None = None, quiet_s: float = 0.3) -> WorkerSnapshot:
        """The worker's status once it has published nothing new for ``quiet_s``.

        The worker answers a request before it publishes the snapshot that
        counts it (its loop publishes after handling its messages), so a read
        right after an answer can still show the count before it; an idle
        worker publishes nothing more, so a snapshot that stands for
        ``quiet_s`` counts everything answered before the call."""

        def standing() -> WorkerSnapshot | None:
            first = self.board(model_id)
            time.sleep(quiet_s)
            second = self.board(model_id)
            if first is None or second is None or second.seq != first.seq:
                return None
            return second

        return wait_until(standing, "the worker's status to settle", EVENTUALLY)

    def wait_idle(self, model_id: str | None = None, timeout: float = EVENTUALLY) -> WorkerSnapshot:
        """Until the worker holds no request (every sequence free, none queued)."""

        def idle() -> WorkerSnapshot | None:
            snap = self.board(model_id)
            if snap is None or snap.busy_since is not None or snap.status.pending_len:
                return None
            return snap

        return wait_until(idle, "the worker to be idle", timeout)

    def ticks(self, model_id: str | None = None) -> int:
        """The worker's decode steps since it started (from its status board)."""
        snap = wait_until(lambda: self.board(model_id), "the worker's status board", EVENTUALLY)
        return snap.status.ticks

    def assert_dropped(self, ticks_before: int, model_id: str | None = None) -> None:
        """A request under :data:`ENDLESS` with ``max_tokens`` :data:`MANY`
        was dropped: the worker went idle in fewer steps than it would have
        taken to finish (it cannot stop by itself)."""
        idle = self.wait_idle(model_id, timeout=4 * EVENTUALLY)
        steps = idle.status.ticks - ticks_before
        assert 0 < steps < MANY, f"{steps} steps: the request ran instead of being dropped"

    def wait_until_busy(self, model_id: str | None = None) -> WorkerSnapshot:
        """Until the worker holds a request that is generating."""

        def busy() -> WorkerSnapshot | None:
            snap = self.board(model_id)
            if snap is None or snap.status.phase != "generating":
                return None
            return snap

        return wait_until(busy, "the worker to be generating", EVENTUALLY)

    def wait_saved(self, key: bytes | None, timeout: float = EVENTUALLY) -> None:
        """Until the row ``key`` is published (finish saves are written off the loop)."""
        assert key is not None
        with CacheClient(registry_root=self.registry.root, timeout=30.0) as cache:
            deadline = time.monotonic() + timeout
            while True:
                ref = cache.lookup_exact_or_wait(key, 1.0)
                if ref is not None:
                    cache.checkin(ref.pin)
                    return
                assert time.monotonic() < deadline, f"row {key.hex()} was never published"
