"""llamad as a peer: a real ``python -m llamad.daemon`` driven through the public Client.

The daemon runs in a private 0700 directory (runtime dir, state dir with the
disk tier, log) under its own cache instance (so its ``ram`` segments and its
``ram_file`` directory, ``/dev/shm/llamad-<uid>/<instance>`` by default, are
its own), from a configuration file this module writes (``$LLAMAD_CONFIG``;
its places come through the environment); the user's ``LLAMAD_*`` settings
are not passed on, so no other daemon is reached or disturbed.
:class:`llamad.testing.Launcher` starts, waits for, stops and removes it.
Every model is the default GGUF with the same context as the peers
get (``n_ctx``, ``n_seq_max``, threads); the cache's tiers, quotas and policy
are the defaults, but where a model table asks for a policy (P8).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llamad.testing import Launcher, private_dir

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


class LlamadDaemon:
    """One daemon serving ``models``; start, restart (state kept), stop."""

    def __init__(self, name: str, models: list[ModelTable], threads: int) -> None:
        self.name = name
        self.models = models
        base = private_dir(f"llamad-peers-{name}-")
        config = base / "llamad.toml"
        # The daemon's own settings only (its thread budget, quiet logs) and
        # the models' tables: the cache runs as configured by default.
        config.write_text(
            "[daemon]\n"
            'log_level = "warning"\n'
            "[daemon.threads]\n"
            f"cores = {threads}\n\n" + "\n".join(m.toml() for m in models)
        )
        # No --config: the file comes through $LLAMAD_CONFIG and the places
        # (runtime and state directories, cache instance) through the environment.
        self.launcher = Launcher(
            base=base,
            instance=f"peers-{uuid.uuid4().hex[:12]}",
            env={"LLAMAD_CONFIG": str(config), "LLAMAD_LOG_FORMAT": "console"},
            own_session=True,
        )
        self.base = base
        self.instance = self.launcher.instance
        self.endpoint = self.launcher.endpoint
        self.client: Client | None = None

    @property
    def env(self) -> dict[str, str]:
        """The environment the daemon starts with."""
        return self.launcher.environment()

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> Client:
        from llamad import Client  # noqa: PLC0415

        self.launcher.start()
        self.client = Client(self.endpoint, connect_timeout=10.0, timeout=600.0)
        self.launcher.wait_routed([m.model_id for m in self.models], timeout=READY_TIMEOUT_S)
        return self.client

    def stop(self) -> int | None:
        """SIGTERM and wait (its shutdown saves run); the exit status, None if killed."""
        if self.client is not None:
            self.client.close()
            self.client = None
        return self.launcher.terminate().code

    def restart(self) -> Client:
        """A full daemon restart: SIGTERM (its clean stop), then every process
        new over the same state dir (the disk tier) and ``ram_file`` root."""
        self.stop()
        return self.start()

    def remove(self) -> None:
        """Stop it and remove everything it wrote: its directory and its
        ``ram_file`` tier's (the default, on /dev/shm, outside that directory)."""
        self.stop()
        self.launcher.remove()

    @property
    def ram_file_root(self) -> Path:
        """Where the default configuration puts this instance's ``ram_file`` rows
        (``cache.ram_file.root``'s default)."""
        return self.launcher.ram_file_root

    def log_tail(self, lines: int = 30) -> str:
        return self.launcher.log_tail(lines)

    # -- what the scenarios use ------------------------------------------------------

    def pids(self) -> list[int]:
        """The daemon and every process of its tree (the HTTP gateway included)."""
        return self.launcher.pids()

    def http_url(self) -> str:
        """The gateway's base URL (``[http]`` on, port 0: the kernel's free
        port, published in ``<runtime_dir>/http.json``) once it serves."""
        return self.launcher.http_url(timeout=READY_TIMEOUT_S)

    def gateway_pid(self) -> int | None:
        """The gateway's pid as it published it (None: not serving)."""
        from llamad.paths import http_address  # noqa: PLC0415

        pid = (http_address(self.launcher.runtime) or {}).get("pid")
        return pid if isinstance(pid, int) else None

    def largest_ram_row(self) -> int:
        """Bytes of the largest row in this daemon's ``ram`` tier (its shared-memory
        segments, named by the cache instance); 0 if none."""
        sizes = [p.stat().st_size for p in self.launcher.ram_segments()]
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
