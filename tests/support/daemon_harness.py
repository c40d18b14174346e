"""A real daemon (``python -m llamad.daemon --config FILE``) for tests.

:class:`Daemon` writes a config into a private directory and starts the
daemon through :class:`llamad.testing.Launcher` (which owns the directory,
the environment, readiness, the stop and the cleanup), and gives the tests
the front (a plain actors client, decoding :mod:`llamad.front.wire` types),
workers (:class:`WorkerClient`), the cache, and the process tree to kill
parts of. Models run the real default model with one thread; the cache's
save thresholds are small so short prompts are saved and found.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import psutil

from llamad import paths
from llamad.actors import Client, Registry
from llamad.cache.client import CacheClient
from llamad.front.wire import DaemonStatus, LoadProgress, ModelInfo, ModelState, Route
from llamad.model.status_board import WorkerSnapshot, read_status, status_path
from llamad.model.worker_client import WorkerClient
from llamad.testing import EVENTUALLY, Launcher, still_running, wait_gone, wait_until

__all__ = [
    "EVENTUALLY",
    "GREEDY",
    "POLICY",
    "Daemon",
    "model_table",
    "prompt_text",
    "still_running",
    "wait_gone",
    "wait_until",
]

GREEDY: dict[str, Any] = {"temperature": 0.0}

# Small save thresholds, so prompts of a few dozen tokens are saved and found.
POLICY = """
[cache.policy]
min_tokens = 16
cold_min_tokens = 16
boundary_trim_tokens = 0
boundary_align_tokens = 16
session_resume_wait_ms = 5000
evict_save_timeout_ms = 10000
[cache.lookup]
common_min_tokens = 16
"""


def prompt_text(i: int, words: int = 40) -> str:
    """A distinct prompt of about ``words`` words (no prefix shared between ``i``)."""
    vocab = ["river", "stone", "lamp", "cloud", "paper", "garden", "mirror", "copper"]
    body = " ".join(vocab[(i * 7 + j * 3) % len(vocab)] for j in range(words))
    return f"Story {i}: {body}."


def model_table(model_id: str, **options: Any) -> str:
    """A ``[models.<id>]`` table on the default model, one thread, small context."""
    values: dict[str, Any] = {
        "path": "default",
        "n_ctx": 1024,
        "n_batch": 256,
        "n_ubatch": 256,
        "n_threads": 1,
        "n_threads_batch": 1,
        **options,
    }
    lines = [f"[models.{model_id}]"]
    for key, value in values.items():
        if isinstance(value, Mapping):
            continue
        lines.append(f"{key} = {_toml(value)}")
    for key, value in values.items():
        if isinstance(value, Mapping):
            lines.append(f"[models.{model_id}.{key}]")
            lines += [f"{k} = {_toml(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return str(value)


class Daemon:
    """One daemon subprocess over a private directory (see the module doc).

    ``models``: ``{model_id: options}`` for :func:`model_table`. ``extra``:
    more TOML. ``base``: reuse a directory (a restart over the same state).
    """

    def __init__(
        self,
        models: Mapping[str, Mapping[str, Any]],
        *,
        extra: str = "",
        base: Path | None = None,
        disk_quota: str = "512MiB",
        model_dirs: Iterable[Path] = (),
        max_message_bytes: str = "64MiB",
    ) -> None:
        self.launcher = Launcher(prefix="lld-", base=base)
        self.base = self.launcher.base
        self.runtime = self.launcher.runtime
        self.state = self.launcher.state
        self.models_dir = self.base / "models"
        self.models_dir.mkdir(exist_ok=True)
        self.instance = self.launcher.instance
        dirs = [self.models_dir, paths.default_model_path().parent, *model_dirs]
        self.config = self.launcher.write_config(
            f"""
[daemon]
runtime_dir = "{self.runtime}"
state_dir = "{self.state}"
log_format = "json"

[cache]
instance = "{self.instance}"
[cache.ram]
quota = "256MiB"
[cache.ram_file]
quota = 0
[cache.disk]
quota = "{disk_quota}"
{POLICY}
[security]
model_dirs = [{", ".join(f'"{d}"' for d in dirs)}]
max_message_bytes = "{max_message_bytes}"
max_header_bytes = "{max_message_bytes}"

