"""Batch bookkeeping (no model needed: llama_batch_init only allocates)."""

from __future__ import annotations

from array import array

import pytest

from llamad.errors import BadRequest
from llamad.llama_ffi import Batch, BatchTooLarge, Closed, InvalidToken

pytestmark = pytest.mark.timeout(30)


def test_add_tokens_fills_consecutive_positions_of_one_sequence() -> None:
    b = Batch(16)
    first = b.add_tokens([5, 6, 7], seq_id=2, start_pos=10)
    raw = b.native
    assert first == 0
    assert len(b) == 3
    assert [raw.token[i] for i in range(3)] == [5, 6, 7]
    assert [raw.pos[i] for i in range(3)] == [10, 11, 12]
    assert [raw.seq_id[i][0] for i in range(3)] == [2, 2, 2]
    assert [raw.logits[i] for i in range(3)] == [0, 0, 1]
    assert b.output_rows == (2,)
    assert b.output_seqs == (2,)


def test_mixed_prefill_and_decode_rows_track_outputs_per_sequence() -> None:
    b = Batch(16)
    b.add(100, 7, 0, logits=True)
    b.add_tokens(array("i", [1, 2, 3, 4]), seq_id=1, start_pos=0)
    b.add(200, 3, 2, logits=False)
    assert b.output_rows == (0, 4)
    assert b.output_seqs == (0, 1)


def test_overflowing_add_tokens_raises_and_leaves_batch_unchanged() -> None:
    b = Batch(4)
    b.add_tokens([1, 2, 3], 0, 0)
    with pytest.raises(BatchTooLarge):
        b.add_tokens([4, 5], 0, 3)
    assert len(b) == 3
    assert b.output_rows == (2,)


def test_add_beyond_capacity_raises() -> None:
    b = Batch(1)
    b.add(1, 0, 0)
    with pytest.raises(BatchTooLarge):
        b.add(2, 1, 0)


def test_clear_forgets_rows_and_outputs() -> None:
    b = Batch(4)
    b.add_tokens([1, 2], 0, 0)
    b.clear()
    assert len(b) == 0
    assert b.output_rows == ()


def test_non_int32_token_is_invalid_token() -> None:
    b = Batch(4)
    with pytest.raises(InvalidToken):
        b.add_tokens([2**40], 0, 0)
    with pytest.raises(InvalidToken):
        b.add(2**40, 0, 0)


def test_wrong_buffer_format_is_rejected() -> None:
    b = Batch(4)
    with pytest.raises(BadRequest):
        b.add_tokens(array("d", [1.0]), 0, 0)


def test_set_all_logits_marks_every_row() -> None:
    b = Batch(8)
    b.add_tokens([1, 2], 0, 0, logits_last=False)
    b.add_tokens([3], 1, 0, logits_last=False)
    b.set_all_logits()
    assert b.output_rows == (0, 1, 2)
    assert b.output_seqs == (0, 0, 1)


def test_use_after_close_raises_closed() -> None:
    b = Batch(4)
    b.close()
    with pytest.raises(Closed):
        b.add(1, 0, 0)


@pytest.mark.parametrize("capacity", [0, -1, True])
def test_bad_capacity_is_bad_request(capacity: int) -> None:
    with pytest.raises(BadRequest):
        Batch(capacity)
