"""Driving a WorkerCore on the real model: LlamaBackend over a real context, MemoryCache.

Shared by the ``test_llama_backend_*`` modules. Each module makes one context
(one thread: the machine's cores are shared) and builds a fresh core, backend
and cache per test; :func:`fresh` empties the context's sequences first.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from llamad.cache.policy import CachePolicy
from llamad.llama_ffi import Context, ContextOptions, Model
from llamad.model.config import WorkerConfig
from llamad.model.core import WorkerCore
from llamad.model.llama_backend import LlamaBackend
from llamad.model.planner import BatchPlan
from llamad.model.requests import RequestParams
from llamad.model.results import Completion, DoneEvent, ErrorEvent, Event, TokenEvent
from llamad.model.stub_cache import MemoryCache

# Small numbers so that short prompts cross every save point.
POLICY = CachePolicy(
    min_tokens=8,
    cold_min_tokens=8,
    cold_max_tokens=10_000,
    continued_interval=64,
    boundary_trim_tokens=2,
    boundary_align_tokens=8,
    session_resume_wait_ms=200,
    evict_save_timeout_ms=5_000,
)

GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 8}

# On the CPU at this pin, a decode of 64 rows or more computes through another
# matmul path than a smaller one: the KV of a prompt prefilled in 64-row chunks
# differs from the same prompt prefilled in 32-row chunks (measured: the next
# logits move by 0.2 to 0.6), whatever the sequences sharing the batch. Below
# 64 rows, a token's logits are bit-identical whatever its neighbours in the
# batch or the KV pool. Chunks of 15 keep every tick of four sequences under 64
# rows, so warm, batched and solo runs compute the very same way.
CHUNK = 15


def context_options(**overrides: Any) -> ContextOptions:
    opts: dict[str, Any] = {
        "n_ctx": 1024,
        "n_batch": 256,
        "n_ubatch": 256,
        "n_seq_max": 4,
        "kv_unified": True,
        "n_threads": 1,
        "n_threads_batch": 1,
        **overrides,
    }
    return ContextOptions(**opts)


def open_context(model: Model, **overrides: Any) -> Context:
    return model.context(context_options(**overrides))


class CountingBackend(LlamaBackend):
    """A LlamaBackend that remembers every plan it decoded."""

    def __init__(self, ctx: Context, **kwargs: Any) -> None:
        super().__init__(ctx, **kwargs)
        self.plans: list[BatchPlan] = []

    def decode(self, plan: BatchPlan) -> None:
        super().decode(plan)
        self.plans.append(plan)

    def rows_for(self, seq: int) -> int:
        return sum(len(s.tokens) for p in self.plans for s in p.spans if s.seq == seq)


@dataclass
class Worker:
    core: WorkerCore
    backend: CountingBackend
    cache: MemoryCache
    events: dict[str, list[Event]] = field(default_factory=lambda: defaultdict(list))

    def submit(self, rid: str, tokens: Sequence[int], **params: Any) -> int | None:
        return self.core.submit(rid, tokens, RequestParams(**{**GREEDY, **params}))

    def step(self) -> None:
        for rid, ev in self.core.step().events:
            self.events[rid].append(ev)

    def run(self, timeout_s: float = 120.0) -> None:
        """Tick until no request is left (fails past ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while self.core.requests:
            assert time.monotonic() < deadline, (
                f"requests still running: {list(self.core.requests)}"
            )
            self.step()
        for rid, ev in self.core.drain().events:
            self.events[rid].append(ev)

    def result(self, rid: str) -> Completion:
        last = self.events[rid][-1]
        assert isinstance(last, DoneEvent), f"{rid} ended with {last!r}"
        return last.result

    def error(self, rid: str) -> ErrorEvent:
        last = self.events[rid][-1]
        assert isinstance(last, ErrorEvent), f"{rid} ended with {last!r}"
        return last

    def streamed_text(self, rid: str) -> str:
        return "".join(e.text for e in self.events[rid] if isinstance(e, TokenEvent))

    def complete(self, rid: str, tokens: Sequence[int], **params: Any) -> Completion:
        self.submit(rid, tokens, **params)
        self.run()
        return self.result(rid)

    def close(self) -> None:
        self.core.shutdown()
        self.backend.close()
        assert self.backend.pool.leased == 0


def fresh(ctx: Context, cache: MemoryCache | None = None, **config: Any) -> Worker:
    """A new core, backend and (unless given) cache over ``ctx``, emptied first.

    Most of these tests are about rows (restores, hits of each kind), so a
    finished request leaves no idle entry unless ``live_reuse=True`` is given:
    a repeat then restores from the cache instead of keeping the live KV."""
    ctx.clear()
    backend = CountingBackend(ctx)
    cache = cache if cache is not None else MemoryCache()
    cfg = WorkerConfig(
        n_ctx=ctx.n_ctx,
        n_batch=ctx.n_batch,
        n_seq_max=ctx.n_seq_max,
        **{"policy": POLICY, "prefill_chunk_size": CHUNK, "live_reuse": False, **config},
    )
    return Worker(WorkerCore(cfg, backend, cache), backend, cache)


def closing(worker: Worker) -> Iterator[Worker]:
    try:
        yield worker
    finally:
        worker.close()
