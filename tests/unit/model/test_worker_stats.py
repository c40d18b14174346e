"""A request's stats time what they name: the first token exists once its logits do."""

from __future__ import annotations

import pytest
from worker_harness import Clock, make, prompt

from llamad.model.planner import BatchPlan
from llamad.model.results import CacheHitKind
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache

pytestmark = pytest.mark.timeout(30)

DECODE_S = 0.5  # every decode takes this long on the injected clock


class SlowBackend(StubBackend):
    """The stub, with every decode taking DECODE_S of the test's clock."""

    def __init__(self, clock: Clock) -> None:
        super().__init__(n_ctx=1024, n_batch=64, n_seq_max=2)
        self.clock = clock

    def decode(self, plan: BatchPlan) -> None:
        super().decode(plan)
        self.clock.advance(DECODE_S)


def test_prefill_ms_counts_the_decode_that_computes_the_first_tokens_logits() -> None:
    clock = Clock()
    # Rows without kept logits (and no idle entry, whose KV comes with them):
    # the warm path decodes the held-back token.
    h = make(
        backend=SlowBackend(clock),
        clock=clock,
        chunk=16,
        cache=MemoryCache(keep_logits=False),
        live_reuse=False,
    )
    # 20 tokens: 16, then 3, then the held-back last token alone: three decodes.
    cold = h.complete("cold", prompt(20), max_tokens=3)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert cold.stats.prefill_ms >= 3 * DECODE_S * 1000
    # Two more decodes (the first and second sampled tokens) before the third is sampled.
    assert cold.stats.generation_ms >= 2 * DECODE_S * 1000

    warm = h.complete("warm", prompt(20), max_tokens=1)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.stats.prefill_tokens == 1
    # The held-back token is decoded again: that decode is the warm path's prefill.
    assert warm.stats.prefill_ms >= DECODE_S * 1000
