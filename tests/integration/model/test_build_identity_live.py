"""The libllama build in the cache namespace, with the real library (SPEC C1, C12).

The build identity is read from the loaded libraries and the extension's
build record: another process of the same build must read the same identity
and make the same namespace, and a row saved by another build (a namespace
made with one build component changed, as a future llama.cpp or a GPU build
would make it) must be a miss on every tier, never restored.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from cache_view_support import BufferState, Meta, scratch_cache, settle_saves
from llamad.cache.client import CacheClient
from llamad.cache.kvc import SaveReason
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind
from llamad.llama_ffi import Context, Model, StateBuffer
from llamad.llama_ffi.build_info import build_identity
from llamad.model import identity
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.client_cache_view import ClientCacheView
from llamad.model.savepoints import SaveJob
from llamad.testing import wait_until

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

MakeCtx = Callable[..., Context]

TEXT = (
    "<|im_start|>user\nWhich build computed this state, and may another one restore it? "
    "Answer in one sentence about caches and compilers.<|im_end|>\n<|im_start|>assistant\n"
)

# What the child reads: the same default model and context options as make_ctx.
CHILD = """
import json
from llamad import paths
from llamad.llama_ffi import ContextOptions, Model
from llamad.llama_ffi.build_info import build_identity
from llamad.model.identity import namespace

opts = ContextOptions(n_ctx=512, n_batch=256, n_ubatch=256, n_threads=1, n_threads_batch=1)
with Model(paths.default_model_path()) as model, model.context(opts) as ctx:
    build = build_identity()
    header = namespace(ctx).header().hex()
line = {"build": build.hex, "components": build.as_dict(), "header": header}
print("RESULT " + json.dumps(line))
"""


def test_the_build_identity_and_namespace_are_the_same_in_another_process(
    make_ctx: MakeCtx,
) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=240, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    child = json.loads(line.removeprefix("RESULT "))
    here = build_identity()
    assert child["components"] == here.as_dict()
    assert child["build"] == here.hex
    assert child["header"] == identity.namespace(make_ctx(n_ctx=512)).header().hex()


@pytest.fixture(scope="module")
def cache() -> Iterator[tuple[CacheSettings, Meta]]:
    with scratch_cache("lbi") as pair:
        yield pair


@pytest.fixture
def admin(cache: tuple[CacheSettings, Meta]) -> Iterator[CacheClient]:
    settings, meta = cache
    meta.ensure()
    with CacheClient.from_settings(settings, client_name="test-admin") as client:
        yield client


def worker_ctx(make_ctx: MakeCtx) -> Context:
    return make_ctx(n_ctx=1024, n_seq_max=2, kv_unified=True)


def test_a_row_saved_under_another_build_is_a_miss_on_every_tier_never_restored(
    model: Model, make_ctx: MakeCtx, cache: tuple[CacheSettings, Meta], admin: CacheClient
) -> None:
    settings, meta = cache
    source, target = worker_ctx(make_ctx), worker_ctx(make_ctx)
    tokens = model.tokenize(TEXT, parse_special=True)
    head = tokens[:-1]
    source.prefill(head, seq_id=0)
    buffer = StateBuffer(source.seq_state_size(0))
    nbytes = source.pack_seq(0, buffer)

    # The same model, context and tokens, computed by "another build": a
    # llama.cpp whose saved state format may differ.
    other_build = build_identity().with_components(
        pin="llama.cpp 9f1e2d3 (llama-cpp-python 0.3.40)"
    )
    other = identity.namespace(source, build=other_build)
    writers = {
        tier: ClientCacheView.from_settings(
            settings, source, config=CacheViewConfig(save_tier=tier)
        )
        for tier in (TierKind.RAM, TierKind.DISK)
    }
    reader = ClientCacheView.from_settings(settings, target)
    try:
        live = reader.namespace(None)
        assert other != live and other.fingerprint == live.fingerprint
        assert other.key(head) != live.key(head)

        saved = []
        for tier, view in writers.items():
            job = SaveJob(SaveReason.FINISH, other.key(head), other, tuple(head), seq=0)
            if tier is TierKind.DISK:
                # One key lives in one tier: move the ram row out first.
                admin.evict_bytes(1 << 40, tiers=[TierKind.RAM])
            assert view.save(job, BufferState(buffer, nbytes))
            assert settle_saves(view) == [(job.key, True)]
            row = admin.lookup_exact(job.key, pin=False)
            assert row is not None and row.tier is tier  # the row is there...
            saved.append(job.key)

            found = reader.resolve(live, tokens, parent_key=None, wait_s=0.0)
            # ...and invisible: not a hit, not even a common prefix.
            assert found.row is None and found.use_tokens == 0, tier
            assert found.common_tokens == 0 and found.common_key is None, tier

        # cache-meta restarted adopts the disk row from its file (parse
        # recomputes the key from the TLV, which records the other build's
        # ctx_hash): still the other namespace's row, still a miss.
        meta.restart()
        assert admin.lookup_exact(saved[-1], pin=False) is not None
        found = reader.resolve(live, tokens, parent_key=None, wait_s=0.0)
        assert found.row is None and found.common_tokens == 0
        assert reader.stats.reads_mapped == reader.stats.reads_copied == 0
        assert target.next_pos(1) == 0  # nothing was restored into the reader's context

        # The same bytes saved under this build's namespace are found at once.
        job = SaveJob(SaveReason.FINISH, live.key(head), live, tuple(head), seq=0)
        assert writers[TierKind.DISK].save(job, BufferState(buffer, nbytes))
        assert settle_saves(writers[TierKind.DISK]) == [(job.key, True)]
        hit = reader.resolve(live, tokens, parent_key=None, wait_s=0.0)
        assert hit.row is not None and hit.use_tokens == len(head)
        reader.checkin(hit.row.pin)
        wait_until(lambda: admin.status()["pins"] == 0, "the checkin", 10)
    finally:
        reader.close()
        for view in writers.values():
            view.close()
