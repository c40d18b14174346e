"""The real daemon for client tests: ``python -m llamad.daemon --config FILE``.

A private short directory (ipc paths must fit in 107 bytes) holds the
config, the runtime and state directories and the daemon's log. Models run
the default model with one thread; the cache's save thresholds are small so
prompts of a few dozen tokens are saved and found. :meth:`DaemonProc.stop`
(SIGTERM) and :meth:`DaemonProc.start` again reuse the same directory and
endpoint: a restart.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from llamad import paths
from llamad.actors import Client as ActorClient
from llamad.front.wire import Route
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

    def __init__(self, model_id: str = "smol", **model: Any) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="lmc-", dir="/tmp"))
        runtime = self.base / "run"
        self.models_dir = self.base / "models"
        """An allowed model directory (empty: tests put files there)."""
        self.models_dir.mkdir()
        options: Mapping[str, Any] = {**_MODEL, **model}
        table = "\n".join(f"{k} = {_toml(v)}" for k, v in options.items())
        self.config = self.base / "llamad.toml"
        self.config.write_text(
            f"""
[daemon]
runtime_dir = "{runtime}"
state_dir = "{self.base / "state"}"
log_format = "json"

[cache]
instance = "c{uuid.uuid4().hex[:10]}"
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
"""
        )
        self.proc: subprocess.Popen[bytes] | None = None
        runtime.mkdir(mode=0o700)
        super().__init__(f"ipc://{runtime}/llamad.sock", runtime / "actors", model_id)

    def start(self) -> DaemonProc:
        """Start the daemon; return once the front routes the model."""
        log = (self.base / "daemon.log").open("ab")
        # The test's own LLAMAD_* settings must not reach the daemon, but for
        # where the default model lives.
        keep = ("LLAMAD_CACHE_DIR", "LLAMAD_DEFAULT_MODEL")
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_") or k in keep}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llamad.daemon", "--config", str(self.config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
        )
        log.close()
        self._wait_routed()
        return self

    @property
    def pid(self) -> int:
        """The root's pid."""
        assert self.proc is not None
        return self.proc.pid

    def _wait_routed(self) -> None:
        deadline = time.monotonic() + EVENTUALLY
        with ActorClient(self.endpoint, timeout=EVENTUALLY, connect_timeout=1.0) as front:
            while True:
                assert self.proc is not None and self.proc.poll() is None, self.log_tail()
                try:
                    front.call("route", {"model_id": self.model_id}, reply_type=Route)
                    return
                except Exception as exc:
                    if getattr(exc, "code", "") not in ("unavailable", "worker_crashed"):
                        raise
                    assert time.monotonic() < deadline, f"the daemon never routed: {exc}"
                    time.sleep(0.1)

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the root and wait for it: its exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.stop()
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, lines: int = 40) -> str:
        path = self.base / "daemon.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def start_served(**options: Any) -> Iterator[DaemonProc]:
    """A fixture's body: a :class:`DaemonProc` with the model table's
    ``options`` (``max_queue=0``, ...), started, and closed after."""
    daemon = DaemonProc(**options)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()
