"""LlamaBackend on the real model: batch rows, sequence ops, packed states (SPEC L5, L7, L12)."""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import tolerances
from llama_backend_harness import open_context
from llamad.llama_ffi import Batch, Closed, Context, InvalidToken, Model, StateError
from llamad.model.llama_backend import LlamaBackend
from llamad.model.planner import BatchPlan, Span

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

TEXTS = (
    "The lighthouse stood on the rocks above the bay, white against the grey sky",
    "Two plus two is four, and three plus three is six, and four plus four is",
    "My favourite fruit is the mango because it is sweet and ripe in the summer",
    "In the beginning there was only the sea, and the sea was cold and very dark",
)


@pytest.fixture(scope="module")
def ctx(model: Model) -> Iterator[Context]:
    c = open_context(model)
    yield c
    c.close()


@pytest.fixture
def backend(ctx: Context) -> Iterator[LlamaBackend]:
    ctx.clear()
    b = LlamaBackend(ctx)
    yield b
    b.close()
    assert b.pool.leased == 0


def _tokens(model: Model, text: str) -> list[int]:
    return model.tokenize(text, add_special=False)


def _logits_alone(ctx: Context, prefix: list[int], span: list[int]) -> bytes:
    """The logits of ``span``'s last row when ``prefix`` then ``span`` run in sequence 0 alone."""
    ctx.clear()
    with Batch(64) as batch:
        batch.add_tokens(prefix, 0, 0, logits_last=False)
        ctx.decode(batch)
        batch.clear()
        batch.add_tokens(span, 0, len(prefix), logits_last=True)
        ctx.decode(batch)
        out = ctx.logits(batch.output_rows[-1]).tobytes()
    ctx.clear()
    return out


def _next_logits(ctx: Context, seq: int, token: int, pos: int) -> bytes:
    with Batch(1) as batch:
        row = batch.add(token, pos, seq, logits=True)
        ctx.decode(batch)
        return ctx.logits(row).tobytes()


def test_each_sequence_is_sampled_from_its_own_plan_row(
    model: Model, ctx: Context, backend: LlamaBackend
) -> None:
    seqs = [_tokens(model, t) for t in TEXTS]
    assert min(len(s) for s in seqs) >= 11
    prefixes = [s[:6] for s in seqs]
    # Row order: a prefill chunk without logits, a one-token decode, a chunk
    # with logits, another decode: logits at rows 4, 9 and 10.
    spans = [
        Span(2, 6, tuple(seqs[2][6:10]), False),
        Span(0, 6, (seqs[0][6],), True),
        Span(3, 6, tuple(seqs[3][6:11]), True),
        Span(1, 6, (seqs[1][6],), True),
    ]
    plan = BatchPlan(tuple(spans))
    for seq, prefix in enumerate(prefixes):
        ctx.prefill(prefix, seq)
    backend.decode(plan)
    got = {s.seq: ctx.logits(plan.output_row(s.seq)).tobytes() for s in spans if s.want_logits}
    assert [plan.output_row(s) for s in (0, 3, 1)] == [4, 9, 10]
    for span in spans:
        if not span.want_logits:
            continue
        alone = _logits_alone(ctx, prefixes[span.seq], list(span.tokens))
        if tolerances.exact():
            assert got[span.seq] == alone, f"sequence {span.seq} got another row's logits"
    assert len(set(got.values())) == 3


def test_decode_refuses_a_token_outside_the_vocabulary(model: Model, backend: LlamaBackend) -> None:
    plan = BatchPlan((Span(0, 0, (1, model.n_vocab), True),))
    with pytest.raises(InvalidToken):
        backend.decode(plan)


def test_truncated_sequence_continues_like_a_fresh_prefill(
    model: Model, ctx: Context, backend: LlamaBackend
) -> None:
    head = _tokens(model, "A quiet harbour at dawn,")
    tail = _tokens(model, " with gulls and nets and boats")
    nxt = _tokens(model, " where")[0]
    ctx.prefill(head)
    want = _next_logits(ctx, 0, nxt, len(head))
    ctx.clear()
    ctx.prefill(head + tail)
    backend.seq_truncate(0, len(head))
    assert ctx.seq_pos_max(0) == len(head) - 1
    got = _next_logits(ctx, 0, nxt, len(head))
    if tolerances.exact():
        assert got == want
    backend.seq_truncate(0, 0)
    assert ctx.seq_pos_max(0) == -1


