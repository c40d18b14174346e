"""LlamaBackend under a thread governor, on the real model (SPEC M14).

The backend asks the governor for each decode's thread count, applies it to
the context (capped by each count the context was made with), and tells the
governor how long the ``llama_decode`` took. The governor here is the real
one; only its board is scripted (how many workers are busy).

The contexts are made with 2 threads so that the budget has something to
take away; the decodes are a handful of short ones (the spin is bounded in
this process, so 2 threads on shared cores slow down, never collapse).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from llamad.errors import LlamadError
from llamad.llama_ffi import Context, FlashAttn, Model
from llamad.model.llama_backend import LlamaBackend
from llamad.model.planner import BatchPlan, Span
from llamad.model.threads import ThreadGovernor, ThreadPolicy

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

TEXT = (
    "The lighthouse stood on the rocks above the bay, white against the grey sky, "
    "and every night its lamp turned slowly over the dark water while the keeper "
    "wrote the weather into a book that nobody would ever read again."
)


class ScriptedBoard:
    """A busy board whose count of busy workers the test sets."""

    def __init__(self, busy: int = 1) -> None:
        self.busy = busy
        self.marks: list[float] = []

    def mark_busy(self, until: float) -> None:
        self.marks.append(until)

    def busy_workers(self, now: float) -> int:
        return self.busy


@dataclass
class Step:
    rows: int
    kv_cells: int
    asked_at: float
    recorded_at: float | None = None
    seconds: float | None = None


class SpyGovernor(ThreadGovernor):
    """The real governor, remembering when it was asked and what it was told."""

    def __init__(self, policy: ThreadPolicy, board: ScriptedBoard) -> None:
        super().__init__(policy, board=board)
        self.steps: list[Step] = []

    def threads_for(self, rows: int, kv_cells: int = 0) -> int:
        n = super().threads_for(rows, kv_cells)
        self.steps.append(Step(rows, kv_cells, time.perf_counter()))
        return n

    def record(self, rows: int, seconds: float, kv_cells: int = 0) -> None:
        step = self.steps[-1]
        step.recorded_at = time.perf_counter()
        assert rows == step.rows, "record must name the rows threads_for was asked about"
        assert kv_cells == step.kv_cells, "record must name the cells threads_for was told"
        step.seconds = seconds
        super().record(rows, seconds, kv_cells)


def governed(ctx: Context, board: ScriptedBoard) -> tuple[LlamaBackend, SpyGovernor]:
    most = max(ctx.threads)
    # Cores and max threads as on this 2-core machine; no exploring, so the
    # count is the budget's alone.
    policy = ThreadPolicy(max_threads=most, cores=2, explore_first_s=3600.0)
    governor = SpyGovernor(policy, board)
    return LlamaBackend(ctx, governor=governor), governor


class Feeder:
    """Plans for sequence 0, one after another."""

    def __init__(self, model: Model) -> None:
        self.tokens = model.tokenize(TEXT, add_special=False)
        self.pos = 0

    def plan(self, n: int) -> BatchPlan:
        chunk = tuple(self.tokens[(self.pos + i) % len(self.tokens)] for i in range(n))
        span = Span(seq=0, pos=self.pos, tokens=chunk, want_logits=True)
        self.pos += n
        return BatchPlan((span,))


@pytest.fixture
def two_threads(make_ctx: Callable[..., Context]) -> Context:
    return make_ctx(n_ctx=512, n_seq_max=1, kv_unified=True, n_threads=2, n_threads_batch=2)


@pytest.fixture
def feeder(model: Model) -> Feeder:
    return Feeder(model)


@pytest.fixture
def closing() -> Iterator[list[LlamaBackend]]:
    made: list[LlamaBackend] = []
    yield made
    for b in made:
        b.close()


def test_the_governors_thread_count_reaches_the_context(
    two_threads: Context, feeder: Feeder, closing: list[Any]
) -> None:
    board = ScriptedBoard(busy=2)
    backend, governor = governed(two_threads, board)
    closing.append(backend)
    assert two_threads.threads == (2, 2)
    # Two busy workers on 2 cores: 1 thread each.
    backend.decode(feeder.plan(4))
    assert two_threads.threads == (1, 1)
    assert governor.status().threads == 1 and governor.status().budget == 1
    # Alone again: both cores.
    board.busy = 1
    backend.decode(feeder.plan(1))
    assert two_threads.threads == (2, 2)
    assert governor.status().busy_workers == 1 and governor.status().budget == 2
    board.busy = 2
    backend.decode(feeder.plan(1))
    assert two_threads.threads == (1, 1)
    assert len(board.marks) >= 3, "each decode marks the worker busy"


def test_the_context_is_told_only_when_the_count_changes(
    two_threads: Context, feeder: Feeder, closing: list[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    board = ScriptedBoard(busy=2)
    backend, _ = governed(two_threads, board)
    closing.append(backend)
    calls: list[tuple[int, ...]] = []
    real = two_threads.set_threads

    def counting(*args: int) -> None:
        calls.append(args)
        real(*args)

    monkeypatch.setattr(two_threads, "set_threads", counting)
    for _ in range(3):
        backend.decode(feeder.plan(1))
    board.busy = 1
    for _ in range(2):
        backend.decode(feeder.plan(1))
    assert calls == [(1, 1), (2, 2)]


def test_each_count_stays_within_what_the_context_was_made_with(
    make_ctx: Callable[..., Context], feeder: Feeder, closing: list[Any]
) -> None:
    # One thread for single rows, two for batches: the governor's 2 must not
    # raise the single-row count, and its 1 lowers both.
    ctx = make_ctx(n_ctx=512, n_seq_max=1, kv_unified=True, n_threads=1, n_threads_batch=2)
    board = ScriptedBoard(busy=1)
    backend, governor = governed(ctx, board)
    closing.append(backend)
    assert governor.policy.max_threads == 2
    backend.decode(feeder.plan(4))
    assert ctx.threads == (1, 2)
    board.busy = 2
    backend.decode(feeder.plan(4))
    assert ctx.threads == (1, 1)


def test_record_is_told_the_time_of_the_decode(
    two_threads: Context, feeder: Feeder, closing: list[Any]
) -> None:
    backend, governor = governed(two_threads, ScriptedBoard(busy=2))
    closing.append(backend)
    plans = [feeder.plan(24), feeder.plan(1)]
    for plan in plans:
        backend.decode(plan)
    assert [s.rows for s in governor.steps] == [p.n_rows for p in plans]
    for step in governor.steps:
        assert step.seconds is not None and step.recorded_at is not None, "never recorded"
        between = step.recorded_at - step.asked_at
        # The decode is all that runs between the two calls but a few
        # microseconds of bookkeeping: its time is most of that interval.
        assert 0 < step.seconds <= between
        assert step.seconds >= 0.5 * between, (step.seconds, between)
    # The governor learnt from those steps (nothing was a collapse).
    status = governor.status()
    assert status.collapses == 0 and status.threads == 1


def test_a_decode_that_raises_ends_its_busy_mark(two_threads: Context, closing: list[Any]) -> None:
    board = ScriptedBoard(busy=1)
    backend, governor = governed(two_threads, board)
    closing.append(backend)
    # A token id past the vocabulary: llama_decode refuses the batch.
    bad = two_threads.model.n_vocab + 10
    plan = BatchPlan((Span(seq=0, pos=0, tokens=(bad,), want_logits=True),))
    with pytest.raises(LlamadError):
        backend.decode(plan)
    assert board.marks[0] == math.inf  # busy for as long as the step ran
    # ... and, once it failed, for the linger only: another worker gets its share back.
    assert len(board.marks) == 2 and math.isfinite(board.marks[1])
    assert board.marks[1] <= time.monotonic() + governor.policy.busy_linger_s


@pytest.mark.parametrize(
    ("flash_attn", "cells"),
    [
        # Flash attention skips other sequences' cells: the plan's furthest position.
        (FlashAttn.AUTO, [(40, 40), (1, 41), (3, 3), (2, 42)]),
        (FlashAttn.ON, [(40, 40), (1, 41), (3, 3), (2, 42)]),
        # Without it every row attends over every used cell: all sequences' cells.
        (FlashAttn.OFF, [(40, 40), (1, 41), (3, 44), (2, 46)]),
    ],
)
def test_the_governor_is_told_the_cells_the_batch_attends_over(
    make_ctx: Callable[..., Context],
    feeder: Feeder,
    closing: list[Any],
    flash_attn: FlashAttn,
    cells: list[tuple[int, int]],
) -> None:
    # Judged by rows alone, a one-row decode over 2,048 cells looked like a
    # collapse of one-row decodes over a few (issue 8).
    ctx = make_ctx(
        n_ctx=512,
        n_seq_max=2,
        kv_unified=True,
        n_threads=2,
        n_threads_batch=2,
        flash_attn=flash_attn,
    )
    backend, governor = governed(ctx, ScriptedBoard(busy=1))
    closing.append(backend)
    backend.decode(feeder.plan(40))  # sequence 0: 40 cells
    backend.decode(feeder.plan(1))  # 41
    tokens = tuple(feeder.tokens[:3])
    backend.decode(BatchPlan((Span(seq=1, pos=0, tokens=tokens, want_logits=True),)))
    both = BatchPlan(
        (
            Span(seq=0, pos=41, tokens=tokens[:1], want_logits=True),
            Span(seq=1, pos=3, tokens=tokens[:1], want_logits=True),
        )
    )
    backend.decode(both)
    assert [(s.rows, s.kv_cells) for s in governor.steps] == cells


def test_a_backend_without_a_governor_keeps_the_contexts_counts(
    two_threads: Context, feeder: Feeder, closing: list[Any]
) -> None:
    backend = LlamaBackend(two_threads)
    closing.append(backend)
    backend.decode(feeder.plan(4))
    assert backend.governor is None
    assert two_threads.threads == (2, 2)
