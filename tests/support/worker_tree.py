"""A real tree for model worker tests: cache-meta and one model worker under a real
supervisor (one_for_one, as the daemon's cache_sup and model_sup are siblings),
driven through a real actors client.

The worker runs the real default model with one thread (``n_threads``: another
count, or ``None`` for the default with the governor live, and a thread policy
for the thread tests; ``deterministic`` as the model option); the cache is a private scratch cache
(every tier, its own registry), removed afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llamad import paths
from llamad.actors import Registry
from llamad.cache.client import CacheClient
from llamad.cache.lookup import LookupPolicy
from llamad.cache.meta_wire import ACTOR_NAME as META
from llamad.cache.policy import CachePolicy
from llamad.cache.sup import meta_child_spec
from llamad.llama_ffi import ContextOptions
from llamad.model.config import WorkerConfig
from llamad.model.results import WorkerStatus
from llamad.model.status_board import WorkerSnapshot, read_status, status_path
from llamad.model.threads import ThreadPolicy
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_spec import WorkerSpec, worker_child_spec
from llamad.supervisor import Supervisor, SupervisorSpec, SupFlags
from llamad.testing import discard_scratch, scratch_settings, wait_until

#: "Eventually" on a 2-core machine shared with other test runs.
EVENTUALLY = 60.0

# Small save thresholds, so prompts of a few dozen tokens are saved and found.
POLICY = CachePolicy(
    min_tokens=16,
    cold_min_tokens=16,
    boundary_trim_tokens=0,
    boundary_align_tokens=16,
    continued_interval=4096,
    session_resume_wait_ms=5_000,
    evict_save_timeout_ms=10_000,
)


class WorkerTree:
    """cache-meta + one model worker (and any sibling workers) under one supervisor."""

    def __init__(
        self,
        *,
        model_id: str = "smol",
        n_ctx: int = 2048,
        n_batch: int = 256,
        n_seq_max: int = 4,
        max_queue: int = 16,
        prefill_chunk_size: int | None = None,
        policy: CachePolicy = POLICY,
        decode_timeout_ms: int = 60_000,
        liveness_s: float = 5.0,
        prefix: str = "lmw",
        siblings: Mapping[str, Mapping[str, Any]] | None = None,
        n_threads: int | None = 1,
        threads: ThreadPolicy | None = None,
        live_reuse: bool = True,
        release_saved_idle: bool = True,
        deterministic: bool = False,
    ) -> None:
        self.settings = scratch_settings(
            prefix=prefix, lookup=LookupPolicy(common_min_tokens=8), stats_flush_s=0.5
        )
        shape: dict[str, Any] = {
            "n_ctx": n_ctx,
            "n_batch": n_batch,
            "n_seq_max": n_seq_max,
            "max_queue": max_queue,
            "prefill_chunk_size": prefill_chunk_size,
            "policy": policy,
            "decode_timeout_ms": decode_timeout_ms,
            "liveness_s": liveness_s,
            "n_threads": n_threads,
            "threads": threads,
            "live_reuse": live_reuse,
            "release_saved_idle": release_saved_idle,
            "deterministic": deterministic,
        }
        self.spec = self._worker_spec(model_id, **shape)
        # Sibling workers of the same model file share the cache: each is the
        # main worker's shape with its own overrides (n_ctx, ...).
        self.specs = {model_id: self.spec}
        for sibling, overrides in (siblings or {}).items():
            self.specs[sibling] = self._worker_spec(sibling, **{**shape, **overrides})
        assert self.settings.registry_root is not None
        self.registry = Registry(self.settings.registry_root)
        self.sup = Supervisor(
            SupervisorSpec(
                "model_test",
                SupFlags(intensity=20, period=60),
                (
                    meta_child_spec(self.settings),
                    *(worker_child_spec(s) for s in self.specs.values()),
                ),
            )
        )
        self._clients: list[WorkerClient] = []

    def _worker_spec(
        self,
        model_id: str,
        *,
        n_ctx: int,
        n_batch: int,
        n_seq_max: int,
        max_queue: int,
        prefill_chunk_size: int | None,
        policy: CachePolicy,
        decode_timeout_ms: int,
        liveness_s: float,
        n_threads: int | None,
        threads: ThreadPolicy | None,
        live_reuse: bool,
        release_saved_idle: bool,
        deterministic: bool,
    ) -> WorkerSpec:
        sizes = {"n_ctx": n_ctx, "n_batch": n_batch, "n_seq_max": n_seq_max}
        # None: the binding's default, every CPU this process may use (the
        # governor then picks each step's count).
        threads_opts = (
            {} if n_threads is None else {"n_threads": n_threads, "n_threads_batch": n_threads}
        )
        return WorkerSpec(
            model_id=model_id,
            model_path=str(paths.default_model_path()),
            context=ContextOptions(
                **sizes,
                n_ubatch=n_batch,
                kv_unified=True,
                **threads_opts,
            ),
            worker=WorkerConfig(
                **sizes,
                max_queue=max_queue,
                prefill_chunk_size=prefill_chunk_size,
                policy=policy,
                live_reuse=live_reuse,
                release_saved_idle=release_saved_idle,
            ),
            cache=self.settings,
            decode_timeout_ms=decode_timeout_ms,
            liveness_s=liveness_s,
            threads=threads,
            deterministic=deterministic,
        )

    def start(self) -> WorkerTree:
        try:
            self.sup.start()
        except BaseException:
            discard_scratch(self.settings)
            raise
        return self

    def close(self) -> None:
        for c in self._clients:
            c.close()
        try:
            self.sup.stop(120)
        finally:
            discard_scratch(self.settings)

    # -- reaching it -----------------------------------------------------------------

    def client(self, model_id: str | None = None, **kw: Any) -> WorkerClient:
        """A client of the main worker, or of the sibling ``model_id``."""
        c = WorkerClient(model_id or self.spec.model_id, registry=self.registry, **kw)
        self._clients.append(c)
        return c

    def cache(self) -> CacheClient:
        return CacheClient.from_settings(self.settings, timeout=30.0, connect_timeout=10.0)

    def pid(self, name: str | None = None) -> int:
        entry = self.registry.lookup(name or self.spec.actor_name)
        assert entry is not None, f"{name or self.spec.actor_name} is not running"
        return entry.pid

    def meta_pid(self) -> int:
        return self.pid(META)

    def wait_restarted(self, old_pid: int, name: str | None = None) -> int:
        """The pid of the actor ``name`` once a process other than ``old_pid`` serves it."""

        def new_pid() -> int | None:
            entry = self.registry.lookup(name or self.spec.actor_name)
            return entry.pid if entry is not None and entry.pid != old_pid else None

        return wait_until(new_pid, f"{name or 'the worker'} to come back", EVENTUALLY)

    @property
    def board(self) -> Path:
        return status_path(self.registry.root, self.spec.actor_name)

    def status(self, model_id: str | None = None) -> WorkerSnapshot | None:
        """The worker's (or sibling ``model_id``'s) published status, read
        without asking the worker."""
        if model_id is None:
            return read_status(self.board)
        return read_status(status_path(self.registry.root, self.specs[model_id].actor_name))

    def wait_saved(self, key: bytes | None, timeout: float = EVENTUALLY) -> None:
        """Until the row ``key`` is published (the writer pool saves off the loop)."""
        assert key is not None
        deadline = time.monotonic() + timeout
        with self.cache() as cache:
            # The writer reserves the save on its own thread: until it has,
            # cache-meta knows no save to wait for and answers a miss at once.
            while (ref := cache.lookup_exact_or_wait(key, 1.0)) is None:
                assert time.monotonic() < deadline, f"row {key.hex()} was never published"
                time.sleep(0.005)
            cache.checkin(ref.pin)

    def wait_idle(self, timeout: float = EVENTUALLY, model_id: str | None = None) -> WorkerSnapshot:
        """Until the worker (or sibling ``model_id``) holds no request (every sequence free)."""

        def idle() -> WorkerSnapshot | None:
            snap = self.status(model_id)
            if snap is None or snap.busy_since is not None or snap.status.pending_len:
                return None
            return snap

        return wait_until(idle, "the worker to be idle", timeout)


def prompt_text(i: int, words: int = 40) -> str:
    """A distinct prompt of about ``words`` words (no prefix shared between ``i``)."""
    vocab = ["river", "stone", "lamp", "cloud", "paper", "garden", "mirror", "copper"]
    body = " ".join(vocab[(i * 7 + j * 3) % len(vocab)] for j in range(words))
    return f"Story {i}: {body}."


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def saved_entry(worker: WorkerClient, tokens: int) -> WorkerStatus:
    """The worker's status once its idle entry of ``tokens`` tokens holds a
    row: published, or its finish save in flight (the writer saves off the
    loop)."""

    def heard() -> WorkerStatus | None:
        status = worker.status_from_loop().status
        entries = [e for e in status.idle_entries if e.tokens == tokens]
        return status if entries and all(e.saved for e in entries) else None

    return wait_until(heard, "the idle entry's row to be published")
