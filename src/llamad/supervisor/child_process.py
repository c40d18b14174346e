"""Child OS processes: spawn with exec semantics, signal, watch, reap.

:class:`ChildHandle` is what a supervisor watches any child through: an fd
that turns readable when the child ends, and the status pipe it reports
ready and heartbeats on. :class:`ChildProcess` is the common case, an OS
process; :class:`~llamad.supervisor.hosted.HostedChild` a supervisor run on
a thread of this process.

Each child is ``python -m llamad.supervisor.run_child`` started by
``subprocess.Popen`` (fork+exec in C with nothing run in between, so safe from
a threaded parent) in its own process group, so a terminal's Ctrl-C reaches
only the root supervisor, which then stops the tree in order. We hold a
*pidfd* per child: it becomes readable when the child exits (so exits wake the
same ``epoll`` loop as everything else, with no SIGCHLD handler and no
polling), and signals go through it, so a recycled pid can never be hit.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum

import msgpack

from llamad.supervisor.child import HEARTBEAT, READY
from llamad.supervisor.spec import BRUTAL_KILL, INFINITY, ChildSpec, Shutdown

__all__ = ["ChildHandle", "ChildProcess", "Interrupt", "ReadyOutcome", "shutdown_processes"]

Tick = Callable[[], None]


class ReadyOutcome(StrEnum):
    READY = "ready"
    EXITED = "exited"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"


@dataclass(frozen=True)
class Interrupt:
    """An fd that wakes a blocking wait, and the check of whether to give up.

    ``check`` runs when ``fd`` is readable; it must drain ``fd`` and return
    True to abandon the wait (e.g. the supervisor was asked to stop while a
    child was loading a model).
    """

    fd: int
    check: Callable[[], bool]


class ChildHandle(ABC):
    """One running child and the two fds we watch it through.

    ``pidfd`` turns readable once the child has ended (then :meth:`reap`
    returns its status); ``status_fd`` is the read end of its status pipe.
    The object owns both from construction until :meth:`close`; whoever
    drops a handle (the supervisor, after the exit is reaped, on every path)
    must close it.
    """

    def __init__(self, spec: ChildSpec, pid: int, pidfd: int, status_fd: int) -> None:
        self.spec = spec
        self.pid = pid
        self.pidfd = pidfd
        self.status_fd: int | None = status_fd
        self.ready = False
        self.last_beat = time.monotonic()
        #: Why *we* SIGKILLed it, if we did: ``hung``, ``shutdown_timeout``, ``start_timeout``.
        self.killed_for: str | None = None

    @abstractmethod
    def send(self, sig: signal.Signals) -> None:
        """Deliver ``sig`` (no effect once the child is gone)."""

    @property
    @abstractmethod
    def returncode(self) -> int | None:
        """The exit status once reaped, as ``Popen.returncode`` has it."""

    @abstractmethod
    def reap(self) -> int | None:
        """Collect the exit status if the child has ended (never blocks)."""

    def close(self) -> None:
        """Release our fds (after the child is reaped)."""
        self.close_status()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1

    # ----------------------------------------------------------------- status

    def read_status(self) -> bool:
        """Drain the status pipe; ``False`` once the child closed it (then
        stop watching the fd and call :meth:`close_status`)."""
        if self.status_fd is None:
            return False
        while True:
            try:
                data = os.read(self.status_fd, 4096)
            except BlockingIOError:
                return True
            if not data:
                return False
            now = time.monotonic()
            if READY in data:
                self.ready = True
            if READY in data or HEARTBEAT in data:
                self.last_beat = now

    def wait_ready(
        self,
        timeout: float | None,
        tick: Tick | None = None,
        tick_every: float | None = None,
        interrupt: Interrupt | None = None,
    ) -> ReadyOutcome:
        """Block until the child reports ready, exits, ``timeout`` passes or
        ``interrupt`` says to give up."""
        deadline = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        if self.status_fd is not None:
            poller.register(self.status_fd, select.POLLIN)
        poller.register(self.pidfd, select.POLLIN)
        if interrupt is not None:
            poller.register(interrupt.fd, select.POLLIN)
        while True:
            events = poller.poll(_slice_ms(deadline, tick_every))
            for fd, _ in events:
                if fd == self.status_fd and not self.read_status():
                    poller.unregister(fd)
                    self.close_status()
                elif interrupt is not None and fd == interrupt.fd and interrupt.check():
                    return ReadyOutcome.INTERRUPTED
            # Ready wins over exit: a child may report ready and exit at once,
            # and that is a started child that then exited, not a failed start.
            if self.ready:
                return ReadyOutcome.READY
            if any(fd == self.pidfd for fd, _ in events):
                self.reap()
                return ReadyOutcome.EXITED
            if deadline is not None and time.monotonic() >= deadline:
                return ReadyOutcome.TIMEOUT
            if tick is not None:
                tick()

    # ---------------------------------------------------------------- signals

    def kill(self, why: str) -> None:
        """SIGKILL, remembering why (for the exit log)."""
        if self.killed_for is None:
            self.killed_for = why
        self.send(signal.SIGKILL)

    # ------------------------------------------------------------------ exit

    def wait(
        self, timeout: float | None, tick: Tick | None = None, tick_every: float | None = None
    ) -> int | None:
        """Block until exit (reaped) or ``timeout``; the exit status or ``None``."""
        _wait_exits(
            [self], None if timeout is None else time.monotonic() + timeout, tick, tick_every
        )
        return self.reap()

    def close_status(self) -> None:
        if self.status_fd is not None:
            os.close(self.status_fd)
            self.status_fd = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.spec.id!r}, pid={self.pid}, rc={self.returncode})"


class ChildProcess(ChildHandle):
    """A child OS process, watched through its pidfd."""

    def __init__(self, spec: ChildSpec, popen: subprocess.Popen[bytes], status_fd: int) -> None:
        super().__init__(spec, popen.pid, os.pidfd_open(popen.pid), status_fd)
        self._popen = popen

    @classmethod
    def spawn(cls, spec: ChildSpec, *, supervisor: str) -> ChildProcess:
        """Exec a child runner for ``spec`` and hand it its boot record."""
        boot = msgpack.packb(
            {
                "target": spec.start.target,
                "args": list(spec.start.args),
                "kwargs": dict(spec.start.kwargs),
                "liveness_timeout": spec.liveness_timeout,
            },
            use_bin_type=True,
        )
        boot_r, boot_w = os.pipe()
        status_r, status_w = os.pipe()
        argv = [
            sys.executable,
            "-m",
            "llamad.supervisor.run_child",
            "--sup",
            supervisor,
            "--id",
            spec.id,
            "--parent",
            str(os.getpid()),
            "--boot-fd",
            str(boot_r),
            "--status-fd",
            str(status_w),
        ]
        try:
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                pass_fds=(boot_r, status_w),
                close_fds=True,
                process_group=0,
                # Read at spawn, not at spec time: the child sees the
                # supervisor's environment as it is now, plus its own.
                env={**os.environ, **spec.env} if spec.env else None,
                cwd=spec.cwd,
            )
        except BaseException:
            for fd in (boot_w, status_r):
                os.close(fd)
            raise
        finally:
            os.close(boot_r)
            os.close(status_w)
        try:
            proc = cls(spec, popen, status_r)
        except BaseException:
            # No pidfd (EMFILE, most likely): a child we cannot watch must not
            # run on unsupervised, and its pipes must not outlive it.
            popen.kill()
            popen.wait()
            for fd in (boot_w, status_r):
                os.close(fd)
            raise
        os.set_blocking(status_r, False)
        try:
            view = memoryview(boot)
            while view:
                view = view[os.write(boot_w, view) :]
        except BrokenPipeError:
            pass  # it died before reading; wait_ready() reports the exit
        finally:
            os.close(boot_w)
        return proc

    def send(self, sig: signal.Signals) -> None:
        """Signal the child through its pidfd (no effect once it is gone)."""
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, sig)

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def reap(self) -> int | None:
        return self._popen.poll()


def _slice_ms(deadline: float | None, tick_every: float | None) -> int | None:
    """Milliseconds to wait in one poll: until the deadline, capped by the tick period."""
    waits = []
    if deadline is not None:
        waits.append(max(0.0, deadline - time.monotonic()))
    if tick_every is not None:
        waits.append(tick_every)
    if not waits:
        return None
    return max(0, int(min(waits) * 1000) + 1)


def _wait_exits(
    procs: Sequence[ChildHandle],
    deadline: float | None,
    tick: Tick | None,
    tick_every: float | None,
) -> None:
    """Wait until every process in ``procs`` has exited and been reaped, or the deadline."""
    pending = {p.pidfd: p for p in procs if p.reap() is None}
    poller = select.poll()
    for fd in pending:
        poller.register(fd, select.POLLIN)
    while pending:
        for fd, _ in poller.poll(_slice_ms(deadline, tick_every)):
            proc = pending.pop(fd, None)
            if proc is not None:
                poller.unregister(fd)
                proc.reap()
        if deadline is not None and time.monotonic() >= deadline:
            return
        if tick is not None:
            tick()


def shutdown_processes(
    procs: Sequence[ChildHandle],
    policy: Shutdown,
    tick: Tick | None = None,
    tick_every: float | None = None,
) -> None:
    """OTP's shutdown for a set of children, all at once.

    ``brutal_kill``: SIGKILL now. Seconds: SIGTERM, wait that long, SIGKILL
    whatever is left. ``infinity``: SIGTERM and wait for as long as it takes
    (a child that ignores SIGTERM then blocks its supervisor forever; use it
    for supervisor children, which bound their own subtree's shutdown). Every
    process is reaped before this returns (except under ``infinity`` never).
    """
    live = [p for p in procs if p.reap() is None]
    if not live:
        return
    if policy == BRUTAL_KILL:
        for p in live:
            p.send(signal.SIGKILL)
        _wait_exits(live, None, tick, tick_every)
        return
    for p in live:
        p.send(signal.SIGTERM)
    deadline = None if policy == INFINITY else time.monotonic() + float(policy)
    _wait_exits(live, deadline, tick, tick_every)
    stubborn = [p for p in live if p.reap() is None]
    for p in stubborn:
        p.kill("shutdown_timeout")
    _wait_exits(stubborn, None, tick, tick_every)
