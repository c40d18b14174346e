"""Process monitors: learn that another process died, promptly and race-free.

A :class:`ProcessRef` names one incarnation of a process: its pid plus its
start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), so a
recycled pid is never mistaken for the process we meant. ``boot_id`` and the
pid-namespace inode tell whether a ref is meaningful on this side at all.

A :class:`ProcessWatch` watches many refs. On Linux ≥ 5.3 each watch is a
pidfd (``os.pidfd_open``), which becomes readable the moment the process
exits (zombie or not), so a poll loop that includes :meth:`ProcessWatch.fds`
wakes at once and no periodic polling is needed. Where pidfds are refused
(old kernels, seccomp), the watch falls back to checking ``/proc`` every
:attr:`ProcessWatch.fallback_interval` seconds; owners cap their poll timeout
with :meth:`ProcessWatch.poll_interval`.

Why pidfds rather than ZeroMQ socket-monitor events: a disconnect is not a
death (the peer may reconnect, and ZeroMQ reconnects transparently), while a
readable pidfd is a fact about the process, costs one fd and no thread, and
also works for processes we are not connected to (a supervisor's children,
the owner of a cache pin).
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

__all__ = ["ProcessRef", "ProcessWatch", "boot_id", "pid_namespace", "start_ticks"]


@cache
def boot_id() -> str:
    """This machine's boot id ("" if unreadable)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def pid_namespace() -> int:
    """Inode of this process's pid namespace (0 if unreadable)."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def start_ticks(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or ``None`` if it is gone
    (or a zombie: an exited process is dead to us even before it is reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = stat[stat.rfind(b")") + 2 :].split()
    if len(rest) < 20 or rest[0] in (b"Z", b"X"):
        return None
    return int(rest[19])


@dataclass(frozen=True, slots=True)
class ProcessRef:
    """One incarnation of a process, comparable across processes."""

    pid: int
    start_ticks: int
    boot_id: str = ""
    pidns: int = 0

    @classmethod
    def current(cls) -> ProcessRef:
        """The calling process."""
        pid = os.getpid()
        return cls(pid, start_ticks(pid) or 0, boot_id(), pid_namespace())

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        """A ref to a live local process, or ``None`` if ``pid`` is not running."""
        ticks = start_ticks(pid)
        if ticks is None:
            return None
        return cls(pid, ticks, boot_id(), pid_namespace())

    def is_local(self) -> bool:
        """Whether ``pid`` means the same process here (same boot, same pid namespace)."""
        return bool(self.boot_id) and self.boot_id == boot_id() and self.pidns == pid_namespace()

    def alive(self) -> bool:
        """Whether this incarnation still runs (always ``False`` for a non-local ref)."""
        return self.is_local() and start_ticks(self.pid) == self.start_ticks


class _Watch:
    __slots__ = ("fd", "ref")

    def __init__(self, ref: ProcessRef, fd: int | None) -> None:
        self.ref = ref
        self.fd = fd


class ProcessWatch:
    """Watches local processes and reports each one's exit exactly once.

    Not thread-safe: owned by one loop. Call :meth:`close` to release fds.
    """

    fallback_interval: float = 0.05

    def __init__(self) -> None:
        self._by_pid: dict[int, _Watch] = {}
        self._by_fd: dict[int, _Watch] = {}
        self._polled: dict[int, _Watch] = {}
        self._select: select.poll | None = None

    def __len__(self) -> int:
        return len(self._by_pid)

    def __contains__(self, ref: object) -> bool:
        return isinstance(ref, ProcessRef) and (
            (w := self._by_pid.get(ref.pid)) is not None and w.ref == ref
        )

    def watch(self, ref: ProcessRef) -> bool:
        """Start watching ``ref``; ``False`` if it is already dead or not local.

        Watching the same ref twice is a no-op. A different incarnation under
        the same pid replaces the old watch (the old one is necessarily dead).
        """
        if not ref.is_local():
            return False
        current = self._by_pid.get(ref.pid)
        if current is not None:
            if current.ref == ref:
                return True
            self._drop(current)
        try:
            fd: int | None = os.pidfd_open(ref.pid)
        except ProcessLookupError:
            return False
        except OSError:
            fd = None
        # The pid may have been recycled before pidfd_open: check the
        # incarnation *after* holding the fd, which pins the pid.
        if start_ticks(ref.pid) != ref.start_ticks:
            if fd is not None:
                os.close(fd)
            return False
        w = _Watch(ref, fd)
        self._by_pid[ref.pid] = w
        if fd is None:
            self._polled[ref.pid] = w
        else:
            self._by_fd[fd] = w
            self._select = None
        return True

    def unwatch(self, ref: ProcessRef) -> None:
        """Stop watching ``ref`` (no-op if not watched)."""
        w = self._by_pid.get(ref.pid)
        if w is not None and w.ref == ref:
            self._drop(w)

    def fds(self) -> list[int]:
        """Descriptors to include in the owner's poll set (readable = exited)."""
        return list(self._by_fd)

    def poll_interval(self) -> float | None:
        """The longest the owner may sleep, or ``None`` when every watch has a fd."""
        return self.fallback_interval if self._polled else None

    def exited(self, ready: Iterable[int] | None = None) -> list[ProcessRef]:
        """Refs found dead since the last call; each is reported once, then dropped.

        ``ready`` are fds the owner's poll found readable; ``None`` checks
        every watched fd without blocking.
        """
        dead: list[ProcessRef] = []
        if ready is None:
            if self._select is None:
                self._select = select.poll()
                for fd in self._by_fd:
                    self._select.register(fd, select.POLLIN)
            fds = [fd for fd, _ in self._select.poll(0)] if self._by_fd else []
        else:
            fds = [fd for fd in ready if fd in self._by_fd]
        for fd in fds:
            w = self._by_fd[fd]
            dead.append(w.ref)
            self._drop(w)
        for w in list(self._polled.values()):
            if start_ticks(w.ref.pid) != w.ref.start_ticks:
                dead.append(w.ref)
                self._drop(w)
        return dead

    def wait(self, timeout: float | None) -> list[ProcessRef]:
        """Block until a watched process exits or ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            dead = self.exited()
            if dead:
                return dead
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return []
            interval = self.poll_interval()
            step = left if interval is None else min(interval, left or interval)
            poller = select.poll()
            for fd in self._by_fd:
                poller.register(fd, select.POLLIN)
            poller.poll(None if step is None else max(0, int(step * 1000)) + 1)

    def close(self) -> None:
        """Release every fd; the watch is empty afterwards."""
        for w in list(self._by_pid.values()):
            self._drop(w)

    def _drop(self, w: _Watch) -> None:
        self._by_pid.pop(w.ref.pid, None)
        self._polled.pop(w.ref.pid, None)
        if w.fd is not None:
            self._by_fd.pop(w.fd, None)
            self._select = None
            os.close(w.fd)
            w.fd = None
