"""The memoised primer on the real model and the real cache (SPEC M3).

WorkerCore + LlamaBackend + ClientCacheView over a real cache-meta: a cold
request decodes its prompt's last token alone and its finish row keeps that
decode's logits (the ``.kvc`` LOGITS record); an exact repeat restores the
row whole and samples its first token from those logits, decoding no prompt
row at all, and replies token for token and logprob for logprob as the cold
run. A row whose logits record is damaged is a miss, counted once, and the
request runs cold with the cold reply.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cache_view_support import Driver, Meta, real_context, real_driver, scratch_cache
from llamad.cache.client import CacheClient
from llamad.cache.kvc import parse_meta
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.llama_ffi import Context, ContextOptions, Model
from llamad.model.llama_backend import LlamaBackend
from llamad.model.planner import BatchPlan
from llamad.model.results import CacheHitKind, Completion

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

# Each test's prompt leaves the others' after a few tokens (the module shares
# one cache), so its first run is cold.
TEXT = (
    "<|im_start|>system\n{where} guide. You answer in one short sentence.<|im_end|>\n"
    "<|im_start|>user\nName a large animal that lives in the {where}."
    "<|im_end|>\n<|im_start|>assistant\n"
)
# Under 64 rows per decode a token's logits are bit-identical on the CPU
# whatever else shares the batch (ggml changes matmul path at 64 rows).
CHUNK = 15
SEEDED: dict[str, Any] = {"temperature": 0.9, "top_k": 40, "seed": 1234}


class CountingBackend(LlamaBackend):
    """A LlamaBackend that counts the rows it decoded and the stored-logits samples."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.rows = 0
        self.from_logits = 0

    def decode(self, plan: BatchPlan) -> None:
        super().decode(plan)
        self.rows += sum(len(s.tokens) for s in plan.spans)

    def sample_logits(self, sampler: Any, logits: bytes, logprobs: int | None) -> Any:
        self.from_logits += 1
        return super().sample_logits(sampler, logits, logprobs)


@pytest.fixture(scope="module")
def cache() -> Iterator[tuple[CacheSettings, Meta]]:
    with scratch_cache("lslb") as c:
        yield c


@pytest.fixture(scope="module")
def settings(cache: tuple[CacheSettings, Meta]) -> CacheSettings:
    return cache[0]


@pytest.fixture(scope="module")
def meta(cache: tuple[CacheSettings, Meta]) -> Meta:
    return cache[1]


@pytest.fixture(scope="module")
def ctx(model: Model) -> Iterator[Context]:
    c = real_context(model)
    yield c
    c.close()


@pytest.fixture
def worker(ctx: Context, settings: CacheSettings, meta: Meta) -> Iterator[Driver]:
    with real_driver(ctx, settings, CountingBackend(ctx), chunk=CHUNK) as drv:
        yield drv


def row_path(settings: CacheSettings, key: bytes) -> Path:
    with CacheClient.from_settings(settings, client_name="test-admin") as admin:
        row = admin.lookup_exact(key, pin=False)
        assert row is not None and row.tier is TierKind.RAM
        return Path(row.location)


def expected_prompt_logits(model: Model, tokens: list[int]) -> bytes:
    """The logits of the prompt's last token decoded alone after the rest, in
    a context of its own (what the cold path computes)."""
    with model.context(
        ContextOptions(n_ctx=1024, n_batch=32, n_ubatch=32, n_threads=1, n_threads_batch=1)
    ) as c:
        c.prefill(tokens[:-1])
        c.prefill(tokens[-1:])
        return c.logits(-1).tobytes()


def test_a_cold_finish_row_keeps_the_logits_of_its_prompts_end(
    worker: Driver, model: Model, settings: CacheSettings
) -> None:
    tokens = model.tokenize(TEXT.format(where="Sea"), parse_special=True)
    cold = worker.complete("cold", tokens, max_tokens=6)
    assert cold.cache_hit_kind is CacheHitKind.COLD and cold.finish_key is not None
    assert (cold.finish_key, True) in worker.saved
    kept = parse_meta(row_path(settings, cold.finish_key)).logits
    assert kept is not None
    assert kept.position == len(tokens) - 1
    assert kept.count == model.n_vocab
    assert kept.values == expected_prompt_logits(model, tokens)


@pytest.mark.parametrize("params", [{"temperature": 0.0}, SEEDED], ids=["greedy", "seeded"])
def test_an_exact_repeat_decodes_no_prompt_row_and_replies_as_the_cold_run(
    worker: Driver, model: Model, params: dict[str, Any]
) -> None:
    where = "Forest" if params is SEEDED else "Desert"
    tokens = model.tokenize(TEXT.format(where=where), parse_special=True)
    backend = worker.backend
    assert isinstance(backend, CountingBackend)
    cold = worker.complete("cold", tokens, max_tokens=10, logprobs=3, **params)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    rows, reads = backend.rows, worker.view.stats.reads_with_logits
    warm = worker.complete("warm", tokens, max_tokens=10, logprobs=3, **params)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.cache_delta.read == len(tokens)
    # No primer: the first token came from the row's logits, and every row
    # decoded since is a generated token (all but the last, never decoded).
    assert warm.stats.prefill_tokens == 0
    assert backend.from_logits == 1
    assert backend.rows - rows == len(warm.generated) - 1
    assert worker.view.stats.reads_with_logits == reads + 1
    assert worker.core.status().stored_logits_hits == 1
    assert warm.generated == cold.generated
    assert warm.reply == cold.reply
    assert warm.logprobs == cold.logprobs
    assert warm.logprobs is not None and len(warm.logprobs) == len(warm.generated)


def test_a_damaged_logits_record_is_a_miss_counted_once_and_the_request_runs_cold(
    worker: Driver, model: Model, settings: CacheSettings
) -> None:
    tokens = model.tokenize(TEXT.format(where="Mountain"), parse_special=True)
    cold = worker.complete("cold", tokens, max_tokens=8)
    assert cold.finish_key is not None
    path = row_path(settings, cold.finish_key)
    kept = parse_meta(path).logits
    assert kept is not None
    data = path.read_bytes()
    at = data.index(kept.values)
    assert data.index(kept.values[:4096]) == at  # the record, nowhere else
    with CacheClient.from_settings(settings, client_name="test-admin") as admin:
        corrupt = admin.counters()["corrupt_files"]
        # One byte of one logit changed, the rest of the file intact. The
        # worker keeps the segment mapped since its save: the damage shows through.
        with open(path, "r+b") as f:
            f.seek(at + len(kept.values) // 2 + 1)
            f.write(bytes([data[at + len(kept.values) // 2 + 1] ^ 0x40]))
        stats = worker.view.stats
        mapped, misses, with_logits = stats.reads_mapped, stats.read_misses, stats.reads_with_logits
        damaged = worker.complete("damaged", tokens, max_tokens=8)
        assert damaged.cache_hit_kind is CacheHitKind.COLD
        assert damaged.stats.prefill_tokens == len(tokens)
        assert damaged.generated == cold.generated and damaged.reply == cold.reply
        assert (stats.reads_mapped, stats.read_misses) == (mapped, misses + 1)
        assert stats.reads_with_logits == with_logits
        assert admin.counters()["corrupt_files"] == corrupt + 1
    assert worker.core.status().stored_logits_hits == 0
    # The damaged run saved the row again, logits and all: the next repeat hits it.
    again: Completion = worker.complete("again", tokens, max_tokens=8)
    assert again.cache_hit_kind is CacheHitKind.EXACT and again.stats.prefill_tokens == 0
    assert again.generated == cold.generated
