"""Pooled embeddings, batched over sequences, optionally L2-normalised (SPEC L9)."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

import tolerances
from llamad.llama_ffi import (
    BatchTooLarge,
    Context,
    EmbeddingsUnavailable,
    InvalidSequence,
    Model,
    PoolingType,
)

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

MakeCtx = Callable[..., Context]


def _norm(v: list[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in v))


def test_same_text_twice_gives_identical_vectors(model: Model, make_ctx: MakeCtx) -> None:
    ctx = make_ctx(embeddings=True, pooling=PoolingType.MEAN, n_seq_max=2)
    toks = model.tokenize("The cat sat on the mat.")
    first = ctx.embed([toks])[0]
    again = ctx.embed([toks])[0]
    assert len(first) == model.n_embd
    assert first == again


def test_normalised_vectors_have_unit_norm(model: Model, make_ctx: MakeCtx) -> None:
    ctx = make_ctx(embeddings=True, pooling=PoolingType.MEAN, n_seq_max=4)
    texts = ["short", "A somewhat longer sentence about the weather.", "数字 123 🦙"]
    for vec in ctx.embed([model.tokenize(t) for t in texts]):
        assert abs(_norm(vec) - 1.0) <= 1e-5
    raw = ctx.embed([model.tokenize("short")], normalize=False)[0]
    assert abs(_norm(raw) - 1.0) > 1e-3


@pytest.mark.parametrize("kv_unified", [False, True])
def test_batched_embeddings_match_one_at_a_time(
    model: Model, make_ctx: MakeCtx, kv_unified: bool
) -> None:
    ctx = make_ctx(embeddings=True, pooling=PoolingType.MEAN, n_seq_max=4, kv_unified=kv_unified)
    # Different lengths: with separate KV streams llama.cpp would split them
    # across ubatches and pool only part of the longer input.
    inputs = [
        model.tokenize(t)
        for t in ("alpha beta", "gamma delta epsilon", "zeta", "eta theta iota kappa")
    ]
    together = ctx.embed(inputs)
    alone = [ctx.embed([toks])[0] for toks in inputs]
    # Alone, an input runs through other kernels than in a batch on a GPU.
    tolerance = tolerances.embedding_tolerance()
    for a, b in zip(together, alone, strict=True):
        assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < tolerance
    assert together[0] != together[1]
    # The same batch again takes the same path: identical on every backend.
    assert ctx.embed(inputs) == together


def test_generation_context_with_pooling_can_embed_and_stays_clean(
    model: Model, make_ctx: MakeCtx
) -> None:
    ctx = make_ctx(pooling=PoolingType.MEAN, n_seq_max=2)
    vec = ctx.embed([model.tokenize("embed me")], seq_ids=[1])[0]
    assert abs(_norm(vec) - 1.0) <= 1e-5
    assert ctx.seq_pos_max(1) == -1
    ctx.prefill(model.tokenize("and generation still works"))
    assert ctx.output_rows


def test_context_without_pooling_cannot_embed(model: Model, make_ctx: MakeCtx) -> None:
    ctx = make_ctx(embeddings=True, pooling=PoolingType.NONE)
    with pytest.raises(EmbeddingsUnavailable):
        ctx.embed([model.tokenize("x")])


def test_embedding_needs_empty_sequences_and_inputs_within_a_ubatch(
    model: Model, make_ctx: MakeCtx
) -> None:
    ctx = make_ctx(pooling=PoolingType.MEAN, n_seq_max=2, n_ubatch=64, n_batch=128)
    ctx.prefill([1, 2, 3], seq_id=0)
    with pytest.raises(InvalidSequence):
        ctx.embed([model.tokenize("busy")], seq_ids=[0])
    with pytest.raises(BatchTooLarge):
        ctx.embed([list(range(100, 200))], seq_ids=[1])
