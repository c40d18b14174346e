"""The worker's heartbeat, silenced by a hung tick (SPEC M15).

The supervisor kills a child whose heartbeat stays silent longer than its
``liveness_timeout``; a model worker must also be killed when one tick (a
``llama_decode`` stuck inside llama.cpp, a save that never returns) runs
longer than ``decode_timeout_ms``, although the process is alive.

The loop marks each busy section (a tick, an op handler) on a
:class:`BusyMark`. A :class:`HeartbeatThread` beats for the worker every
heartbeat interval **unless** the section in progress has run longer than
``decode_timeout_ms``; then it stops beating and the supervisor, after at
most its liveness window, SIGKILLs the worker and restarts it. In-flight
clients get ``worker_crashed`` from their pidfd watch; published rows are
untouched (a row is published only after it is fully written).

A thread rather than beating from the loop: the loop may then block on its
socket for as long as it likes when idle, the timeout is measured from the
start of the tick itself (not from the loop's last beat), and a stopped
process (SIGSTOP) or a GIL held forever inside a C call silences it too.
llama.cpp releases the GIL around ``llama_decode``, so the thread runs
while a healthy tick decodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import structlog

__all__ = ["BusyMark", "HeartbeatThread"]

log = structlog.get_logger("llamad.model")


class BusyMark:
    """When the loop's current busy section began (``None``: idle or between).

    Written only by the loop thread; the heartbeat thread reads one attribute,
    which is atomic under the GIL.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since: float | None = None

    @contextmanager
    def busy(self) -> Iterator[None]:
        outer = self.since is not None
        if not outer:
            self.since = self.clock()
        try:
            yield
        finally:
            if not outer:
                self.since = None

    def overdue(self, now: float, timeout_s: float) -> float | None:
        """How long the section in progress has run, if longer than ``timeout_s``."""
        since = self.since
        if since is None:
            return None
        ran = now - since
        return ran if ran > timeout_s else None


class HeartbeatThread:
    """Beats through ``beat`` every ``interval_s`` while no section is overdue."""

    def __init__(
        self,
        mark: BusyMark,
        *,
        timeout_s: float,
        interval_s: float,
        beat: Callable[[], None],
    ) -> None:
        self.mark = mark
        self.timeout_s = timeout_s
        self.interval_s = interval_s
        self.beat = beat
        self.silenced = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def check(self) -> bool:
        """One beat, unless the loop is (or once was) overdue; whether it beat.

        Silence is final: a worker whose tick outlived the timeout is restarted
        even if the tick ends before the supervisor acts, so the outcome does
        not depend on a race with the liveness window.
        """
        ran = self.mark.overdue(self.mark.clock(), self.timeout_s)
        if ran is None and self.silenced == 0:
            self.beat()
            return True
        if self.silenced == 0:
            log.error(
                "model.tick_overdue",
                ran_s=round(ran or 0.0, 3),
                decode_timeout_s=self.timeout_s,
                action="heartbeat silenced; the supervisor will restart the worker",
            )
        self.silenced += 1
        return False

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if now - last > 4 * self.interval_s:
                # This thread itself was not run (a starved machine, a C call
                # holding the GIL, a stopped process): worth knowing when the
                # supervisor reports the worker hung.
                log.warning("model.heartbeat_late", gap_s=round(now - last, 3))
            last = now
            self.check()
