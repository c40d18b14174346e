"""llamad as a peer: a real ``python -m llamad.daemon`` driven through the public Client.

The daemon runs in a private 0700 directory (runtime dir, state dir with the
disk tier, log) under its own cache instance (so its ``ram`` segments and its
``ram_file`` directory, ``/dev/shm/llamad-<uid>/<instance>`` by default, are
its own), from a configuration file this module writes; the user's
``LLAMAD_*`` settings are not passed on, so no other daemon is reached or
disturbed. Every model is the default GGUF with the same context as the peers
get (``n_ctx``, ``n_seq_max``, threads); the cache's tiers, quotas and policy
are the defaults, but where a model table asks for a policy (P8).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from llamad import Client
    from llamad.model.results import Completion

READY_TIMEOUT_S = 240.0


@dataclass(frozen=True)
class ModelTable:
    """One ``[models.<id>]`` table: the context the peers get too (``n_ctx``,
    ``n_seq_max``, threads) and, only where a scenario needs one (P8's saves
    on and off), a cache policy. No tier is chosen: the cache decides where a
    save lands and every tier may be read, as with no configuration."""

    model_id: str
    n_ctx: int
    n_seq_max: int
    threads: int
    policy: Mapping[str, int] | None = None

    def toml(self) -> str:
        lines = [
            f"[models.{self.model_id}]",
            'path = "default"',
            f"n_ctx = {self.n_ctx}",
            f"n_seq_max = {self.n_seq_max}",
            f"n_threads = {self.threads}",
            f"n_threads_batch = {self.threads}",
        ]
        if self.policy:
            lines.append(f"[models.{self.model_id}.cache.policy]")
            lines += [f"{k} = {v}" for k, v in self.policy.items()]
        return "\n".join(lines) + "\n"


def _term_with_parent() -> None:
    # A bench killed outright still stops its daemon (PR_SET_PDEATHSIG).
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)


class LlamadDaemon:
    """One daemon serving ``models``; start, restart (state kept), stop."""

    def __init__(self, name: str, models: list[ModelTable], threads: int) -> None:
        self.name = name
        self.models = models
        self.base = Path(tempfile.mkdtemp(prefix=f"llamad-peers-{name}-", dir="/tmp"))
        self.runtime = self.base / "run"
        self.endpoint = f"ipc://{self.runtime}/llamad.sock"
        self.log_path = self.base / "daemon.log"
        config = self.base / "llamad.toml"
        # The daemon's own settings only (its thread budget, quiet logs) and
        # the models' tables: the cache runs as configured by default.
        config.write_text(
            "[daemon]\n"
            'log_level = "warning"\n'
            "[daemon.threads]\n"
            f"cores = {threads}\n\n" + "\n".join(m.toml() for m in models)
        )
        keep = ("LLAMAD_CACHE_DIR", "LLAMAD_DEFAULT_MODEL")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_") or k in keep}
        env.update(
            LLAMAD_CONFIG=str(config),
            LLAMAD_RUNTIME_DIR=str(self.runtime),
            STATE_DIRECTORY=str(self.base / "state"),
            LLAMAD_CACHE__INSTANCE=f"peers-{uuid.uuid4().hex[:12]}",
            LLAMAD_LOG_FORMAT="console",
        )
        self.env = env
        self.instance = env["LLAMAD_CACHE__INSTANCE"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: Client | None = None

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> Client:
        from llamad import Client  # noqa: PLC0415

        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llamad.daemon"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=self.env,
                start_new_session=True,
                preexec_fn=_term_with_parent,  # noqa: PLW1509
            )
        self.client = Client(self.endpoint, connect_timeout=10.0, timeout=600.0)
        self._wait_ready()
        return self.client

    def _wait_ready(self) -> None:
        from llamad.errors import LlamadError  # noqa: PLC0415
        from llamad.front.wire import ModelState  # noqa: PLC0415

        assert self.client is not None and self.proc is not None
        wanted = {m.model_id for m in self.models}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llamad exited {self.proc.returncode}:\n{self.log_tail()}")
            try:
                states = {m.model_id: m.state for m in self.client.list_models(timeout=5.0)}
            except LlamadError:
                states = {}
            if all(states.get(w) is ModelState.READY for w in wanted):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"llamad not ready in {READY_TIMEOUT_S:.0f} s: {states}")
            time.sleep(0.1)

    def stop(self) -> int | None:
        """SIGTERM and wait (its shutdown saves run); the exit status, None if killed."""
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.proc is None:
            return 0
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None

    def restart(self) -> Client:
        """A full daemon restart: SIGTERM (its clean stop), then every process
        new over the same state dir (the disk tier) and ``ram_file`` root."""
        self.stop()
        return self.start()

    def remove(self) -> None:
        """Stop it and remove everything it wrote: its directory and its
        ``ram_file`` tier's (the default, on /dev/shm, outside that directory)."""
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
        shutil.rmtree(self.ram_file_root, ignore_errors=True)

    @property
    def ram_file_root(self) -> Path:
        """Where the default configuration puts this instance's ``ram_file`` rows
        (``cache.ram_file.root``'s default)."""
        from llamad.config.dirs import default_ram_file_root  # noqa: PLC0415

        return Path(default_ram_file_root(self.instance))

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # -- what the scenarios use ------------------------------------------------------

    def pids(self) -> list[int]:
        """The daemon and every process of its tree."""
        if self.proc is None:
            return []
        try:
            root = psutil.Process(self.proc.pid)
            return [root.pid, *(p.pid for p in root.children(recursive=True))]
        except psutil.Error:
            return []

    def largest_ram_row(self) -> int:
        """Bytes of the largest row in this daemon's ``ram`` tier (its shared-memory
        segments, named by the cache instance); 0 if none."""
        sizes = [p.stat().st_size for p in Path("/dev/shm").glob(f"llamad-ram.{self.instance}.*")]
        return max(sizes, default=0)

    def first_token(
        self, model_id: str, prompt: list[int], max_tokens: int = 1
    ) -> tuple[float, Completion]:
        """Client-side time from sending to the first token event, and the Completion."""
        from llamad.model.results import DoneEvent, TokenEvent  # noqa: PLC0415

        assert self.client is not None
        first: float | None = None
        result: Completion | None = None
        started = time.perf_counter()
        for event in self.client.infer(model_id, prompt, max_tokens=max_tokens, temperature=0.0):
            if isinstance(event, TokenEvent) and first is None and event.token is not None:
                first = time.perf_counter() - started
            elif isinstance(event, DoneEvent):
                result = event.result
        assert result is not None
        return (first if first is not None else time.perf_counter() - started) * 1e3, result

    def arrivals(self, model_id: str, prompt: list[int], n: int) -> list[float]:
        """Token arrival times (perf_counter) of one greedy stream of ``n`` tokens."""
        from llamad.model.results import TokenEvent  # noqa: PLC0415

        assert self.client is not None
        times: list[float] = []
        for event in self.client.infer(model_id, prompt, max_tokens=n, temperature=0.0):
            if isinstance(event, TokenEvent) and event.token is not None:
                times.append(time.perf_counter())
        return times
