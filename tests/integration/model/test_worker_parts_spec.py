"""The real worker parts take what the spec says (issue 8): the cache view's
tiers come from ``WorkerSpec.cache_view``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.llama_ffi import ContextOptions
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.client_cache_view import ClientCacheView
from llamad.model.config import WorkerConfig
from llamad.model.threads import ThreadPolicy
from llamad.model.worker_parts import llama_parts
from llamad.model.worker_spec import WorkerSpec
from llamad.testing import MetaProcess, discard_scratch, scratch_settings

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

SIZES = {"n_ctx": 256, "n_batch": 32, "n_seq_max": 1}


def spec(model_path: Path, settings: CacheSettings | None, **kw: object) -> WorkerSpec:
    fields: dict[str, object] = {
        "model_id": "parts",
        "model_path": str(model_path),
        "context": ContextOptions(
            **SIZES, n_ubatch=32, kv_unified=True, n_threads=1, n_threads_batch=1
        ),
        "worker": WorkerConfig(**SIZES),
        "cache": settings,
        "threads": ThreadPolicy(max_threads=1, cores=2),
        **kw,
    }
    return WorkerSpec(**fields)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def settings() -> Iterator[CacheSettings]:
    s = scratch_settings(prefix="lwps")
    meta = MetaProcess(s).start()
    try:
        yield s
    finally:
        meta.stop()
        discard_scratch(s)


def test_the_cache_view_saves_and_restores_where_the_spec_says(
    model_path: Path, settings: CacheSettings
) -> None:
    disk = CacheViewConfig(save_tier=TierKind.DISK, restore_tiers=frozenset({TierKind.DISK}))
    parts = llama_parts(spec(model_path, settings, cache_view=disk))
    try:
        view = parts.cache
        assert isinstance(view, ClientCacheView)
        assert view.config == disk
        assert view.restore_tiers == frozenset({TierKind.DISK})
    finally:
        parts.close()
