"""A supervisor child hosted on a thread of its parent's process (``ChildSpec.hosted``).

A supervisor owns no state that a crash must not take down: its children are
processes that keep their own state, and its bookkeeping is rebuilt by
starting them again. An interpreter of its own (30+ MB of RSS for the
python, pyzmq, msgspec and structlog floor) buys it nothing, so the daemon's
``cache_sup`` and ``model_sup`` run as threads of the root (SPEC P9).

The parent watches a hosted child exactly as it watches a process
(:class:`~llamad.supervisor.child_process.ChildHandle`):

- **its end** is a pipe that the hosting thread writes once its supervisor
  has stopped every child of its own; the exit status is the supervisor's
  exit code (0, ``EXIT_ESCALATED``, ...), ``EXIT_CRASHED`` when its loop
  raised, or ``-SIGKILL`` after a kill, so OTP's exit reasons come out as
  they would for a process;
- **ready and heartbeats** come on a status pipe, written by the hosted
  supervisor's loop (:class:`PipeBeat`), so a loop that stops turning is
  seen silent like a hung process;
- **SIGTERM** asks it to stop its children in order and end; **SIGKILL**
  asks it to kill its children at once and end. A thread cannot be killed:
  if a hosted loop does not end within :data:`KILL_GRACE_S` of a kill (it is
  wedged, the only way it would not), the whole process exits with
  ``EXIT_CRASHED``. Every child process of the tree then dies by its
  parent-death signal and the service manager starts the daemon again; a
  hung supervisor is never left running unseen.

Its ``pid`` is the hosting thread's kernel id: unique in the system while it
runs, different from the process's pid, and shown by ``llamad status`` where
a process's pid would be. ``PR_SET_PDEATHSIG`` follows the *thread* that
spawned a child, so the hosted supervisor's workers die with its thread, as
they would with its process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Final, Protocol

import structlog

from llamad.supervisor.child import HEARTBEAT, READY, beat_interval, write_status
from llamad.supervisor.child_process import ChildHandle
from llamad.supervisor.exits import EXIT_CRASHED
from llamad.supervisor.spec import ChildSpec

__all__ = ["KILL_GRACE_S", "HostedBody", "HostedChild", "PipeBeat"]

log = structlog.get_logger("llamad.supervisor")

KILL_GRACE_S: Final = 10.0
"""How long a killed hosted supervisor may take to kill its children and end
before the process gives up on it (its children's SIGKILL and reaping take
milliseconds; only a wedged loop needs longer)."""


class HostedBody(Protocol):
    """What runs on the hosting thread: a supervisor and what it serves."""

    def run(self, ready: Callable[[], None]) -> int:
        """Start, call ``ready`` once every initial child runs, supervise; the exit code."""
        ...

    def request_stop(self) -> None:
        """Stop every child in order, then end (any thread)."""
        ...

    def request_kill(self) -> None:
        """Kill every child at once, then end (any thread)."""
        ...


class PipeBeat:
    """A hosted supervisor's heartbeat: a byte on its status pipe, as often as
    :func:`llamad.supervisor.child.heartbeat` writes one for a process."""

    def __init__(self, fd: int, liveness_timeout: float | None) -> None:
        self._fd = fd
        self._interval = None if liveness_timeout is None else beat_interval(liveness_timeout)
        self._last = 0.0

    def interval(self) -> float | None:
        return self._interval

    def beat(self, sup: object) -> None:
        if self._interval is None:
            return
        now = time.monotonic()
        if now - self._last < self._interval:
            return
        self._last = now
        write_status(self._fd, HEARTBEAT)


class HostedChild(ChildHandle):
    """A hosted supervisor child, watched like a process (see the module doc)."""

    def __init__(
        self,
        spec: ChildSpec,
        make_body: Callable[[PipeBeat], HostedBody],
        *,
        on_wedged: Callable[[], None] | None = None,
    ) -> None:
        status_r, status_w = os.pipe()
        end_r, end_w = os.pipe()
        os.set_blocking(status_r, False)
        os.set_blocking(status_w, False)
        self._status_w = status_w
        self._end_w = end_w
        self._code: int | None = None
        self._killed = False
        self._on_wedged = on_wedged if on_wedged is not None else _exit_process
        try:
            self._body = make_body(PipeBeat(status_w, spec.liveness_timeout))
            self._thread = threading.Thread(
                target=self._host, name=f"hosted-{spec.id}", daemon=True
            )
            self._thread.start()
        except BaseException:
            for fd in (status_r, status_w, end_r, end_w):
                os.close(fd)
            raise
        assert self._thread.native_id is not None
        super().__init__(spec, self._thread.native_id, end_r, status_r)

    @classmethod
    def spawn(cls, spec: ChildSpec, make_body: Callable[[PipeBeat], HostedBody]) -> HostedChild:
        return cls(spec, make_body)

    def _host(self) -> None:
        code = EXIT_CRASHED
        try:
            code = self._body.run(lambda: write_status(self._status_w, READY))
        except BaseException:
            # The supervisor logged it (sup.crashed); its exit status says it.
            code = EXIT_CRASHED
        finally:
            # The order is the contract: the status is set before the end is
            # readable, and the status pipe closes like a process's would.
            self._code = -signal.SIGKILL if self._killed else code
            os.close(self._status_w)
            with contextlib.suppress(OSError):
                os.write(self._end_w, b"\0")
            os.close(self._end_w)

    # ---------------------------------------------------------------- signals

    def send(self, sig: signal.Signals) -> None:
        if self._code is not None:
            return
        if sig == signal.SIGKILL:
            self._killed = True
            self._body.request_kill()
            timer = threading.Timer(KILL_GRACE_S, self._check_ended)
            timer.daemon = True
            timer.start()
        elif sig in (signal.SIGTERM, signal.SIGINT):
            self._body.request_stop()
        # Other signals (SIGSTOP, SIGCONT, ...) have no meaning for a thread.

    def _check_ended(self) -> None:
        if self._thread.is_alive():
            log.critical(
                "sup.hosted_wedged",
                child=self.spec.id,
                tid=self.pid,
                grace_s=KILL_GRACE_S,
                action="exit the process: every child dies by its parent-death signal",
            )
            self._on_wedged()

    # ------------------------------------------------------------------- exit

    @property
    def returncode(self) -> int | None:
        return self._code

    def reap(self) -> int | None:
        if self._code is None:
            return None
        # The end byte is written after the status is set, the thread's last
        # acts; join so that a reaped child is a thread that is gone.
        self._thread.join()
        return self._code


def _exit_process() -> None:
    os._exit(EXIT_CRASHED)
