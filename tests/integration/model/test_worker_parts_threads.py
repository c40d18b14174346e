"""The real worker parts and the thread governor, in this process (SPEC M14):
``llama_parts`` hands the backend a governor on the registry's thread board,
holds a slot there until the parts are closed, and attaches the worker's
ggml threadpool only where the build has one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.llama_ffi import ContextOptions, threadpool
from llamad.model.config import WorkerConfig
from llamad.model.llama_backend import LlamaBackend
from llamad.model.thread_board import ThreadBoard
from llamad.model.threads import ThreadPolicy
from llamad.model.worker_parts import WorkerParts, llama_parts, thread_board_path
from llamad.model.worker_spec import WorkerSpec

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

SIZES = {"n_ctx": 256, "n_batch": 32, "n_seq_max": 1}


def spec(model_path: Path, root: Path) -> WorkerSpec:
    return WorkerSpec(
        model_id="parts",
        model_path=str(model_path),
        context=ContextOptions(
            **SIZES, n_ubatch=32, kv_unified=True, n_threads=1, n_threads_batch=1
        ),
        worker=WorkerConfig(**SIZES),
        registry_root=str(root),
        threads=ThreadPolicy(max_threads=1, cores=2, cooldown_s=3.0),
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "registry"
    r.mkdir(mode=0o700)
    return r


@pytest.fixture
def parts(model_path: Path, root: Path) -> Iterator[WorkerParts]:
    p = llama_parts(spec(model_path, root))
    try:
        yield p
    finally:
        p.close()


def test_the_backend_is_governed_by_the_specs_policy_on_the_registrys_board(
    parts: WorkerParts, root: Path
) -> None:
    backend = parts.backend
    assert isinstance(backend, LlamaBackend)
    assert parts.threads is not None and backend.governor is parts.threads
    assert parts.threads.policy == ThreadPolicy(max_threads=1, cores=2, cooldown_s=3.0)
    # The worker holds a slot on <registry>/threads.board: a second opener gets
    # another one, and sees the worker once it marks itself busy.
    with ThreadBoard(thread_board_path(root)) as other:
        assert other.slot is not None and other.slot > 0
        assert other.busy_workers(0.0) == 0
        parts.threads.threads_for(1)
        assert other.busy_workers(0.0) == 1


def test_closing_the_parts_gives_the_boards_slot_back(model_path: Path, root: Path) -> None:
    p = llama_parts(spec(model_path, root))
    assert p.threads is not None
    p.threads.threads_for(1)  # busy for a while yet
    p.close()
    with ThreadBoard(thread_board_path(root)) as after:
        assert after.slot == 0, "the closed worker's slot is still held"
        # Its mark (busy for a while yet) is left in an unlocked slot: not counted.
        assert after.busy_workers(0.0) == 0


def test_a_threadpool_is_attached_only_where_the_build_has_one(
    model_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = llama_parts(spec(model_path, root))
    try:
        backend = p.backend
        assert isinstance(backend, LlamaBackend)
        assert (backend.ctx.threadpool is None) == threadpool.openmp_build()
    finally:
        p.close()
    # A build without OpenMP: the worker's own sleeping pool, leased by the context.
    monkeypatch.setattr(threadpool, "openmp_build", lambda: False)
    p = llama_parts(spec(model_path, root))
    try:
        backend = p.backend
        assert isinstance(backend, LlamaBackend)
        pools = backend.ctx.threadpool
        assert pools is not None
        assert pools[0].options.poll == 0 and pools[0].n_threads == 1
    finally:
        p.close()
