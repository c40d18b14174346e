"""Where a sequence's cells end (llamad's llama.cpp patch 0004, ``llama_memory_seq_cell_end``).

A decode attends over every KV cell below the highest one in use. The
patch says where a sequence's cells end (and, for -1, where all cells in
use end), so that the worker can move an idle sequence left above freed
cells down to the lowest free ones (pack, clear, unpack). Here: the ends
follow the cells llama.cpp places, freed cells below a sequence leave its
end (and the span) where they were, and a sequence moved down ends where
its count does and decodes its next token bit for bit as it did in place.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

import tolerances
from ffi_decode import decode_rows
from llamad.llama_ffi import Context, Model
from llamad.llama_ffi.errors import InvalidSequence

pytestmark = pytest.mark.timeout(120)

TEXT = "In a quiet harbour town of grey stone houses, this is a short story about the "


@pytest.fixture
def unified(make_ctx: Callable[..., Context]) -> Context:
    return make_ctx(n_seq_max=4, kv_unified=True, n_batch=64, n_ubatch=64)


def _move(ctx: Context, seq: int) -> None:
    """Pack, clear and unpack ``seq`` (what ``SequenceTable.compact_idle`` does)."""
    out = bytearray(ctx.seq_state_size(seq))
    n = ctx.pack_seq(seq, out)
    assert ctx.seq_remove(seq)
    ctx.unpack_seq(seq, memoryview(out)[:n])


def test_the_ends_follow_the_cells_llama_cpp_places(unified: Context, model: Model) -> None:
    ctx = unified
    assert ctx.seq_cell_end(-1) == 0
    assert ctx.seq_cell_end(0) == 0
    words = model.tokenize(TEXT * 20)
    assert len(words) >= 100
    decode_rows(ctx, 0, words[:100], 0)
    assert ctx.seq_cell_end(0) == 100
    decode_rows(ctx, 1, words[:40], 0)
    # The second sequence's cells go above the first one's.
    assert (ctx.seq_cell_end(1), ctx.seq_cell_end(-1)) == (140, 140)
    assert ctx.seq_cell_end(2) == 0
    # Freeing the cells below it moves nothing: the span stays.
    assert ctx.seq_remove(0)
    assert (ctx.seq_cell_end(0), ctx.seq_cell_end(1), ctx.seq_cell_end(-1)) == (0, 140, 140)
    with pytest.raises(InvalidSequence):
        ctx.seq_cell_end(4)
    with pytest.raises(InvalidSequence):
        ctx.seq_cell_end(-2)


def test_a_sequence_moved_down_ends_where_its_count_does_and_decodes_the_same(
    unified: Context, model: Model
) -> None:
    ctx = unified
    words = model.tokenize(TEXT * 40)
    assert len(words) >= 341
    short, extra = words[:40], words[40:41]
    # Where the short sequence is left in a server: above a long one that ended.
    decode_rows(ctx, 0, words[:300], 0)
    decode_rows(ctx, 1, short, 0)
    assert ctx.seq_remove(0)
    assert ctx.seq_cell_end(-1) == 340
    _move(ctx, 1)
    assert (ctx.seq_cell_end(1), ctx.seq_cell_end(-1)) == (40, 40)
    assert ctx.seq_pos_max(1) == 39
    moved = decode_rows(ctx, 1, extra, 40)

    # The same next token in place, in a context of its own.
    ctx.clear(data=True)
    decode_rows(ctx, 0, words[:300], 0)
    decode_rows(ctx, 1, short, 0)
    assert ctx.seq_remove(0)
    in_place = decode_rows(ctx, 1, extra, 40)
    if tolerances.exact():
        assert moved == in_place
    else:
        assert max(abs(x - y) for x, y in zip(moved, in_place, strict=True)) < 0.05
