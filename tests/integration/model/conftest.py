"""Fixtures for the model layer against the real default model.

One Model is loaded per session; each test makes its own small contexts. The
LoRA adapter writer is the binding tests' own helper, shared rather than copied.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llamad import paths
from llamad.llama_ffi import Context, ContextOptions, Model

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llama_ffi"))


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
