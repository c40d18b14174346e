"""How often the worker's loop publishes its status (SPEC M10): before every
decode step that changes what a reader sees, at most every PUBLISH_EVERY_S
while generation steps follow one another unchanged, and always a last
snapshot once they stop.

The loop is stepped by hand over the stub parts; the board records what it is given.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache.policy import CachePolicy
from llamad.llama_ffi import ContextOptions
from llamad.model import worker_proc
from llamad.model.config import WorkerConfig
from llamad.model.requests import RequestParams
from llamad.model.results import WorkerPhase
from llamad.model.wire import WorkerSnapshot
from llamad.model.worker_proc import WorkerProcess
from llamad.model.worker_spec import WorkerSpec

pytestmark = pytest.mark.timeout(60)


class RecordingBoard:
    def __init__(self) -> None:
        self.snapshots: list[WorkerSnapshot] = []

    def publish(self, snapshot: WorkerSnapshot) -> None:
        self.snapshots.append(snapshot)

    def close(self, *, remove: bool = False) -> None:
        pass


def _spec() -> WorkerSpec:
    root = Path(tempfile.mkdtemp(prefix="lwp-", dir="/tmp"))
    return WorkerSpec(
        model_id="stub",
        model_path="/nonexistent/stub.gguf",
        context=ContextOptions(
            n_ctx=256, n_batch=32, n_seq_max=2, n_ubatch=32, kv_unified=True, n_threads=1
        ),
        worker=WorkerConfig(
            n_ctx=256, n_batch=32, n_seq_max=2, max_queue=4, policy=CachePolicy(min_tokens=4)
        ),
        registry_root=str(root),
        parts="stub_worker_parts:stub_parts",
    )


@pytest.fixture
def proc() -> Iterator[WorkerProcess]:
    p = WorkerProcess(_spec())
    p.actor.start()
    try:
        yield p
    finally:
        p.actor.close()
        p.parts.close()


def test_a_step_that_changes_what_readers_see_publishes_before_it_decodes(
    proc: WorkerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the cadence off, every decode step publishes once (the tick's own
    snapshot is left to the next tick's while work remains), and the last
    state is published."""
    monkeypatch.setattr(worker_proc, "PUBLISH_EVERY_S", 0.0)
    board = RecordingBoard()
    proc.board = board  # type: ignore[assignment]
    proc.core.submit("r", [1, 2, 3, 4, 5], RequestParams(max_tokens=6, temperature=0.0))
    decodes = 0
    while proc.core.requests:
        before = len(board.snapshots)
        report = proc.step(0.0)
        published = len(board.snapshots) - before
        if report.batch:
            decodes += 1
            # The pre-decode snapshot; the one after the tick is left to the
            # next tick's while work remains.
            assert published == (1 if proc.core.has_work() else 2)
    assert decodes >= 6
    last = board.snapshots[-1]
    assert last.status.phase is WorkerPhase.IDLE
    assert last.busy_since is None
    assert last.status.pending_len == 0


def test_back_to_back_generation_steps_publish_at_most_every_publish_every_s() -> None:
    """One generation step after another over the same sequences shows readers
    nothing new but counts: the first publishes, the next ones only once
    PUBLISH_EVERY_S has passed; a step that changes what they see (a second
    request arriving) publishes at once, and the last state always goes out."""
    clock = ManualClock()
    proc = WorkerProcess(_spec(), clock=clock)
    proc.actor.start()
    try:
        board = RecordingBoard()
        proc.board = board  # type: ignore[assignment]
        proc.core.submit("r", [1, 2, 3, 4, 5], RequestParams(max_tokens=40, temperature=0.0))
        published: list[int] = []  # snapshots each step published
        for _ in range(12):
            before = len(board.snapshots)
            report = proc.step(0.0)
            assert report.batch and proc.core.has_work()
            published.append(len(board.snapshots) - before)
        # Every step up to the first that shows the request generating
        # publishes (the prefill, and its prompt's last row); the clock stood
        # still, so the generation steps after it leave the board as it was.
        phases = [s.status.phase for s in board.snapshots]
        assert phases[-1] is WorkerPhase.GENERATING
        assert WorkerPhase.GENERATING not in phases[:-1]
        first = len(board.snapshots) - 1
        assert published[:first] == [1] * first and published[first] == 1
        assert len(published[first + 1 :]) >= 8 and set(published[first + 1 :]) == {0}
        assert board.snapshots[-1].busy_since is not None

        clock.now += worker_proc.PUBLISH_EVERY_S
        before = len(board.snapshots)
        proc.step(0.0)
        assert len(board.snapshots) - before == 1  # its time had come
        before = len(board.snapshots)
        proc.step(0.0)
        assert len(board.snapshots) == before  # and the next waits again

        # A message handled by the poll may have changed what a snapshot
        # shows (a session opened, say): the next decode publishes.
        real_poll = proc.actor.poll
        proc.actor.poll = lambda timeout=0.0: 1  # type: ignore[method-assign]
        try:
            before = len(board.snapshots)
            proc.step(0.0)
            assert len(board.snapshots) - before == 1
        finally:
            proc.actor.poll = real_poll  # type: ignore[method-assign]
        before = len(board.snapshots)
        proc.step(0.0)
        assert len(board.snapshots) == before

        # A second request: the step that admits it publishes before it
        # decodes, showing both, however recent the last snapshot.
        proc.core.submit("s", [1, 2, 3, 4, 6], RequestParams(max_tokens=3, temperature=0.0))
        before = len(board.snapshots)
        proc.step(0.0)
        assert len(board.snapshots) - before == 1
        assert board.snapshots[-1].status.pending_len == 2

        while proc.core.requests:
            proc.step(0.0)
        last = board.snapshots[-1]
        assert last.status.phase is WorkerPhase.IDLE
        assert last.busy_since is None
        assert last.status.pending_len == 0
    finally:
        proc.actor.close()
        proc.parts.close()


