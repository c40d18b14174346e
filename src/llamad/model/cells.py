"""Which KV cells the context's sequences hold, counted once however many share them.

With ``kv_unified`` every sequence draws its KV cells from one pool of
``n_ctx``. A cell may belong to several sequences at once: ``seq_cp`` (how a
request shares another sequence's prefix, SPEC M18) adds the destination to
the source's cells and copies no bytes, and a cell is freed only when its
last sequence lets go of it (``seq_rm``, a restore over it, a clear). The
scheduler must know how many cells are really in use, or it would park,
evict and refuse work over cells that do not exist: eight agents sharing a
1,024-token prefix hold ~1,300 cells, not ~8,400.

The model: every run of cells a sequence gains by decoding (or by a
restore) is a :class:`Block` of consecutive positions starting at
``Block.start``. A sequence's KV is a list of runs, ``(block, end)``: the
positions ``[block.start, end)`` of that block, each run starting where the
previous one ended. Every way a sequence's KV changes keeps each run a
*prefix* of its block:

- decoding appends (extends the sequence's own last block when nobody else
  can hold cells past its end, else starts a new block);
- truncating to ``keep`` positions cuts runs at ``keep``;
- sharing copies the source's runs cut at ``n`` (a copy always starts at
  position 0);
- a restore replaces everything with one new block; a clear drops all runs.

So the cells of a block in use are ``[start, max end over the runs that
name it)``, and the pool's used cells are the sum of that over every block
any sequence names. Blocks nobody names are garbage (Python's). This is the
same bookkeeping llama.cpp does per cell, kept per run: a few runs per
sequence, not a list per token.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = ["Block", "CellRuns", "cells_in_use", "cells_only_in"]


@dataclass(eq=False, slots=True)
class Block:
    """Cells created together for one sequence, at positions ``start ..``.

    ``end`` is one past the last position ever created in it: a run that
    reaches ``end`` may grow the block, since nobody can hold a cell past it.
    """

    start: int
    end: int


@dataclass(eq=False, slots=True)
class CellRuns:
    """One sequence's cells, as consecutive runs of blocks from position 0."""

    runs: list[tuple[Block, int]] = field(default_factory=list)

    @property
    def length(self) -> int:
        return self.runs[-1][1] if self.runs else 0

    def extend(self, n: int) -> None:
        """``n`` new cells at the next positions (a decode)."""
        if n <= 0:
            return
        pos = self.length
        if self.runs:
            block, end = self.runs[-1]
            if end == block.end:
                # Nobody holds a cell of this block past our end: grow it.
                block.end = end + n
                self.runs[-1] = (block, end + n)
                return
        self.runs.append((Block(pos, pos + n), pos + n))

    def replace(self, n: int) -> None:
        """Fresh cells for positions ``[0, n)`` (a restore), the old ones let go."""
        self.runs = [(Block(0, n), n)] if n > 0 else []

    def truncate(self, keep: int) -> None:
        """Let go of the cells at positions ``keep ..``."""
        kept: list[tuple[Block, int]] = []
        for block, end in self.runs:
            if block.start >= keep:
                break
            kept.append((block, min(end, keep)))
        self.runs = kept

    def shared(self, n: int) -> CellRuns:
        """The runs another sequence holds after sharing our first ``n`` positions."""
        other = CellRuns()
        other.runs = list(self.runs)
        other.truncate(n)
        return other


def _extents(holders: Iterable[CellRuns]) -> dict[int, tuple[Block, int]]:
    extents: dict[int, tuple[Block, int]] = {}
    for runs in holders:
        for block, end in runs.runs:
            seen = extents.get(id(block))
            if seen is None or end > seen[1]:
                extents[id(block)] = (block, end)
    return extents


def cells_in_use(holders: Iterable[CellRuns]) -> int:
    """Distinct cells held by any of ``holders`` (a shared cell counts once)."""
    return sum(end - block.start for block, end in _extents(holders).values())


def cells_only_in(runs: CellRuns, others: Iterable[CellRuns]) -> int:
    """Cells ``runs`` holds that none of ``others`` does: what clearing it frees."""
    extents = _extents(others)
    own = 0
    for block, end in runs.runs:
        seen = extents.get(id(block))
        floor = block.start if seen is None else max(block.start, seen[1])
        own += max(0, end - floor)
    return own
