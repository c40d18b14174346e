"""The worker's request metrics: outcome counts and latency histograms (issue 19, item 6).

Counted where the requests are served, on the worker's loop, and published
with its status board (:class:`~llamad.model.wire.WorkerMetrics` inside
:class:`~llamad.model.wire.WorkerSnapshot`), so the front gathers every
worker's numbers by reading files, never by asking a busy worker, and no
process shares a mutable file with another (prometheus_client's multiprocess
mode and its directory races are not needed). Every number only grows for
the life of one worker process; a restarted worker starts again from zero,
which Prometheus reads as a counter reset, as it should.

Histograms have fixed buckets. They are vLLM's (``vllm/v1/metrics/loggers.py``)
with a few finer bounds added below vLLM's smallest where a CPU worker's
numbers live (inter-token gaps of a few milliseconds, requests of tens of
milliseconds): every bound vLLM publishes is kept, so a dashboard that reads a
vLLM ``le`` reads the same one here.

A plain object with no clock of its own: the core hands it the times it
already keeps (:class:`~llamad.model.active.ActiveRequest`), and unit tests
step it by hand.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

from llamad.model.results import CacheHitKind, FinishReason, TokenSources
from llamad.model.wire import LatencyCounts, WorkerMetrics

__all__ = [
    "BUCKETS",
    "E2E_BUCKETS",
    "ITL_BUCKETS",
    "OUTCOMES",
    "QUEUE_BUCKETS",
    "TTFT_BUCKETS",
    "Histogram",
    "RequestMetrics",
]

TTFT_BUCKETS: Final = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
"""Seconds from the request's sending (same host) or arrival to its first token: vLLM's."""

ITL_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.0075,
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
"""Seconds between two tokens of one request: vLLM's, from 1 ms (a small model's
decode step on a CPU is a few ms; vLLM starts at 10)."""

E2E_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.1, 0.2,
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
    40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
"""Seconds from sending (or arrival) to the last event: vLLM's request-latency
buckets, from 10 ms."""

QUEUE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, *E2E_BUCKETS)
"""Seconds from sending (or arrival) to admission to a sequence: vLLM's
request-latency buckets, from 0.5 ms (a request that finds a free sequence
waits only for the tick in progress)."""

BUCKETS: Final[dict[str, tuple[float, ...]]] = {
    "ttft": TTFT_BUCKETS,
    "itl": ITL_BUCKETS,
    "e2e": E2E_BUCKETS,
    "queue": QUEUE_BUCKETS,
}
"""Each histogram of :class:`~llamad.model.wire.WorkerMetrics` by its field name."""

OUTCOMES: Final = ("stop", "length", "cancelled", "error", "refused")
"""How a request ended: its finish reason, ``error`` (failed after it was
admitted), or ``refused`` (answered with an error before it was admitted:
``overloaded``, ``context_overflow``, a bad prompt...)."""


class Histogram:
    """Counts per bucket (``counts[i]``: observations ``<= bounds[i]`` and above
    the bound before; the last: above every bound) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        if list(bounds) != sorted(set(bounds)) or not bounds:
            raise ValueError(f"histogram bounds must be increasing: {bounds!r}")
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # le is "less than or equal": a value on a bound belongs to that bucket.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def snapshot(self) -> LatencyCounts:
        return LatencyCounts(counts=list(self.counts), sum=round(self.sum, 6))


class RequestMetrics:
    """One worker's counts since it started (see the module doc)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.cache_hits: dict[str, int] = {k.value: 0 for k in CacheHitKind}
        self.prompt_tokens: dict[str, int] = dict.fromkeys(TokenSources().as_dict(), 0)
        self.generation_tokens = 0
        self.histograms = {name: Histogram(bounds) for name, bounds in BUCKETS.items()}
        self.changes = 0
        """Counts every change but a token's (a request resolved, finished,
        failed or refused): the worker publishes fresh counts at once when it
        moved, and a token's counts on a slower cadence mid-decode."""

    def resolved(self, kind: CacheHitKind, sources: TokenSources) -> None:
        """A request found its start: how (``kind``) and where its prompt came from."""
        self.changes += 1
        self.cache_hits[kind.value] += 1
        for source, n in sources.as_dict().items():
            self.prompt_tokens[source] += n

    def token(self, submitted_at: float, previous_at: float | None, now: float) -> None:
        """A request sampled a token at ``now``; its previous one at ``previous_at``."""
        self.generation_tokens += 1
        if previous_at is None:
            self.histograms["ttft"].observe(max(0.0, now - submitted_at))
        else:
            self.histograms["itl"].observe(max(0.0, now - previous_at))

    def finished(
        self,
        reason: FinishReason,
        submitted_at: float,
        admitted_at: float | None,
        now: float,
    ) -> None:
        """A request ended ``done`` (cancelled included)."""
        self.changes += 1
        self.outcomes[reason.value] += 1
        self.histograms["e2e"].observe(max(0.0, now - submitted_at))
        self._queued(submitted_at, admitted_at, now)

    def failed(self, submitted_at: float, admitted_at: float | None, now: float) -> None:
        """A request ended ``error`` after it was admitted."""
        self.changes += 1
        self.outcomes["error"] += 1
        self._queued(submitted_at, admitted_at, now)

    def refused(self) -> None:
        """A request was answered with an error before it was admitted."""
        self.changes += 1
        self.outcomes["refused"] += 1

    def _queued(self, submitted_at: float, admitted_at: float | None, now: float) -> None:
        # A request cancelled in the queue waited until it ended.
        end = admitted_at if admitted_at is not None else now
        self.histograms["queue"].observe(max(0.0, end - submitted_at))

    def snapshot(self) -> WorkerMetrics:
        h = self.histograms
        return WorkerMetrics(
            outcomes=dict(self.outcomes),
            cache_hits=dict(self.cache_hits),
            prompt_tokens=dict(self.prompt_tokens),
            generation_tokens=self.generation_tokens,
            ttft=h["ttft"].snapshot(),
            itl=h["itl"].snapshot(),
            e2e=h["e2e"].snapshot(),
            queue=h["queue"].snapshot(),
        )
