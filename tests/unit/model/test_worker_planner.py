"""The tick planner and its strategies (SPEC M4): batch composition, chunking, budgets."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.errors import LlamadError
from llamad.model.planner import BatchPlan, SeqState, Span, plan_tick
from llamad.model.strategies import (
    STRATEGIES,
    Allocation,
    Balanced,
    DecodeMaximal,
    PrefillPriority,
    Work,
    strategy_named,
)

pytestmark = pytest.mark.timeout(120)


def decoding(seq: int, order: int, pos: int = 10) -> SeqState:
    return SeqState(seq, order, pos, [100 + seq], True)


def prefilling(seq: int, order: int, n: int, pos: int = 0, limit: int | None = None) -> SeqState:
    return SeqState(seq, order, pos, list(range(1, n + 1)), True, limit)


def plan(
    states: Sequence[SeqState],
    strategy: str = "decode_maximal",
    *,
    n_batch: int = 64,
    chunk: int = 16,
    free_cells: int = 10_000,
) -> BatchPlan:
    return plan_tick(
        states, strategy_named(strategy), n_batch=n_batch, chunk=chunk, free_cells=free_cells
    )


def sizes(p: BatchPlan) -> dict[int, int]:
    return {s.seq: len(s.tokens) for s in p.spans}


def test_decode_maximal_puts_every_decode_first_then_prefills_oldest_first() -> None:
    p = plan(
        [prefilling(0, 1, 100), decoding(1, 2), prefilling(2, 3, 100), decoding(3, 4)], n_batch=20
    )
    assert [s.seq for s in p.spans] == [1, 3, 0, 2]
    assert sizes(p) == {1: 1, 3: 1, 0: 16, 2: 2}
    assert p.n_rows == 20


def test_prefill_priority_fills_prefills_first_and_decodes_take_the_rest() -> None:
    p = plan(
        [decoding(0, 1), decoding(1, 2), prefilling(2, 3, 100)], "prefill_priority", n_batch=17
    )
    assert [s.seq for s in p.spans] == [2, 0]
    assert sizes(p) == {2: 16, 0: 1}


def test_balanced_reserves_half_the_budget_for_each_kind() -> None:
    decodes = [decoding(i, i) for i in range(10)]
    p = plan([*decodes, prefilling(20, 20, 100), prefilling(21, 21, 100)], "balanced", n_batch=16)
    n_decode = sum(1 for s in p.spans if s.want_logits)
    assert n_decode == 8
    assert p.n_rows == 16


def test_balanced_gives_an_unused_half_to_the_other_kind() -> None:
    p = plan([decoding(0, 1), prefilling(1, 2, 100)], "balanced", n_batch=16)
    assert sizes(p) == {0: 1, 1: 15}
    p = plan([decoding(i, i) for i in range(12)] + [prefilling(20, 20, 3)], "balanced", n_batch=16)
    assert sizes(p)[20] == 2
    assert sum(1 for s in p.spans if s.want_logits) == 12


def test_a_prompts_last_token_is_never_part_of_a_prefill_chunk() -> None:
    p = plan([prefilling(0, 1, 5)])
    assert p.spans == (Span(0, 0, (1, 2, 3, 4), False),)
    p = plan([SeqState(0, 1, 4, [5], True)])
    assert p.spans == (Span(0, 4, (5,), True),)


def test_prefill_only_feeds_everything_without_logits() -> None:
    p = plan([SeqState(0, 1, 0, [1, 2, 3], False)])
    assert p.spans == (Span(0, 0, (1, 2, 3), False),)


def test_a_prefill_stops_at_its_save_boundary() -> None:
    p = plan([prefilling(0, 1, 100, pos=3, limit=5)])
    assert sizes(p) == {0: 5}


def test_no_more_rows_than_free_kv_cells() -> None:
    p = plan([decoding(0, 1), decoding(1, 2), prefilling(2, 3, 50)], free_cells=3)
    assert p.n_rows == 3
    assert not plan([decoding(0, 1)], free_cells=0)


def test_rows_carry_positions_from_the_sequences_length() -> None:
    p = plan([prefilling(0, 1, 4, pos=7)])
    assert [(r.pos, r.token, r.want_logits) for r in p.rows()] == [
        (7, 1, False),
        (8, 2, False),
        (9, 3, False),
    ]


def test_output_row_indexes_the_batch() -> None:
    p = plan([prefilling(0, 1, 40), decoding(1, 2), decoding(2, 3)])
    # decodes first: rows 0 and 1
    assert p.output_row(1) == 0
    assert p.output_row(2) == 1
    with pytest.raises(KeyError):
        p.output_row(0)


class Greedy:
    """A custom strategy that ignores the budget (a bug the planner must catch)."""

    name = "greedy"

    def allocate(
        self, decodes: Sequence[Work], prefills: Sequence[Work], budget: int
    ) -> list[Allocation]:
        return [Allocation(w, w.available) for w in (*decodes, *prefills)]


def test_a_strategy_that_overspends_is_refused() -> None:
    with pytest.raises(LlamadError):
        plan_tick(
            [prefilling(0, 1, 100), prefilling(1, 2, 100)],
            Greedy(),
            n_batch=8,
            chunk=16,
            free_cells=99,
        )


def test_a_sequence_offered_twice_is_refused() -> None:
    with pytest.raises(LlamadError):
        plan([decoding(0, 1), decoding(0, 2)])


# -- properties -----------------------------------------------------------------------


@st.composite
def tick_inputs(draw: st.DrawFn) -> tuple[list[SeqState], int, int, int]:
    n_batch = draw(st.integers(1, 96))
    chunk = draw(st.integers(1, n_batch))
    n = draw(st.integers(0, min(n_batch, 12)))
    states = []
    for seq in range(n):
        if draw(st.booleans()):
            states.append(decoding(seq, draw(st.integers(0, 1000))))
        else:
            feed = draw(st.integers(1, 200))
            limit = draw(st.none() | st.integers(1, 64))
            wants = draw(st.booleans())
            states.append(
                SeqState(seq, draw(st.integers(0, 1000)), 0, list(range(feed)), wants, limit)
            )
    free = draw(st.integers(0, 10_000))
    return states, n_batch, chunk, free


@settings(max_examples=300, deadline=None)
@given(tick_inputs(), st.sampled_from(sorted(STRATEGIES)))
def test_no_plan_exceeds_n_batch_free_cells_or_the_chunk(
    inputs: tuple[list[SeqState], int, int, int], name: str
) -> None:
    states, n_batch, chunk, free = inputs
    p = plan(states, name, n_batch=n_batch, chunk=chunk, free_cells=free)
    assert p.n_rows <= min(n_batch, free)
    by_seq = {s.seq: s for s in states}
    assert len({s.seq for s in p.spans}) == len(p.spans)
    for span in p.spans:
        state = by_seq[span.seq]
        assert 0 < len(span.tokens) <= max(chunk, 1)
        assert span.pos == state.pos
        assert list(span.tokens) == list(state.feed[: len(span.tokens)])
        if span.want_logits:
            # Logits only ever for a held-back last token, decoded alone.
            assert len(span.tokens) == 1 and len(state.feed) == 1 and state.wants_logits
        elif state.wants_logits:
            assert len(span.tokens) <= len(state.feed) - 1
        if state.limit is not None and not span.want_logits:
            assert len(span.tokens) <= state.limit


@settings(max_examples=300, deadline=None)
@given(tick_inputs())
def test_decode_maximal_gives_every_decoding_sequence_its_row(
    inputs: tuple[list[SeqState], int, int, int],
) -> None:
    states, n_batch, chunk, _ = inputs
    # Enough cells; n_seq_max <= n_batch is a WorkerConfig invariant.
    p = plan(states, "decode_maximal", n_batch=n_batch, chunk=chunk, free_cells=10_000)
    decoding_seqs = {s.seq for s in states if s.wants_logits and len(s.feed) == 1}
    assert decoding_seqs <= {s.seq for s in p.spans if s.want_logits}


@settings(max_examples=300, deadline=None)
@given(tick_inputs(), st.sampled_from(sorted(STRATEGIES)))
def test_prefills_are_served_in_admission_order(
    inputs: tuple[list[SeqState], int, int, int], name: str
) -> None:
    states, n_batch, chunk, free = inputs
    p = plan(states, name, n_batch=n_batch, chunk=chunk, free_cells=free)
    got = sizes(p)
    prefills = sorted(
        (s for s in states if not (s.wants_logits and len(s.feed) == 1)), key=lambda s: s.order
    )

    def can_take(s: SeqState) -> int:
        n = len(s.feed) - (1 if s.wants_logits else 0)
        return min(n, chunk, s.limit if s.limit is not None else n)

    for i, later in enumerate(prefills):
        if got.get(later.seq, 0) > 0:
            for earlier in prefills[:i]:
                assert got.get(earlier.seq, 0) == can_take(earlier), (earlier, later)


@settings(max_examples=200, deadline=None)
@given(tick_inputs(), st.sampled_from(sorted(STRATEGIES)))
def test_a_plan_is_empty_only_when_nothing_fits_or_nothing_waits(
    inputs: tuple[list[SeqState], int, int, int], name: str
) -> None:
    states, n_batch, chunk, free = inputs
    p = plan(states, name, n_batch=n_batch, chunk=chunk, free_cells=free)
    has_work = any(
        (s.wants_logits and len(s.feed) == 1) or len(s.feed) > (1 if s.wants_logits else 0)
        for s in states
    )
    assert bool(p) == (has_work and free > 0)


def test_strategy_classes_are_registered_by_their_names() -> None:
    for cls in (DecodeMaximal, PrefillPriority, Balanced):
        assert isinstance(strategy_named(cls.name), cls)


class Asked:
    """A built-in strategy behind a class the planner does not know: every
    plan goes through the strategy (no shortcut for decode-only ticks)."""

    def __init__(self, inner: str) -> None:
        self.inner = strategy_named(inner)
        self.name = self.inner.name
        self.asked = 0

    def allocate(
        self, decodes: Sequence[Work], prefills: Sequence[Work], budget: int
    ) -> list[Allocation]:
        self.asked += 1
        return self.inner.allocate(decodes, prefills, budget)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 1000), min_size=1, max_size=12),
    st.integers(1, 16),
    st.integers(0, 20),
    st.sampled_from(sorted(STRATEGIES)),
)
def test_a_decode_only_tick_plans_as_its_strategy_would(
    orders: list[int], n_batch: int, free: int, name: str
) -> None:
    """Generation steps skip the strategy when every decode fits: the plan
    must be the one the strategy gives (rows, order, logits), whatever fits."""
    states = [SeqState(seq, order, 7 + seq, [200 + seq], True) for seq, order in enumerate(orders)]
    asked = Asked(name)
    expected = plan_tick(states, asked, n_batch=n_batch, chunk=4, free_cells=free)
    got = plan_tick(states, strategy_named(name), n_batch=n_batch, chunk=4, free_cells=free)
    assert got == expected
    assert asked.asked == (1 if min(n_batch, free) > 0 else 0)
