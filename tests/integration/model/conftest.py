"""Fixtures for the model layer against the real default model.

One Model is loaded per session; each test makes its own small contexts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llamad import paths
from llamad.llama_ffi import Context, ContextOptions, Model
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree


@pytest.fixture(scope="session")
def model_path() -> Path:
    return paths.default_model_path()


@pytest.fixture(scope="session")
def model(model_path: Path) -> Iterator[Model]:
    m = Model(model_path)
    yield m
    m.close()


@pytest.fixture
def make_ctx(model: Model) -> Iterator[Callable[..., Context]]:
    """Build small contexts (one thread: the machine's cores are shared); all
    are closed after the test."""
    made: list[Context] = []

    def make(**kwargs: object) -> Context:
        opts = {
            "n_ctx": 512,
            "n_batch": 256,
            "n_ubatch": 256,
            "n_threads": 1,
            "n_threads_batch": 1,
            **kwargs,
        }
        ctx = model.context(ContextOptions(**opts))  # type: ignore[arg-type]
        made.append(ctx)
        return ctx

    yield make
    for ctx in made:
        ctx.close()


@pytest.fixture(scope="module")
def tree(request: pytest.FixtureRequest) -> Iterator[WorkerTree]:
    """The module's worker tree (a real supervised worker), built from the
    ``TREE`` options the module sets, shared by its tests."""
    options = getattr(request.module, "TREE", None)
    if options is None:
        pytest.fail(f"{request.module.__name__} uses the tree fixture without setting TREE")
    t = WorkerTree(**options).start()
    try:
        yield t
    finally:
        t.close()


@pytest.fixture
def worker(tree: WorkerTree) -> Iterator[WorkerClient]:
    """A client of the tree's worker; the worker is idle again after the test."""
    w = tree.client()
    yield w
    tree.wait_idle()
