"""systemd's service notification protocol (``sd_notify(3)``), over a plain socket.

Under ``Type=notify`` systemd passes ``$NOTIFY_SOCKET``: an ``AF_UNIX``
datagram socket, either a path (``/run/systemd/notify``) or an abstract
name (``@/org/freedesktop/systemd1/notify/...``, the ``@`` standing for a
leading NUL byte). A service reports by sending one datagram of
``KEY=VALUE`` lines: ``READY=1``, ``STATUS=...``, ``STOPPING=1``,
``WATCHDOG=1``, ``EXTEND_TIMEOUT_USEC=...``. systemd reads the sender's
credentials from the socket itself, so nothing else is needed; with
``NotifyAccess=main`` it accepts messages from the main process only (any
of its threads).

``$WATCHDOG_USEC`` (with ``WatchdogSec=``) is the longest systemd waits
between two ``WATCHDOG=1``; ``$WATCHDOG_PID``, when set, names the process
the watchdog is meant for (a process that is not it must not ping).

No library: the protocol is one ``sendto`` per message. The candidates are
``sdnotify`` (pure Python, last released 2017, swallows every error),
``systemd-python`` and ``cysystemd`` (C extensions needing libsystemd's
headers at build time): a dependency each, for the twenty lines below.

Without ``$NOTIFY_SOCKET`` every method does nothing, and a failing send is
logged once and never raised: a daemon must not die because its service
manager went away.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping, MutableMapping
from typing import Final

import structlog

__all__ = [
    "NOTIFY_ENV",
    "Notifier",
    "notify_address",
    "status_line",
    "watchdog_interval",
]

log = structlog.get_logger("llamad.notify")

NOTIFY_ENV: Final = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")
"""What systemd passes the main process for notification, and what children
must not inherit (they would report as if they were the service)."""

_STATUS_MAX: Final = 1024  # systemd keeps a STATUS= line; a longer one says nothing more


def notify_address(value: str) -> str:
    """The socket address of a ``$NOTIFY_SOCKET`` value: an absolute path, or
    ``@name`` for the abstract namespace (a leading NUL). Raises ``ValueError``
    for anything else (systemd >= 254 also offers ``vsock:``, for VMs; not here)."""
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    raise ValueError(f"NOTIFY_SOCKET={value!r} is neither an absolute path nor @abstract")


def watchdog_interval(env: Mapping[str, str], pid: int) -> float | None:
    """Seconds between two ``WATCHDOG=1``: half of ``$WATCHDOG_USEC`` (as
    ``sd_watchdog_enabled(3)`` advises), or ``None`` when there is no watchdog
    for process ``pid``."""
    raw = env.get("WATCHDOG_USEC")
    if not raw:
        return None
    owner = env.get("WATCHDOG_PID")
    try:
        usec = int(raw)
        if owner and int(owner) != pid:
            return None
    except ValueError:
        log.warning("notify.bad_watchdog_env", watchdog_usec=raw, watchdog_pid=owner)
        return None
    return usec / 2_000_000 if usec > 0 else None


class Notifier:
    """This process's line to systemd; every method is a no-op without one.

    Thread-safe: the daemon reports readiness and status from one thread and
    pings the watchdog from its supervisor loop.
    """

    def __init__(self, address: str | None, *, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s if address is not None else None
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failed = False
        if address is not None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            # A full socket buffer means systemd is behind: drop the message
            # rather than block a supervisor loop on it.
            self._sock.setblocking(False)

    @classmethod
    def from_environ(cls, env: MutableMapping[str, str] | None = None) -> Notifier:
        """The notifier systemd's environment describes, taking the variables
        out of ``env`` (default ``os.environ``) so that no child inherits them."""
        env = os.environ if env is None else env
        raw = env.get("NOTIFY_SOCKET")
        interval = watchdog_interval(env, os.getpid())
        for name in NOTIFY_ENV:
            env.pop(name, None)
        if not raw:
            return cls(None)
        try:
            address = notify_address(raw)
        except ValueError as exc:
            log.warning("notify.unusable_socket", error=str(exc))
            return cls(None)
        return cls(address, watchdog_s=interval)

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, *assignments: str) -> bool:
        """Send ``KEY=VALUE`` lines as one datagram; whether it went out."""
        if self._sock is None or self.address is None or not assignments:
            return False
        data = "\n".join(assignments).encode("utf-8", "replace")
        with self._lock:
            try:
                self._sock.sendto(data, self.address)
            except OSError as exc:
                if not self._failed:  # once: a gone manager would flood the log
                    log.warning("notify.send_failed", address=self.address, error=str(exc))
                self._failed = True
                return False
            self._failed = False
        return True

    def ready(self, status: str) -> bool:
        return self.send("READY=1", status_line(status))

    def status(self, status: str) -> bool:
        return self.send(status_line(status))

    def stopping(self, status: str) -> bool:
        return self.send("STOPPING=1", status_line(status))

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def extend_timeout(self, seconds: float) -> bool:
        """Ask for ``seconds`` more from now before the start (or stop) times out."""
        return self.send(f"EXTEND_TIMEOUT_USEC={max(1, round(seconds * 1_000_000))}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                with contextlib.suppress(OSError):
                    self._sock.close()
                self._sock = None


def status_line(text: str) -> str:
    """``STATUS=text`` on one line (a newline would start another assignment)."""
    flat = " ".join(text.split())
    return "STATUS=" + flat[:_STATUS_MAX]