def test_copied_sequence_continues_like_its_source(
    model: Model, ctx: Context, backend: LlamaBackend
) -> None:
    prompt = _tokens(model, "Rain fell on the old tin roof")
    nxt = _tokens(model, " and")[0]
    ctx.prefill(prompt, 1)
    backend.seq_copy(1, 2)
    assert ctx.seq_pos_max(2) == len(prompt) - 1
    a = _next_logits(ctx, 1, nxt, len(prompt))
    b = _next_logits(ctx, 2, nxt, len(prompt))
    if tolerances.exact():
        assert a == b


def test_packed_state_restores_into_another_sequence_and_the_buffer_is_reused(
    model: Model, ctx: Context, backend: LlamaBackend
) -> None:
    prompt = _tokens(model, TEXTS[0] + " " + TEXTS[1])
    nxt = _tokens(model, " so")[0]
    ctx.prefill(prompt, 0)
    state = backend.pack(0)
    assert state.nbytes == ctx.seq_state_size(0)
    assert backend.pool.leased == 1
    backend.unpack(3, state.view())
    state.release()
    assert backend.pool.leased == 0
    assert ctx.seq_pos_max(3) == len(prompt) - 1
    a = _next_logits(ctx, 0, nxt, len(prompt))
    b = _next_logits(ctx, 3, nxt, len(prompt))
    if tolerances.exact():
        assert a == b
    mapped = backend.pool.mapped
    again = backend.pack(3)
    assert backend.pool.mapped == mapped  # the idle buffer was leased again
    again.release()


def test_unpack_reads_a_read_only_mapping_in_place(
    model: Model, ctx: Context, backend: LlamaBackend, tmp_path: Path
) -> None:
    prompt = _tokens(model, TEXTS[2])
    ctx.prefill(prompt, 1)
    with backend.pack(1) as state:
        path = tmp_path / "row.kv"
        path.write_bytes(state.view())
    with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        view = memoryview(mm)
        try:
            backend.unpack(2, view)
        finally:
            view.release()
    assert ctx.seq_pos_max(2) == len(prompt) - 1


def test_a_lease_released_from_a_writer_thread_returns_to_the_pool(
    model: Model, ctx: Context, backend: LlamaBackend
) -> None:
    ctx.prefill(_tokens(model, TEXTS[3]), 0)
    states = [backend.pack(0) for _ in range(3)]
    assert backend.pool.leased == 3
    payload = bytes(states[0].view())
    writers = [threading.Thread(target=s.release) for s in states]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=10)
    assert backend.pool.leased == 0
    states[0].release()  # a second release is harmless
    assert backend.pool.leased == 0
    with pytest.raises(Closed):
        states[0].view()
    assert backend.pool.idle <= backend.pool.max_idle
    with backend.pack(0) as again:
        assert bytes(again.view()) == payload


def test_a_damaged_state_is_refused_and_leaves_the_sequence_empty(
    model: Model, ctx: Context, backend: LlamaBackend
) -> None:
    ctx.prefill(_tokens(model, TEXTS[1]), 0)
    with backend.pack(0) as state:
        damaged = bytearray(state.view())
    del damaged[len(damaged) // 2 :]
    ctx.prefill(_tokens(model, "something else"), 2)
    with pytest.raises(StateError):
        backend.unpack(2, memoryview(damaged))
    assert ctx.seq_pos_max(2) == -1


def test_special_tokens_render_as_their_text_and_eog_is_known(
    model: Model, backend: LlamaBackend
) -> None:
    # A chat template's markers must reach the stop and marker matchers as text.
    assert backend.piece(model.bos) == b"<|im_start|>"
    assert backend.piece(_tokens(model, " hello")[0]) == b" hello"
    assert backend.is_eog(2) and backend.is_eog(model.eos)
    assert not backend.is_eog(model.bos)
    assert backend.n_vocab == model.n_vocab == 49_152
