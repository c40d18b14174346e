"""A real ``redis-server`` for the remote tier's tests and bench (issue 20).

Started on a free loopback port with its own temporary directory, no
persistence, and the memory bound the docs tell operators to set
(``maxmemory`` with ``allkeys-lru``); stopped (and its directory removed)
by :meth:`RedisServer.close`. :meth:`kill`, :meth:`pause`, :meth:`resume`
and :meth:`start` again (same port) are the faults the tests inject.

``make setup`` installs the ``redis-server`` Debian package where it may
(``scripts/tools.py``); elsewhere ``apt-get install redis-server``. A test
module that needs it skips when the binary is absent.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

__all__ = ["REDIS_SERVER", "RedisServer", "redis_available"]

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def redis_available() -> bool:
    return os.access(REDIS_SERVER, os.X_OK)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """One ``redis-server`` process (see the module doc)."""

    def __init__(self, *, maxmemory: str = "256mb") -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="llamad-redis-"))
        self.port = _free_port()
        self.maxmemory = maxmemory
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)

    def start(self, timeout: float = 30.0) -> RedisServer:
        """Start it (again, on the same port); return once it answers PING."""
        assert self.proc is None or self.proc.poll() is not None, "already running"
        log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - the child holds it
        try:
            self.proc = subprocess.Popen(
                [
                    REDIS_SERVER,
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--dir",
                    str(self.dir),
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--maxmemory",
                    self.maxmemory,
                    "--maxmemory-policy",
                    "allkeys-lru",
                    "--protected-mode",
                    "yes",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        finally:
            log.close()
        deadline = time.monotonic() + timeout
        client = self.client()
        try:
            while True:
                try:
                    if client.ping():
                        return self
                except redis.RedisError:
                    pass
                assert self.proc.poll() is None, f"redis-server exited: {self.log_tail()}"
                assert time.monotonic() < deadline, "redis-server did not answer"
                time.sleep(0.02)
        finally:
            client.close()

    def log_tail(self) -> str:
        try:
            return (self.dir / "redis.log").read_text()[-2000:]
        except OSError:
            return ""

    def _signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None and self.proc.poll() is None
        os.kill(self.proc.pid, sig)

    def pause(self) -> None:
        """SIGSTOP: it still accepts connections (the kernel does) and answers nothing."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, and wait for it to be gone (its data is lost: no persistence)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)
