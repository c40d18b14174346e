"""Pack/unpack one sequence's KV state: the cache's foundation (SPEC L7, L12)."""

from __future__ import annotations

import mmap
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory

import pytest

import tolerances
from llamad.errors import BadRequest
from llamad.llama_ffi import (
    BufferTooSmall,
    Context,
    Model,
    Sampler,
    SamplerParams,
    StateBuffer,
    StateError,
)

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

MakeCtx = Callable[..., Context]


def _continue(model: Model, ctx: Context, last: int, seq: int, n: int = 32) -> list[int]:
    """Decode the held-back last prompt token, then ``n`` greedy tokens."""
    ctx.prefill([last], seq_id=seq)
    with Sampler(model, SamplerParams(greedy=True)) as s:
        return ctx.generate(s, n, seq_id=seq, stop_at_eog=False)


def _fed_logits(ctx: Context, seq: int, tokens: Sequence[int]) -> list[list[float]]:
    """Logits after decoding each of ``tokens`` alone into ``seq``, as generation does."""
    out = []
    for token in tokens:
        ctx.prefill([token], seq_id=seq)
        out.append(list(ctx.logits()))
    return out


def _packed(ctx: Context, seq: int) -> bytes:
    buf = bytearray(ctx.seq_state_size(seq))
    n = ctx.pack_seq(seq, buf)
    return bytes(buf[:n])


def test_restored_sequence_generates_the_same_tokens_in_a_fresh_context(
    model: Model, make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    # The cold path also decodes the last prompt token alone, so an exact hit
    # reproduces the cold reply on any backend: same bytes, same batch shapes.
    head, last = list(prompt_tokens[:-1]), prompt_tokens[-1]
    a = make_ctx()
    a.prefill(head)
    state = _packed(a, 0)
    expected = _continue(model, a, last, 0)

    b = make_ctx()
    assert b.unpack_seq(0, state) == len(state)
    assert b.seq_pos_max(0) == len(head) - 1
    assert _continue(model, b, last, 0) == expected


def test_restore_into_a_non_zero_sequence_of_a_multi_sequence_context(
    model: Model, make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    head, last = list(prompt_tokens[:-1]), prompt_tokens[-1]
    a = make_ctx()
    a.prefill(head)
    state = _packed(a, 0)
    expected = _continue(model, a, last, 0)

    def restored_into_slot_2() -> Context:
        # A unified KV cache has one stream whatever n_seq_max is, so a state
        # packed from a one-sequence context restores into it.
        multi = make_ctx(n_seq_max=4, n_ctx=4096, kv_unified=True)
        assert multi.n_stream == a.n_stream == 1
        multi.prefill(model.tokenize("Another conversation occupies sequence zero."), seq_id=0)
        multi.unpack_seq(2, state)
        assert multi.seq_pos_max(2) == len(head) - 1
        return multi

    # Its KV layout differs from the reference's (another sequence's cells come
    # first): that changes nothing on the CPU, but picks other kernels on a GPU,
    # where greedy tokens may part at a near tie; fed the same tokens, the
    # next-token distributions must still agree within the GPU tolerance.
    if tolerances.exact():
        assert _continue(model, restored_into_slot_2(), last, 2) == expected
    fed = [last, *expected[:-1]]
    reference = make_ctx()
    reference.unpack_seq(0, state)
    want = _fed_logits(reference, 0, fed)
    got = _fed_logits(restored_into_slot_2(), 2, fed)
    if tolerances.exact():
        assert got == want
    else:
        kls = [tolerances.kl_divergence(w, g) for w, g in zip(want, got, strict=True)]
        assert max(kls) <= tolerances.LOGITS_KL_GPU, f"KL per step: {kls}"


def test_pack_writes_identical_bytes_into_any_writable_buffer(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    ctx = make_ctx()
    ctx.prefill(list(prompt_tokens))
    size = ctx.seq_state_size(0)
    reference = _packed(ctx, 0)

    with StateBuffer(size) as sbuf:
        n = ctx.pack_seq(0, sbuf)
        assert bytes(sbuf.view(n)) == reference
    anon = mmap.mmap(-1, size)
    try:
        assert ctx.pack_seq(0, anon) == size
        assert anon[:size] == reference
    finally:
        anon.close()
    shm = shared_memory.SharedMemory(create=True, size=size)
    try:
        view = shm.buf
        assert view is not None
        ctx.pack_seq(0, view)
        assert bytes(view[:size]) == reference
        # Restoring straight from the shared segment (no copy out of it).
        other = make_ctx()
        other.unpack_seq(0, view, size)
        assert _packed(other, 0) == reference
        del view
    finally:
        shm.close()
        shm.unlink()


def test_pack_into_a_too_small_buffer_raises_and_writes_nothing(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    ctx = make_ctx()
    ctx.prefill(list(prompt_tokens))
    small = bytearray(ctx.seq_state_size(0) - 1)
    with pytest.raises(BufferTooSmall) as err:
        ctx.pack_seq(0, small)
    assert err.value.details["needed"] == len(small) + 1
    assert small == bytearray(len(small))


def test_pack_into_read_only_memory_is_bad_request(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    ctx = make_ctx()
    ctx.prefill(list(prompt_tokens))
    with pytest.raises(BadRequest):
        ctx.pack_seq(0, bytes(ctx.seq_state_size(0)))


def test_corrupt_state_is_rejected_and_leaves_the_sequence_empty(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    ctx = make_ctx()
    ctx.prefill(list(prompt_tokens))
    state = bytearray(_packed(ctx, 0))
    state[20:40] = b"\xff" * 20
    target = make_ctx()
    target.prefill([1, 2, 3])
    with pytest.raises(StateError):
        target.unpack_seq(0, state)
    assert target.seq_pos_max(0) == -1


def test_state_larger_than_the_target_context_is_rejected(model: Model, make_ctx: MakeCtx) -> None:
    big = make_ctx(n_ctx=512)
    big.prefill([(i * 37) % 40000 + 100 for i in range(300)])
    small = make_ctx(n_ctx=256)
    with pytest.raises(StateError):
        small.unpack_seq(0, _packed(big, 0))
    assert small.seq_pos_max(0) == -1


def test_state_restores_across_sequences_of_a_multi_stream_context(
    model: Model, make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    head, last = list(prompt_tokens[:-1]), prompt_tokens[-1]
    src = make_ctx(n_seq_max=4, n_ctx=4096)
    src.prefill(head, seq_id=1)
    state = _packed(src, 1)
    expected = _continue(model, src, last, 1)
    dst = make_ctx(n_seq_max=4, n_ctx=4096)
    dst.unpack_seq(3, state)
    assert _continue(model, dst, last, 3) == expected


def test_state_from_a_different_stream_layout_is_rejected(
    make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    single = make_ctx()
    single.prefill(list(prompt_tokens))
    separate = make_ctx(n_seq_max=4, n_ctx=4096)
    assert separate.n_stream == 4
    with pytest.raises(StateError):
        separate.unpack_seq(2, _packed(single, 0))
    assert separate.seq_pos_max(2) == -1