{extra}
"""
            + "".join(model_table(mid, **opts) for mid, opts in models.items())
        )
        # The front's address; a test serving tcp sets its own (and its own front).
        self.endpoint = self.launcher.endpoint
        self.registry_root = self.launcher.registry_root
        self._front: Client | None = None
        self._workers: dict[str, WorkerClient] = {}

    # -- life ---------------------------------------------------------------------------

    def start(
        self, wait_for: Iterable[str] = (), *, preexec_fn: Callable[[], object] | None = None
    ) -> Daemon:
        """Start the daemon; return once the front routes every model in
        ``wait_for``. ``preexec_fn``: see :meth:`llamad.testing.Launcher.start`."""
        self.launcher.start(preexec_fn=preexec_fn)
        wanted = list(wait_for)
        if wanted:
            self.launcher.wait_routed(wanted, front=self.front, timeout=EVENTUALLY)
        return self

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.launcher.proc

    @property
    def pid(self) -> int:
        return self.launcher.pid

    def tree(self) -> list[psutil.Process]:
        """Every process under the root."""
        return self.launcher.tree()

    def child_pid(self, name: str) -> int:
        """The pid of the root's child process ``name`` (cache_sup, model_sup, front)
        or of a registered actor (cache-meta, model.<id>)."""
        entry = Registry(self.registry_root).lookup(name)
        if entry is not None:
            return entry.pid
        for p in self.tree():
            try:
                cmd = p.cmdline()
            except psutil.NoSuchProcess:
                continue
            if "--id" in cmd and cmd[cmd.index("--id") + 1] == name:
                return p.pid
        raise AssertionError(f"no process {name!r} in the daemon's tree")

    def close_clients(self) -> None:
        if self._front is not None:
            self._front.close()
            self._front = None
        for w in self._workers.values():
            w.close()
        self._workers.clear()

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the root; its exit status once it and every descendant are gone."""
        self.close_clients()
        return self.launcher.stop(timeout)

    def kill(self) -> None:
        """SIGKILL the root (its children die with it)."""
        self.close_clients()
        self.launcher.kill()

    def cleanup(self) -> None:
        """Stop it if it runs; remove its directory and its ram segments."""
        self.close_clients()
        self.launcher.close()

    def log_events(self) -> list[str]:
        return self.launcher.log_lines()

    # -- the front ----------------------------------------------------------------------

    @property
    def front(self) -> Client:
        if self._front is None:
            self._front = Client(self.endpoint, timeout=EVENTUALLY, connect_timeout=5.0)
        return self._front

    def route(self, model_id: str, timeout: float = EVENTUALLY) -> Route:
        """The model's route, retrying while the daemon starts (no front yet)."""
        return self.launcher.route(model_id, front=self.front, timeout=timeout)

    def info(self, model_id: str) -> ModelInfo:
        info: ModelInfo = self.front.call(
            "model_info", {"model_id": model_id}, reply_type=ModelInfo
        )
        return info

    def wait_state(
        self, model_id: str, state: ModelState, timeout: float = EVENTUALLY
    ) -> ModelInfo:
        return wait_until(
            lambda: (i := self.info(model_id)).state is state and i,
            f"{model_id} to be {state.value}",
            timeout,
        )

    def status(self) -> DaemonStatus:
        status: DaemonStatus = self.front.call("status", {}, reply_type=DaemonStatus)
        return status

    def load(
        self, model_id: str, path: str = "default", **options: Any
    ) -> tuple[list[LoadProgress], ModelInfo]:
        """``load_model``: its progress events and the ModelInfo it ends with."""
        opts = {"n_threads": 1, "n_threads_batch": 1, "n_ctx": 512, **options}
        stream = self.front.stream(
            "load_model",
            {"model_id": model_id, "path": path, "options": opts},
            event_type=LoadProgress,
            timeout=EVENTUALLY,
        )
        events = [m.body for m in stream]
        return events, msgspec.convert(stream.result, ModelInfo)

    # -- workers and the cache ----------------------------------------------------------

    def worker(self, model_id: str) -> WorkerClient:
        """A client of ``model_id``'s worker, found through the front's route."""
        route = self.route(model_id)
        w = self._workers.get(model_id)
        if w is None:
            w = WorkerClient(model_id, registry=Registry(route.registry_root), timeout=EVENTUALLY)
            self._workers[model_id] = w
        return w

    def board(self, model_id: str) -> WorkerSnapshot | None:
        return read_status(status_path(self.registry_root, f"model.{model_id}"))

    def cache(self) -> CacheClient:
        return CacheClient(registry_root=self.registry_root, timeout=30.0)

    def wait_saved(self, key: bytes | None, timeout: float = EVENTUALLY) -> None:
        """Until the row ``key`` is published (the writer pool saves off the loop)."""
        assert key is not None
        deadline = time.monotonic() + timeout
        with self.cache() as cache:
            while (ref := cache.lookup_exact_or_wait(key, 1.0)) is None:
                assert time.monotonic() < deadline, f"row {key.hex()} was never published"
                time.sleep(0.01)
            cache.checkin(ref.pin)
