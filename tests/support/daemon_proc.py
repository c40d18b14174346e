"""The real daemon for client tests: ``python -m llamad.daemon --config FILE``.

Started through :class:`llamad.testing.Launcher`: a private short directory
holds the config, the runtime and state directories and the daemon's log;
readiness is the front routing the model. Models run
the default model with one thread; the cache's save thresholds are small so
prompts of a few dozen tokens are saved and found. :meth:`DaemonProc.stop`
(SIGTERM) and :meth:`DaemonProc.start` again reuse the same directory and
endpoint: a restart.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from typing import Any

from llamad import paths
from llamad.testing import Launcher
from served import EVENTUALLY, Served

__all__ = ["DaemonProc"]

_POLICY = """
[cache.policy]
min_tokens = 16
cold_min_tokens = 16
boundary_trim_tokens = 0
boundary_align_tokens = 16
session_resume_wait_ms = 5000
evict_save_timeout_ms = 10000
[cache.lookup]
common_min_tokens = 8
"""

_MODEL: dict[str, Any] = {
    "path": "default",
    "n_ctx": 2048,
    "n_batch": 256,
    "n_ubatch": 256,
    "n_seq_max": 4,
    "max_queue": 16,
    "n_threads": 1,
    "n_threads_batch": 1,
}


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    return str(value)


class DaemonProc(Served):
    """One daemon subprocess serving ``model_id`` (see the module doc)."""

    def __init__(self, model_id: str = "smol", *, extra: str = "", **model: Any) -> None:
        """``extra``: more of the config file (tables after the model's, e.g. ``[http]``)."""
        self.launcher = Launcher(prefix="lmc-")
        self.base = self.launcher.base
        runtime = self.launcher.runtime
        self.models_dir = self.base / "models"
        """An allowed model directory (empty: tests put files there)."""
        self.models_dir.mkdir()
        options: Mapping[str, Any] = {**_MODEL, **model}
        table = "\n".join(f"{k} = {_toml(v)}" for k, v in options.items())
        self.config = self.launcher.write_config(
            f"""
[daemon]
runtime_dir = "{runtime}"
state_dir = "{self.launcher.state}"
log_format = "json"

[cache]
instance = "{self.launcher.instance}"
[cache.ram]
quota = "256MiB"
[cache.ram_file]
quota = 0
[cache.disk]
quota = "256MiB"
{_POLICY}
[security]
model_dirs = ["{paths.default_model_path().parent}", "{self.models_dir}"]

[models.{model_id}]
{table}
{extra}
"""
        )
        runtime.mkdir(mode=0o700)
        super().__init__(self.launcher.endpoint, self.launcher.registry_root, model_id)

    def start(self) -> DaemonProc:
        """Start the daemon; return once the front routes the model."""
        self.launcher.start().wait_routed([self.model_id], timeout=EVENTUALLY)
        return self

    def http_url(self) -> str:
        """The HTTP gateway's base URL (on a free loopback port: ``TEST_SETTINGS``)."""
        return self.launcher.http_url(timeout=EVENTUALLY)

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.launcher.proc

    @property
    def pid(self) -> int:
        """The root's pid."""
        return self.launcher.pid

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the root and wait for it and its tree: its exit status."""
        return self.launcher.stop(timeout)

    def close(self) -> None:
        """Stop it if it runs; remove its directory."""
        self.launcher.close()

    def log_tail(self, lines: int = 40) -> str:
        return self.launcher.log_tail(lines)


def start_served(**options: Any) -> Iterator[DaemonProc]:
    """A fixture's body: a :class:`DaemonProc` with the model table's
    ``options`` (``max_queue=0``, ...), started, and closed after."""
    daemon = DaemonProc(**options)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()