def test_a_snapshot_left_to_the_next_tick_is_published_even_if_that_tick_is_idle(
    proc: WorkerProcess,
) -> None:
    board = RecordingBoard()
    proc.board = board  # type: ignore[assignment]
    proc.core.submit("r", [1, 2, 3, 4, 5], RequestParams(max_tokens=50, temperature=0.0))
    report = proc.step(0.0)
    assert report.batch and proc.core.has_work()
    during = board.snapshots[-1]
    assert during.busy_since is not None  # taken before the decode
    # The next tick decodes nothing and reports nothing (a drain, as a tick
    # whose requests all wait does): the owed snapshot goes out after it, so
    # the board does not go on showing a decode in progress.
    real_step = proc.core.step
    proc.core.step = proc.core.drain  # type: ignore[method-assign]
    try:
        assert proc.step(0.0).idle
    finally:
        proc.core.step = real_step  # type: ignore[method-assign]
    after = board.snapshots[-1]
    assert after is not during
    assert after.busy_since is None


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_token_counts_go_out_on_a_cadence_mid_decode_and_fresh_once_it_stops(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Mid-decode, a token's counts (generation_tokens, TTFT and inter-token
    histograms) ride along with the last ones taken until METRICS_EVERY_S has
    passed; a request's outcome goes out at once, and the publish after the
    last decode carries every count (what /metrics and counters() read)."""
    from llamad.model.worker_proc import METRICS_EVERY_S  # noqa: PLC0415

    # Every decode step publishes (the snapshot's own cadence is another test's).
    monkeypatch.setattr(worker_proc, "PUBLISH_EVERY_S", 0.0)
    root = Path(tempfile.mkdtemp(prefix="lwp-", dir="/tmp"))
    spec = WorkerSpec(
        model_id="stub",
        model_path="/nonexistent/stub.gguf",
        context=ContextOptions(
            n_ctx=256, n_batch=32, n_seq_max=2, n_ubatch=32, kv_unified=True, n_threads=1
        ),
        worker=WorkerConfig(
            n_ctx=256, n_batch=32, n_seq_max=2, max_queue=4, policy=CachePolicy(min_tokens=4)
        ),
        registry_root=str(root),
        parts="stub_worker_parts:stub_parts",
    )
    clock = ManualClock()
    proc = WorkerProcess(spec, clock=clock)
    proc.actor.start()
    try:
        board = RecordingBoard()
        proc.board = board  # type: ignore[assignment]
        proc.core.submit("r", [1, 2, 3, 4, 5], RequestParams(max_tokens=8, temperature=0.0))
        mid: list[int] = []
        while proc.core.requests:
            before = len(board.snapshots)
            report = proc.step(0.0)
            if report.batch and proc.core.has_work():
                mid += [s.metrics.generation_tokens for s in board.snapshots[before:] if s.metrics]
        # The clock stood still: every mid-decode snapshot kept the counts of
        # the first (taken when the request resolved, before its first token).
        assert len(mid) >= 6 and set(mid) == {0}
        last = board.snapshots[-1].metrics
        assert last is not None and last == proc.core.metrics.snapshot()
        assert last.generation_tokens == 8 and last.outcomes["length"] == 1

        proc.core.submit("s", [1, 2, 3, 4, 6], RequestParams(max_tokens=8, temperature=0.0))
        seen: list[tuple[int, int]] = []
        while proc.core.requests:
            clock.now += METRICS_EVERY_S
            before = len(board.snapshots)
            report = proc.step(0.0)
            if report.batch and proc.core.has_work():
                published = board.snapshots[before:]
                assert published and published[0].metrics is not None
                # Taken just before this tick's decode: every token so far.
                seen.append(
                    (published[0].metrics.generation_tokens, proc.core.metrics.generation_tokens)
                )
        assert len(seen) >= 6
        assert all(at_publish in (now, now - 1) for at_publish, now in seen)
        assert seen[-1][0] > 8
    finally:
        proc.actor.close()
        proc.parts.close()
