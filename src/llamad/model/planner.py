"""The tick planner: one ``llama_decode`` per tick across every active sequence (SPEC M4).

The core describes each sequence that has work as a :class:`SeqState` (its
next position and the tokens it still has to feed); :func:`plan_tick` caps
prefills at the chunk size and at any save boundary, lets the strategy share
out the budget (``n_batch``, and never more rows than free KV cells), checks
the answer, and returns a :class:`BatchPlan`: plain values the shell turns
into a :class:`llamad.llama_ffi.Batch` (``Batch.add_tokens`` per span, which
appends a run in C rather than row by row in Python).

Two rules here make warm and cold paths produce the same logits:

- the last token of a prompt is always decoded in a span of its own (a
  *decode*), never at the end of a prefill chunk, so its logits come from the
  same one-row computation whether the prefix was prefilled or restored;
- a prefill never crosses a save boundary, so the sequence holds exactly the
  tokens to save at the end of some tick.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

from llamad.errors import LlamadError
from llamad.model.strategies import (
    Allocation,
    Balanced,
    BatchStrategy,
    DecodeMaximal,
    PrefillPriority,
    Work,
)

__all__ = ["BatchPlan", "Row", "SeqState", "Span", "plan_tick"]


def _refused(message: str) -> LlamadError:
    """A plan the planner refuses: an internal error, never sent to llama.cpp."""
    return LlamadError(message, details={"where": "tick planner"})


class Row(NamedTuple):
    """One row of a decode batch."""

    seq: int
    token: int
    pos: int
    want_logits: bool


class Span(NamedTuple):
    """Consecutive tokens of one sequence at positions ``pos, pos+1, ...``;
    with ``want_logits`` the last row asks for logits."""

    seq: int
    pos: int
    tokens: tuple[int, ...]
    want_logits: bool

    def rows(self) -> Iterator[Row]:
        last = len(self.tokens) - 1
        for i, token in enumerate(self.tokens):
            yield Row(self.seq, token, self.pos + i, self.want_logits and i == last)


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """One tick's batch: spans in row order, at most one per sequence."""

    spans: tuple[Span, ...]

    @property
    def n_rows(self) -> int:
        return sum(len(s.tokens) for s in self.spans)

    def rows(self) -> Iterator[Row]:
        for span in self.spans:
            yield from span.rows()

    def output_row(self, seq: int) -> int:
        """Batch row index of ``seq``'s logits row (what ``Context.sample`` takes)."""
        row = 0
        for span in self.spans:
            row += len(span.tokens)
            if span.seq == seq and span.want_logits:
                return row - 1
        raise KeyError(f"sequence {seq} has no logits row in this batch")

    def span_of(self, seq: int) -> Span | None:
        for span in self.spans:
            if span.seq == seq:
                return span
        return None

    def __bool__(self) -> bool:
        return bool(self.spans)


class SeqState(NamedTuple):
    """What the planner needs to know about one sequence with work."""

    seq: int
    order: int
    """Admission order (smaller is older)."""
    pos: int
    """Next position: the number of tokens the sequence's KV holds."""
    feed: Sequence[int]
    """Tokens still to decode, in order."""
    wants_logits: bool
    """Whether the feed's last token needs logits (false for prefill_only)."""
    limit: int | None = None
    """Most tokens the sequence may gain before a save must be taken."""


def _work(state: SeqState, chunk: int) -> tuple[bool, Work] | None:
    n = len(state.feed)
    if n == 0:
        return None
    if state.wants_logits and n == 1:
        return True, Work(state.seq, state.order, 1)
    # The logits token is held back from every prefill chunk (module doc).
    available = n - 1 if state.wants_logits else n
    available = min(available, chunk)
    if state.limit is not None:
        available = min(available, state.limit)
    if available <= 0:
        return None
    return False, Work(state.seq, state.order, available)


def plan_tick(
    states: Sequence[SeqState],
    strategy: BatchStrategy,
    *,
    n_batch: int,
    chunk: int,
    free_cells: int,
) -> BatchPlan:
    """This tick's batch for ``states`` (empty when nothing fits or nothing waits)."""
    budget = min(n_batch, max(free_cells, 0))
    if 0 < len(states) <= budget and type(strategy) in _DECODES_ALL_FIT:
        # Every generation step: each sequence decodes its one token. Every
        # built-in strategy gives each decode its row, oldest first, when
        # all fit and no prefill competes, so the plan is known without
        # offering it (a few tens of microseconds of every step).
        plan = _decodes_only(states)
        if plan is not None:
            return plan
    decodes: list[Work] = []
    prefills: list[Work] = []
    by_seq: dict[int, SeqState] = {}
    for state in sorted(states, key=lambda s: s.order):
        if state.seq in by_seq:
            raise _refused(f"sequence {state.seq} offered twice")
        by_seq[state.seq] = state
        found = _work(state, chunk)
        if found is not None:
            (decodes if found[0] else prefills).append(found[1])
    if budget == 0 or not (decodes or prefills):
        return BatchPlan(())
    allocations = strategy.allocate(decodes, prefills, budget)
    _check(allocations, decodes, prefills, budget, strategy.name)
    spans = []
    for work, n in allocations:
        state = by_seq[work.seq]
        decode = state.wants_logits and len(state.feed) == 1
        spans.append(Span(state.seq, state.pos, tuple(state.feed[:n]), decode))
    return BatchPlan(tuple(spans))


_DECODES_ALL_FIT: Final = frozenset({DecodeMaximal, PrefillPriority, Balanced})
"""Strategies known to give every decode its row when the budget holds them
all and nothing else is offered (a custom one is always asked)."""


def _decodes_only(states: Sequence[SeqState]) -> BatchPlan | None:
    """The plan of a tick whose every state is a one-token decode (``None``
    when one is not): what :func:`plan_tick` builds through the strategy."""
    for state in states:
        if not state.wants_logits or len(state.feed) != 1:
            return None
    if len(states) > 1:
        states = sorted(states, key=lambda s: s.order)
        if len({state.seq for state in states}) != len(states):
            return None  # the full path refuses it
    return BatchPlan(tuple(Span(s.seq, s.pos, (s.feed[0],), True) for s in states))


def _check(
    allocations: Sequence[Allocation],
    decodes: Sequence[Work],
    prefills: Sequence[Work],
    budget: int,
    name: str,
) -> None:
    offered = {w.seq: w for w in (*decodes, *prefills)}
    seen: set[int] = set()
    total = 0
    for work, n in allocations:
        if offered.get(work.seq) != work or work.seq in seen:
            raise _refused(f"strategy {name!r} allocated to a sequence it was not offered")
        if not 0 < n <= work.available:
            raise _refused(
                f"strategy {name!r} gave sequence {work.seq} {n} tokens "
                f"(it can take 1..{work.available})"
            )
        seen.add(work.seq)
        total += n
    if total > budget:
        raise _refused(f"strategy {name!r} allocated {total} rows, the budget is {budget}")
