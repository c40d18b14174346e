"""The worker's loop stops a decode under way (issue 21): a cancel, a client
closing its stream and a stop reach a decode that would otherwise run for
most of a minute, through the backend's interrupt probe (the abort check's
call into Python on the real backend), on the stub parts in-process.

:class:`LongStub` plays a ``llama_decode`` of a prefill chunk that takes
``LONG_S`` unless stopped: it calls the probe every few milliseconds, as
the abort check does between graph nodes. Without the probe each test
would wait out the whole step, far past its bound.
"""

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
from llamad.model.results import FinishReason
from llamad.model.stub import StubBackend
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_parts import WorkerParts
from llamad.model.worker_proc import WorkerProcess
from llamad.model.worker_spec import WorkerSpec
from llamad.testing.launcher import wait_until
from stub_worker_parts import stub_parts

pytestmark = pytest.mark.timeout(120)

POLICY = CachePolicy(
    min_tokens=4, cold_min_tokens=4, boundary_trim_tokens=0, boundary_align_tokens=4
)
LONG_S = 60.0
"""A held prefill step, unless the probe stops it."""
BOUND_S = 20.0
"""What a test waits for an interrupt: far below LONG_S, loose for a loaded machine."""
STEP_S = 0.01
"""Every other step: a generating request lasts while the next one arrives."""


class LongStub(StubBackend):
    """Prefill chunks of at least ``long_rows`` rows last ``LONG_S`` while
    :attr:`hold` is set, calling the probe every 2 ms; stopped, the first
    half of the rows land (earlier micro-batches) and it raises as llama.cpp's
    abort does."""

    long_rows = 16

    def __init__(self, **kw: int) -> None:
        super().__init__(**kw)
        self.hold = False
        self.min_spans = 1
        self.in_long_step = threading.Event()
        self.stopped: list[BatchPlan] = []

    def decode(self, plan: BatchPlan) -> None:
        time.sleep(STEP_S)
        if self.hold and plan.n_rows >= self.long_rows and len(plan.spans) >= self.min_spans:
            self.stopped.append(plan)
            self.in_long_step.set()
            until = time.monotonic() + LONG_S
            probe = self.probe
            while time.monotonic() < until:
                if probe is not None and probe():
                    self.hold = False
                    self.in_long_step.clear()
                    self.abort_next = ("probe", plan.n_rows // 2)
                    break
                time.sleep(0.002)
        super().decode(plan)


_STUB: list[LongStub] = []


def long_stub_parts(spec: WorkerSpec) -> WorkerParts:
    parts = stub_parts(spec)
    ctx = spec.context
    stub = LongStub(n_ctx=ctx.n_ctx, n_batch=ctx.n_batch, n_seq_max=ctx.n_seq_max)
    _STUB.append(stub)
    return dataclasses.replace(parts, backend=stub)


class Running:
    def __init__(self) -> None:
        root = Path(tempfile.mkdtemp(prefix="lwi-", dir="/tmp"))
        sizes = {"n_ctx": 512, "n_batch": 64, "n_seq_max": 2}
        spec = WorkerSpec(
            model_id="stub",
            model_path="/nonexistent/stub.gguf",
            context=ContextOptions(**sizes, n_ubatch=32, kv_unified=True, n_threads=1),
            worker=WorkerConfig(**sizes, max_queue=4, prefill_chunk_size=32, policy=POLICY),
            registry_root=str(root),
            parts=f"{__name__}:long_stub_parts",
        )
        self.proc = WorkerProcess(spec)
        self.stub = _STUB.pop()
        assert self.proc.parts.backend is self.stub
        self.client = WorkerClient("stub", registry=Registry(root))
        ready = threading.Event()
        self.thread = threading.Thread(target=self.proc.serve, kwargs={"ready": ready.set})
        self.thread.start()
        assert ready.wait(30), "the worker never reported ready"

    def stop(self) -> None:
        self.client.close()
        self.proc.actor.request_stop()
        self.thread.join(LONG_S + 30)
        assert not self.thread.is_alive()

    def consistent(self) -> None:
        for slot in self.proc.core.slots:
            assert self.stub.tokens[slot.seq] == list(slot.kv), slot.seq


@pytest.fixture
def running() -> Iterator[Running]:
    r = Running()
    try:
        yield r
    finally:
        r.stop()


VICTIM = "abcdefghijklmnopqrstuvwxyz" * 3
OTHER = "the other prompt, beside it"


def test_a_cancel_stops_the_decode_under_way_and_the_other_request_gets_its_solo_reply(
    running: Running,
) -> None:
    w = running.client
    stub = running.stub
    # The other request generates (one row a step) when the victim's first
    # prefill chunk joins its batch: that step is held until stopped.
    stub.hold, stub.min_spans = True, 2
    other = w.infer(OTHER, request_id="other", max_tokens=60, temperature=0.0)
    victim = w.infer(VICTIM, request_id="victim", max_tokens=4, temperature=0.0)
    assert stub.in_long_step.wait(BOUND_S)
    started = time.monotonic()
    assert w.cancel("victim")
    events = list(victim)
    assert time.monotonic() - started < BOUND_S
    assert victim.result is not None
    assert victim.result.finish_reason is FinishReason.CANCELLED
    assert victim.result.generated == []
    assert stub.aborts == 1
    assert running.proc.interrupts == 1
    assert events == []
    (stopped,) = stub.stopped
    assert {s.seq for s in stopped.spans} == {0, 1}  # both requests were in it
    list(other)
    assert other.result is not None
    assert other.result.finish_reason is FinishReason.LENGTH
    running.consistent()
    solo = w.complete(OTHER, max_tokens=60, temperature=0.0)
    assert other.result.generated == solo.generated


def test_a_client_closing_its_stream_stops_the_decode_under_way(running: Running) -> None:
    w = running.client
    running.stub.hold = True
    victim = w.infer(VICTIM, request_id="gone", max_tokens=4, temperature=0.0)
    assert running.stub.in_long_step.wait(BOUND_S)
    victim.cancel()  # the actor-level CANCEL of the open stream
    wait_until(lambda: running.stub.aborts == 1, "the decode stopped", BOUND_S)
    wait_until(lambda: not running.proc.core.requests, "the request ended", BOUND_S)
    running.consistent()


def test_a_stop_ends_a_decode_under_way_and_the_worker_shuts_down(running: Running) -> None:
    w = running.client
    running.stub.hold = True
    victim = w.infer(VICTIM, request_id="stopped", max_tokens=4, temperature=0.0)
    assert running.stub.in_long_step.wait(BOUND_S)
    started = time.monotonic()
    running.proc.actor.request_stop()
    running.thread.join(BOUND_S)
    assert not running.thread.is_alive()
    assert time.monotonic() - started < BOUND_S
    assert running.stub.aborts == 1
    list(victim)
    assert victim.result is not None
    assert victim.result.finish_reason is FinishReason.CANCELLED
