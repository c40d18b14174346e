"""Restart intensity: OTP's sliding window of recent restarts.

OTP keeps the times of past restarts, drops those older than ``period``
(a restart exactly ``period`` ago still counts), adds the new one, and gives
up when more than ``intensity`` remain. We do the same on float seconds of
``time.monotonic()`` instead of whole seconds, so a wall-clock jump can neither
trigger nor hide an escalation.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartVerdict:
    """The outcome of recording one restart."""

    allowed: bool
    #: Restarts in the window including this one (the number OTP compares).
    restarts_in_window: int


class RestartIntensity:
    """One supervisor's restart window; feed it restart times, it says when to give up."""

    def __init__(self, intensity: int, period: float) -> None:
        if intensity < 0 or period <= 0:
            raise ValueError("intensity must be >= 0 and period > 0")
        self.intensity = intensity
        self.period = period
        self._times: deque[float] = deque()

    def record(self, now: float) -> RestartVerdict:
        """Count a restart at ``now``; ``allowed`` is false when the supervisor must escalate.

        ``now`` never decreases (it comes from ``time.monotonic()``).
        """
        while self._times and now - self._times[0] > self.period:
            self._times.popleft()
        self._times.append(now)
        count = len(self._times)
        return RestartVerdict(allowed=count <= self.intensity, restarts_in_window=count)

    def in_window(self, now: float) -> int:
        """How many recorded restarts still count at ``now`` (for logs and status)."""
        return sum(1 for t in self._times if now - t <= self.period)
