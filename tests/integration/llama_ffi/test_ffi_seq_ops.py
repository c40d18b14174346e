"""Sequence ops: remove range, copy, keep, shift, clear (SPEC L5)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from llamad.llama_ffi import Batch, Context, Model, Sampler, SamplerParams, Unsupported

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

MakeCtx = Callable[..., Context]


def _next_greedy(model: Model, ctx: Context, seq: int, n: int = 8) -> list[int]:
    with Sampler(model, SamplerParams(greedy=True)) as s:
        return ctx.generate(s, n, seq_id=seq, stop_at_eog=False)


def _continue(model: Model, ctx: Context, last: int, seq: int) -> list[int]:
    ctx.prefill([last], seq_id=seq)
    return _next_greedy(model, ctx, seq)


def test_truncating_a_sequence_is_token_exact(
    model: Model, make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    toks = list(prompt_tokens)
    cut = len(toks) - 5
    fresh = make_ctx()
    fresh.prefill(toks)
    expected = _next_greedy(model, fresh, 0)

    ctx = make_ctx()
    ctx.prefill(toks + model.tokenize(" and then something else entirely"))
    assert ctx.seq_remove(0, cut)
    assert ctx.seq_pos_max(0) == cut - 1
    ctx.prefill(toks[cut:])
    assert _next_greedy(model, ctx, 0) == expected


def test_seq_copy_shares_a_prefix_between_sequences(
    model: Model, make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    toks = list(prompt_tokens)
    ctx = make_ctx(n_seq_max=2, kv_unified=True, n_ctx=2048)
    ctx.prefill(toks[:-1], seq_id=0)
    ctx.seq_copy(0, 1)
    assert ctx.seq_pos_max(1) == ctx.seq_pos_max(0)
    assert _continue(model, ctx, toks[-1], 0) == _continue(model, ctx, toks[-1], 1)


def test_whole_sequence_copy_works_across_separate_streams(
    model: Model, make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    toks = list(prompt_tokens)
    ctx = make_ctx(n_seq_max=2, n_ctx=2048)
    ctx.prefill(toks[:-1], seq_id=0)
    ctx.seq_copy(0, 1)
    assert _continue(model, ctx, toks[-1], 0) == _continue(model, ctx, toks[-1], 1)


def test_partial_copy_across_separate_streams_is_unsupported(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(n_seq_max=2, n_ctx=2048)
    ctx.prefill([1, 2, 3, 4], seq_id=0)
    with pytest.raises(Unsupported):
        ctx.seq_copy(0, 1, 0, 2)


def test_seq_keep_drops_every_other_sequence(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(n_seq_max=3, kv_unified=True, n_ctx=2048)
    for seq in range(3):
        ctx.prefill([10 + seq, 20, 30], seq_id=seq)
    ctx.seq_keep(1)
    assert [ctx.seq_pos_max(s) for s in range(3)] == [-1, 2, -1]


def test_seq_shift_moves_positions(make_ctx: MakeCtx) -> None:
    ctx = make_ctx()
    ctx.prefill(list(range(100, 120)))
    assert ctx.seq_remove(0, 0, 5)
    ctx.seq_shift(0, -5, 5)
    assert (ctx.seq_pos_min(0), ctx.seq_pos_max(0)) == (0, 14)
    assert ctx.next_pos(0) == 15
    ctx.prefill([7])  # continues at the shifted position
    assert ctx.seq_pos_max(0) == 15


def test_clear_empties_every_sequence_and_forgets_logits(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(n_seq_max=2, n_ctx=2048)
    ctx.prefill([1, 2, 3], seq_id=0)
    ctx.prefill([4, 5], seq_id=1)
    ctx.clear()
    assert ctx.seq_pos_max(0) == ctx.seq_pos_max(1) == -1
    assert ctx.output_rows == ()


def test_removing_a_sequence_forgets_only_its_logits(make_ctx: MakeCtx) -> None:
    ctx = make_ctx(n_seq_max=2, n_ctx=2048)
    batch = Batch(8)
    batch.add_tokens([1, 2], 0, 0)
    batch.add_tokens([3, 4], 1, 0)
    ctx.decode(batch)
    assert ctx.output_rows == (1, 3)
    ctx.seq_remove(1)
    assert ctx.output_rows == (1,)
