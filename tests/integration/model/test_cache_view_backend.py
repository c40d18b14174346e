"""WorkerCore + LlamaBackend + ClientCacheView: the worker's three parts, real (SPEC M3, M5).

The real default model behind engineer A's backend, a real cache-meta behind
the view: a cold request is saved by the writer pool, its completion reaches
the core through the completions fd, and the same prompt then restores from
the ``ram`` tier in place and replies identically. Every packed state the
backend leased comes back to its pool once its write is over.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cache_view_support import Driver, Meta, real_context, real_driver, scratch_cache
from llamad.cache.client import CacheClient
from llamad.cache.kvc import KvcMeta, read_meta
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.llama_ffi import Context, Model
from llamad.model.llama_backend import LlamaBackend
from llamad.model.results import CacheHitKind

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

TEXT = (
    "<|im_start|>system\nYou answer in one short sentence.<|im_end|>\n"
    "<|im_start|>user\nWhat is the capital of France, and what river runs through it?"
    "<|im_end|>\n<|im_start|>assistant\n"
)
# Under 64 rows per decode, a token's logits on the CPU are bit-identical
# whatever else shares the batch (ggml changes matmul path at 64 rows).
CHUNK = 15


@pytest.fixture(scope="module")
def cache() -> Iterator[tuple[CacheSettings, Meta]]:
    with scratch_cache("lcvb") as c:
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
    with real_driver(ctx, settings, LlamaBackend(ctx), chunk=CHUNK) as drv:
        yield drv


def test_cold_then_exact_hit_on_the_real_model_through_the_real_cache(
    worker: Driver, model: Model, settings: CacheSettings
) -> None:
    tokens = model.tokenize(TEXT, parse_special=True)
    cold = worker.complete("cold", tokens, max_tokens=12)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    assert cold.finish_key is not None and (cold.finish_key, True) in worker.saved
    assert worker.backend.pool.leased == 0  # released as each write finished
    with CacheClient.from_settings(settings, client_name="test-admin") as admin:
        row = admin.lookup_exact(cold.finish_key, pin=False)
        assert row is not None and row.tier is TierKind.RAM

    warm = worker.complete("warm", tokens, max_tokens=12)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.reply == cold.reply and warm.generated == cold.generated
    # The finish row keeps the prompt's last logits: nothing decoded before
    # the first token (tests/integration/model/test_stored_logits_backend.py).
    assert warm.stats.prefill_tokens == 0
    assert warm.cache_delta.read == len(tokens)
    assert worker.view.stats.reads_mapped == 1


def test_a_salted_request_does_not_see_the_shared_rows_but_replies_the_same(
    worker: Driver, model: Model
) -> None:
    tokens = model.tokenize(TEXT + "Paris", parse_special=True)
    shared = worker.complete("shared", tokens, max_tokens=8)
    tenant = worker.complete("tenant", tokens, max_tokens=8, cache_salt="acme")
    assert tenant.cache_hit_kind is CacheHitKind.COLD
    assert tenant.reply == shared.reply
    assert tenant.finish_key != shared.finish_key
    again = worker.complete("tenant-again", tokens, max_tokens=8, cache_salt="acme")
    assert again.cache_hit_kind is CacheHitKind.EXACT and again.reply == shared.reply


class CountingUnpacks(LlamaBackend):
    """The real backend, counting the states handed to llama.cpp."""

    unpacks = 0

    def unpack(self, seq: int, payload: memoryview) -> None:
        self.unpacks += 1
        super().unpack(seq, payload)


def _k_value(meta: KvcMeta) -> int:
    # Inside the first layer's K rows: past llama.cpp's 8-byte prefix, the
    # stream and cell counts, the cells (12 bytes each), v_trans and n_layer,
    # and the layer's type and row size (llama_ffi.state_layout).
    return meta.payload_offset + 16 + 12 * meta.n_tokens + 8 + 12 + 10


def _position(meta: KvcMeta) -> int:
    return meta.payload_offset + 16 + 12 * 3  # cell 3's position


@pytest.mark.parametrize(
    "case",
    [
        # A K value: the row's layout checks out, so llama.cpp unpacks it
        # while its checksum runs; the check then fails and its cells go.
        ("k_value", "Answer in French.", 1),
        # A cell's position, which llama.cpp's reader takes as it comes:
        # the layout check refuses it and the checksum is awaited first.
        ("position", "Answer in Spanish.", 0),
        # An eighth of the file as 0x7f, over layer headers: refused the same
        # way (before issue 8's check, a run like it crashed the process).
        ("run", "Answer in German.", 0),
    ],
    ids=["k_value", "position", "run"],
)
def test_a_ram_payload_damaged_under_its_mapping_is_never_served(
    ctx: Context, model: Model, settings: CacheSettings, case: tuple[str, str, int]
) -> None:
    where, question, unpacked = case
    backend = CountingUnpacks(ctx)
    with real_driver(ctx, settings, backend, chunk=CHUNK) as worker:
        tokens = model.tokenize(TEXT + question, parse_special=True)
        cold = worker.complete("cold", tokens, max_tokens=12)
        assert cold.finish_key is not None
        with CacheClient.from_settings(settings, client_name="test-admin") as admin:
            row = admin.lookup_exact(cold.finish_key, pin=False)
            assert row is not None and row.tier is TierKind.RAM
            corrupt = admin.counters()["corrupt_files"]
            # The worker mapped the segment when it saved it and keeps the
            # mapping: damage to the file shows through it.
            path = Path(row.location)
            with open(path, "r+b") as f:
                meta = read_meta(f.fileno())
                size = path.stat().st_size
                if where == "run":
                    f.seek(int(size * 0.75))
                    f.write(b"\x7f" * (size // 8))
                else:
                    at = _k_value(meta) if where == "k_value" else _position(meta)
                    f.seek(at)
                    byte = f.read(1)[0]
                    f.seek(at)
                    f.write(bytes((byte ^ 0x55,)))
            stats = worker.view.stats
            mapped, misses = stats.reads_mapped, stats.read_misses
            backend.unpacks = 0
            damaged = worker.complete("damaged", tokens, max_tokens=12)
            assert damaged.cache_hit_kind is CacheHitKind.COLD
            assert damaged.generated == cold.generated
            assert backend.unpacks == unpacked
            assert (stats.reads_mapped, stats.read_misses) == (mapped, misses + 1)
            assert admin.counters()["corrupt_files"] == corrupt + 1
