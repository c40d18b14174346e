"""A request's stats time what they name: the first token exists once its logits do."""

from __future__ import annotations

import time

import pytest

from llamad.model.planner import BatchPlan
from llamad.model.requests import RequestParams
from llamad.model.results import CacheHitKind
from llamad.model.stub import StubBackend
from llamad.model.stub_cache import MemoryCache
from llamad.model.wire import InferBody
from llamad.model.worker_ops import _waited
from worker_harness import Clock, make, prompt

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


def test_queue_ms_counts_from_when_the_client_sent_the_request() -> None:
    """A request read after a tick that was already running when it arrived
    waited that tick: its client's send time puts the wait in queue_ms."""
    h = make()
    h.submit("a", prompt(10), max_tokens=2)
    h.core.submit("b", prompt(10, start=9), RequestParams(max_tokens=2), waited_s=0.25)
    h.run()
    assert h.result("a").stats.queue_ms < 250.0
    assert h.result("b").stats.queue_ms >= 250.0


def test_only_a_plausible_send_time_from_this_host_is_taken() -> None:
    now = time.monotonic()
    sent = InferBody(prompt="x", sent_at=now - 0.5)
    assert 0.5 <= _waited(sent, local=True) < 60.0
    assert _waited(sent, local=False) == 0.0  # another host's clock means nothing here
    assert _waited(InferBody(prompt="x"), local=True) == 0.0
    assert _waited(InferBody(prompt="x", sent_at=now + 30.0), local=True) == 0.0
    assert _waited(InferBody(prompt="x", sent_at=float("nan")), local=True) == 0.0
    assert _waited(InferBody(prompt="x", sent_at=now - 10_000.0), local=True) == 0.0
