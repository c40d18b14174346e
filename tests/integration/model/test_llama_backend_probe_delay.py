"""The abort check's first probe: late for a generation step, early for a prompt chunk.

A probe for cancels runs on the decoding thread between graph nodes while
the other threads wait, and costs ~20-35 us: a 4-stream generation step of
~20 ms here paid 120-140 us of them with the first probe at 10 ms. So a
generation step (one row per sequence) probes only once it has run
``GENERATION_FIRST_PROBE_S``; a step with a prompt chunk still probes from
10 ms, so that a cancel mid-prefill does not wait for its chunk (issue 21).
On the real model and context.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from llamad.llama_ffi import Batch, Context, Model
from llamad.model.llama_backend import GENERATION_FIRST_PROBE_S, LlamaBackend
from llamad.model.planner import BatchPlan, Span

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

TEXT = (
    "The lighthouse stood on the rocks above the bay, white against the grey sky, "
    "and every night its lamp turned slowly over the dark water while the keeper "
    "wrote the weather into a book that nobody would ever read again."
)


@pytest.fixture
def ctx(make_ctx: Callable[..., Context]) -> Context:
    return make_ctx(n_ctx=1024, n_seq_max=2, kv_unified=True, n_threads=1, n_threads_batch=1)


@pytest.fixture
def backend(ctx: Context) -> Iterator[LlamaBackend]:
    b = LlamaBackend(ctx)
    yield b
    b.close()


def spy_first_probe(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """Each decode's ``first_probe_s``, as the backend passed it."""
    seen: list[float | None] = []
    real = ctx.decode

    def decode(batch: Batch, **kwargs: Any) -> None:
        seen.append(kwargs.get("first_probe_s"))
        real(batch, **kwargs)

    monkeypatch.setattr(ctx, "decode", decode)
    return seen


def test_a_generation_step_probes_late_and_a_prompt_chunk_early(
    ctx: Context, backend: LlamaBackend, model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = spy_first_probe(ctx, monkeypatch)
    tokens = model.tokenize(TEXT, add_special=False)
    # Two prompts (chunks: several rows each), then a step of one row each.
    backend.decode(
        BatchPlan(
            (
                Span(seq=0, pos=0, tokens=tuple(tokens[:20]), want_logits=True),
                Span(seq=1, pos=0, tokens=tuple(tokens[:12]), want_logits=True),
            )
        )
    )
    backend.decode(
        BatchPlan(
            (
                Span(seq=0, pos=20, tokens=(tokens[20],), want_logits=True),
                Span(seq=1, pos=12, tokens=(tokens[12],), want_logits=True),
            )
        )
    )
    # A generation step beside another sequence's prompt chunk is a chunk's step.
    backend.decode(
        BatchPlan(
            (
                Span(seq=0, pos=21, tokens=(tokens[21],), want_logits=True),
                Span(seq=1, pos=13, tokens=tuple(tokens[13:30]), want_logits=True),
            )
        )
    )
    assert seen == [None, GENERATION_FIRST_PROBE_S, None]


def test_the_first_probe_waits_for_its_delay_in_a_real_decode(ctx: Context, model: Model) -> None:
    """``Context.decode(first_probe_s=)`` holds the probe back: a prompt of
    256 rows on 1 thread (~0.1 s here) probes with no delay and, with a delay
    of a minute, never."""
    calls: list[int] = []

    def probe() -> bool:
        calls.append(1)
        return False  # never stops the decode

    ctx.set_abort_probe(probe, every_s=0.001)
    tokens = (model.tokenize(TEXT, add_special=False) * 16)[:256]
    batch = Batch(ctx.n_batch)
    try:
        for seq, delay in ((0, 0.0), (1, 60.0)):
            before = len(calls)
            batch.clear()
            batch.add_tokens(tokens, seq, 0, logits_last=True)
            ctx.decode(batch, first_probe_s=delay)
            probed = len(calls) - before
            if delay == 0.0:
                assert probed > 0, "with no delay the probe runs from the first node"
            else:
                assert probed == 0, f"the probe ran {probed} times within its delay"
    finally:
        ctx.set_abort_probe(None)
        batch.close()
