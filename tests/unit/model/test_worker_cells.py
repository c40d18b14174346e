"""KV cell accounting (llamad.model.cells): a shared cell counts once.

The runs-of-blocks bookkeeping is checked against the plain model it
abbreviates, one id per cell as llama.cpp keeps them: decoding gives a
sequence new cells, sharing (``seq_cp`` of a prefix) gives another sequence
the same ids, truncating and clearing let them go; the pool's used cells are
the distinct ids anyone holds.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.model.cells import CellRuns, cells_in_use, cells_only_in

pytestmark = pytest.mark.timeout(120)

N_SEQ = 4


class PerCell:
    """One id per cell, as llama.cpp's cells are."""

    def __init__(self) -> None:
        self.cells: list[list[int]] = [[] for _ in range(N_SEQ)]
        self._ids = itertools.count()

    def extend(self, seq: int, n: int) -> None:
        self.cells[seq] += [next(self._ids) for _ in range(n)]

    def truncate(self, seq: int, keep: int) -> None:
        del self.cells[seq][keep:]

    def share(self, src: int, dst: int, n: int) -> None:
        self.cells[dst] = self.cells[src][:n]

    def replace(self, seq: int, n: int) -> None:
        self.cells[seq] = [next(self._ids) for _ in range(n)]

    def used(self) -> int:
        return len({c for cells in self.cells for c in cells})

    def only_in(self, seq: int) -> int:
        others = {c for i, cells in enumerate(self.cells) if i != seq for c in cells}
        return len(set(self.cells[seq]) - others)


ops = st.lists(
    st.tuples(
        st.sampled_from(["extend", "truncate", "share", "replace", "clear"]),
        st.integers(0, N_SEQ - 1),
        st.integers(0, N_SEQ - 1),
        st.integers(0, 40),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_runs_count_cells_as_per_cell_ids_do(steps: list[tuple[str, int, int, int]]) -> None:
    runs = [CellRuns() for _ in range(N_SEQ)]
    model = PerCell()
    for op, a, b, n in steps:
        if op == "extend":
            runs[a].extend(n)
            model.extend(a, n)
        elif op == "truncate":
            runs[a].truncate(n)
            model.truncate(a, n)
        elif op == "share" and a != b:
            shared = min(n, runs[a].length)
            runs[b] = runs[a].shared(shared)
            model.share(a, b, shared)
        elif op == "replace":
            runs[a].replace(n)
            model.replace(a, n)
        elif op == "clear":
            runs[a] = CellRuns()
            model.cells[a] = []
        assert [r.length for r in runs] == [len(c) for c in model.cells]
        assert cells_in_use(runs) == model.used()
        for seq in range(N_SEQ):
            others = [r for i, r in enumerate(runs) if i != seq]
            assert cells_only_in(runs[seq], others) == model.only_in(seq)


def test_a_shared_prefix_counts_once_and_each_tail_on_its_own() -> None:
    leader = CellRuns()
    leader.extend(1024)
    leader.extend(32)
    followers = [leader.shared(1024) for _ in range(7)]
    for f in followers:
        f.extend(32)
    assert cells_in_use([leader, *followers]) == 1024 + 8 * 32
    assert cells_only_in(leader, followers) == 32
