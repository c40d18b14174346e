"""Shared fixtures for the llama_ffi tests against the real default model.

One Model is loaded per session; each test makes its own small contexts
(cheap: tens of milliseconds), so tests never share KV state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from llamad import paths
from llamad.llama_ffi import Context, ContextOptions, Model, Sampler, SamplerParams

PROMPT = (
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nWrite two sentences about the sea.<|im_end|>\n"
    "<|im_start|>assistant\n"
)

Greedy = Callable[..., list[int]]


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
    """Build contexts with small defaults; all are closed after the test."""
    made: list[Context] = []

    def make(**kwargs: object) -> Context:
        # One thread: tests share two cores with other suites, and ggml's spinning
        # thread barriers slow down badly when a core is taken away.
        opts = {
            "n_ctx": 1024,
            "n_batch": 512,
            "n_ubatch": 512,
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


@pytest.fixture(scope="session")
def prompt_tokens(model: Model) -> list[int]:
    return model.tokenize(PROMPT, parse_special=True)


@pytest.fixture
def greedy(model: Model) -> Greedy:
    """Prefill ``tokens`` into ``seq`` and return ``n`` greedy tokens (no EOG stop)."""

    def run(ctx: Context, tokens: Sequence[int], n: int, seq: int = 0) -> list[int]:
        ctx.prefill(list(tokens), seq_id=seq)
        with Sampler(model, SamplerParams(greedy=True)) as sampler:
            return ctx.generate(sampler, n, seq_id=seq, stop_at_eog=False)

    return run
