"""The worker's loop on the stub parts (no model): requests in, events out, a
queued request's cancel delivered without a tick, a clean stop."""

from __future__ import annotations

import dataclasses
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.actors import Registry
from llamad.cache.policy import CachePolicy
from llamad.llama_ffi import ContextOptions
from llamad.model.config import WorkerConfig
from llamad.model.planner import BatchPlan
from llamad.model.results import CacheHitKind, FinishReason
from llamad.model.status_board import read_status
from llamad.model.stub import StubBackend
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_parts import WorkerParts
from llamad.model.worker_proc import WorkerProcess
from llamad.model.worker_spec import WorkerSpec
from stub_worker_parts import stub_parts

pytestmark = pytest.mark.timeout(60)

POLICY = CachePolicy(
    min_tokens=4, cold_min_tokens=4, boundary_trim_tokens=0, boundary_align_tokens=4
)


class Running:
    def __init__(self, proc: WorkerProcess, client: WorkerClient) -> None:
        self.proc = proc
        self.client = client
        ready = threading.Event()
        self.thread = threading.Thread(target=proc.serve, kwargs={"ready": ready.set})
        self.thread.start()
        assert ready.wait(30), "the worker never reported ready"

    def stop(self) -> None:
        self.client.close()
        self.proc.actor.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


class PacedStub(StubBackend):
    """A stub whose decode steps take :data:`STEP_S`. An unpaced stub runs a
    whole 256-cell context in ~30 ms: a test that needs a request to hold its
    sequence would then depend on how soon its next message arrives."""

    def decode(self, plan: BatchPlan) -> None:
        time.sleep(STEP_S)
        super().decode(plan)


STEP_S = 0.02  # a 256-cell context lasts ~5 s; a cancel still lands within a step


def paced_stub_parts(spec: WorkerSpec) -> WorkerParts:
    parts = stub_parts(spec)
    ctx = spec.context
    paced = PacedStub(n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, n_seq_max=ctx.n_seq_max)
    return dataclasses.replace(parts, backend=paced)


def _running(parts: str) -> Iterator[Running]:
    root = Path(tempfile.mkdtemp(prefix="lwl-", dir="/tmp"))
    sizes = {"n_ctx": 256, "n_batch": 32, "n_seq_max": 1}
    spec = WorkerSpec(
        model_id="stub",
        model_path="/nonexistent/stub.gguf",
        context=ContextOptions(**sizes, n_ubatch=32, kv_unified=True, n_threads=1),
        worker=WorkerConfig(**sizes, max_queue=4, policy=POLICY),
        registry_root=str(root),
        parts=parts,
    )
    r = Running(WorkerProcess(spec), WorkerClient("stub", registry=Registry(root)))
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture
def running() -> Iterator[Running]:
    yield from _running("stub_worker_parts:stub_parts")


@pytest.fixture
def paced() -> Iterator[Running]:
    yield from _running(f"{__name__}:paced_stub_parts")


def test_requests_are_served_and_saved_rows_hit(
    running: Running,
) -> None:
    w = running.client
    cold = w.complete("abcdefgh", max_tokens=3, temperature=0.0)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert cold.finish_reason is FinishReason.LENGTH
    warm = w.complete("abcdefgh", max_tokens=3, temperature=0.0)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.generated == cold.generated


def test_queued_request_cancelled_gets_its_done(paced: Running) -> None:
    w = paced.client
    first = w.infer("abcd", max_tokens=100_000, temperature=0.0)
    next(iter(first))  # holds the only sequence
    queued = w.infer("efgh", request_id="q", max_tokens=2)
    assert w.cancel("q")
    events = list(queued)
    assert events == []
    assert queued.result is not None and queued.result.finish_reason is FinishReason.CANCELLED
    first.cancel()


def test_clean_stop_removes_the_board(running: Running) -> None:
    assert running.client.status().model_id == "stub"
    board = running.proc.board
    assert board is not None and read_status(board.path) is not None
    running.stop()
    assert not board.path.exists()


def test_the_cache_view_hears_of_idle_loops_only_with_nothing_in_flight(paced: Running) -> None:
    # What the view keeps off the request path (the read buffer for the
    # largest row seen) starts at idle() (issue 21): never while a request
    # is queued, restoring or decoding beside it.
    proc = paced.proc
    seen: list[int] = []
    view = proc.parts.cache
    real = view.idle

    def idle() -> None:
        seen.append(len(proc.core.requests))
        real()

    view.idle = idle  # type: ignore[method-assign]
    done = paced.client.complete("abcdefgh", max_tokens=6, temperature=0.0)
    assert done.finish_reason is FinishReason.LENGTH
    # The loop reaches idle once the reply is out (the next poll's wake-up).
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        paced.client.status()  # a message: one more loop turn
    assert seen, "the loop never said it was idle"
    assert set(seen) == {0}


def test_the_cache_view_does_not_hear_of_idle_the_moment_a_reply_ends(
    paced: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A client that sends its next request the moment a reply ends (a chat,
    # an agent) must not find the view's deferred work beside it: idle()
    # waits AHEAD_AFTER_IDLE_S (here made long) after the last request.
    from llamad.model import worker_proc  # noqa: PLC0415

    monkeypatch.setattr(worker_proc, "AHEAD_AFTER_IDLE_S", 60.0)
    seen: list[int] = []
    view = paced.proc.parts.cache
    view.idle = lambda: seen.append(1)  # type: ignore[method-assign]
    paced.client.complete("abcdefgh", max_tokens=3, temperature=0.0)
    for _ in range(5):
        paced.client.status()  # loop turns, idle every one of them
    paced.client.complete("abcdefgh", max_tokens=3, temperature=0.0)
    assert seen == []
