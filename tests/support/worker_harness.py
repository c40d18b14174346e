"""Building and driving a WorkerCore on the stub backend and the in-memory cache."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llamad.cache.policy import CachePolicy
from llamad.model.config import WorkerConfig
from llamad.model.core import TickReport, WorkerCore
from llamad.model.requests import RequestParams
from llamad.model.results import Completion, DoneEvent, ErrorEvent, Event
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache

GREEDY = {"temperature": 0.0}

# Small numbers so a test's prompts cross every save boundary in a few ticks.
SMALL_POLICY = CachePolicy(
    min_tokens=8,
    cold_min_tokens=8,
    cold_max_tokens=10_000,
    continued_interval=16,
    boundary_trim_tokens=2,
    boundary_align_tokens=8,
    session_resume_wait_ms=500,
    evict_save_timeout_ms=1_000,
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class Harness:
    core: WorkerCore
    backend: StubBackend
    cache: MemoryCache
    clock: Clock
    events: dict[str, list[Event]] = field(default_factory=lambda: defaultdict(list))
    reports: list[TickReport] = field(default_factory=list)

    def submit(self, rid: str, tokens: Sequence[int], **params: Any) -> int | None:
        merged = {**GREEDY, **params}
        return self.core.submit(rid, tokens, RequestParams(**merged))

    def _take(self, report: TickReport) -> TickReport:
        self.reports.append(report)
        for rid, ev in report.events:
            self.events[rid].append(ev)
        return report

    def step(self) -> TickReport:
        # Every tick takes a millisecond of the injected clock, so stats and
        # admission times order as the ticks did.
        self.clock.advance(0.001)
        return self._take(self.core.step())

    def drain(self) -> TickReport:
        return self._take(self.core.drain())

    def run(self, max_ticks: int = 10_000) -> None:
        """Step until no request is left."""
        for _ in range(max_ticks):
            if not self.core.requests:
                self.drain()
                return
            self.step()
        raise AssertionError(f"requests still running after {max_ticks} ticks")

    def result(self, rid: str) -> Completion:
        last = self.events[rid][-1]
        assert isinstance(last, DoneEvent), last
        return last.result

    def error(self, rid: str) -> ErrorEvent:
        last = self.events[rid][-1]
        assert isinstance(last, ErrorEvent), last
        return last

    def complete(self, rid: str, tokens: Sequence[int], **params: Any) -> Completion:
        self.submit(rid, tokens, **params)
        self.run()
        return self.result(rid)


def make(
    *,
    n_ctx: int = 1024,
    n_batch: int = 64,
    n_seq_max: int = 2,
    max_queue: int = 8,
    chunk: int | None = 16,
    strategy: str = "decode_maximal",
    policy: CachePolicy = SMALL_POLICY,
    cache: MemoryCache | None = None,
    backend: StubBackend | None = None,
    clock: Clock | None = None,
    **config: Any,
) -> Harness:
    clock = clock or Clock()
    backend = backend or StubBackend(n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max)
    cache = cache or MemoryCache()
    cfg = WorkerConfig(
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_seq_max=n_seq_max,
        max_queue=max_queue,
        prefill_chunk_size=chunk,
        strategy=strategy,
        policy=policy,
        **config,
    )
    return Harness(WorkerCore(cfg, backend, cache, clock=clock), backend, cache, clock)


def prompt(n: int, start: int = 1) -> list[int]:
    """``n`` distinct-looking tokens (ids stay inside the stub's 256-token vocabulary)."""
    return [(start + 7 * i) % 250 + 1 for i in range(n)]
