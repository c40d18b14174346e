"""A fake systemd: a real ``AF_UNIX`` datagram socket a daemon reports to.

It binds the socket a ``$NOTIFY_SOCKET`` value names (an abstract ``@name``
or a path), asks the kernel for each sender's credentials (``SO_PASSCRED``,
as systemd does, so a test can check that only the root process reports:
the unit's ``NotifyAccess=main``), and keeps every datagram with when it
came.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Notice:
    """One datagram: its ``KEY=VALUE`` lines, when it came, who sent it."""

    at: float  # time.monotonic()
    wall: float  # time.time()
    pid: int | None
    fields: dict[str, str]

    def has(self, key: str) -> bool:
        return key in self.fields


class NotifyListener:
    """``kind`` is ``"abstract"`` or ``"path"`` (under ``base``)."""

    def __init__(self, kind: str, base: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.settimeout(0.1)
        if kind == "abstract":
            name = f"llamad-test-notify-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.env_value = "@" + name
        elif kind == "path":
            path = base / "notify.sock"
            self.sock.bind(str(path))
            self.env_value = str(path)
        else:
            raise ValueError(kind)
        self.notices: list[Notice] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        space = socket.CMSG_SPACE(struct.calcsize("3i"))
        while not self._stop.is_set():
            try:
                data, ancillary, _, _ = self.sock.recvmsg(65536, space)
            except TimeoutError:
                continue
            except OSError:
                return
            pid = None
            for level, kind, cdata in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    pid = struct.unpack("3i", cdata[: struct.calcsize("3i")])[0]
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            with self._lock:
                self.notices.append(Notice(time.monotonic(), time.time(), pid, fields))

    def all(self) -> list[Notice]:
        with self._lock:
            return list(self.notices)

    def with_key(self, key: str, since: float = 0.0) -> list[Notice]:
        return [n for n in self.all() if n.has(key) and n.at >= since]

    def statuses(self, since: float = 0.0) -> list[str]:
        return [n.fields["STATUS"] for n in self.with_key("STATUS", since)]

    def wait_for(self, predicate, what: str, timeout: float) -> Notice:  # type: ignore[no-untyped-def]
        """The first notice (oldest first) matching ``predicate``, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for n in self.all():
                if predicate(n):
                    return n
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no notice {what} within {timeout}s; got {[n.fields for n in self.all()][-8:]}"
                )
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()
