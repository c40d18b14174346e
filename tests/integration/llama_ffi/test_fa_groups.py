"""A decode's logits do not depend on its thread count or on other sequences'
cells (llamad's llama.cpp patch 0003; SPEC M19).

At the pin, ggml-cpu split a one-row decode over 512 or more KV cells into
``n_threads`` equal chunks of the KV view: 2 threads against 1 moved the next
logits by up to 0.96 after a 700-token prompt, and 0.65 more when another
sequence held 600 cells (the view, and so the chunks, grew). The patch sums
every row in groups of 256 of its own unmasked cells, whatever the thread
count or the view; the decode split computes the groups on several threads.

These tests decode one token on two threads (the count under test) after
prefilling on one, in 63-row chunks; each fails on the unpatched library. The last one runs in
a child process with ``GGML_CPU_FA_TILED=0`` (read once per process): with
the tiled prompt path off, a prompt's logits no longer depend on how it was
chunked or on where its cells sit.

Each logits vector is computed once per module: ``solo`` (one thread) and
``two_threads`` (the same fresh fill, two threads) are what several tests
compare against. The child of the last test starts with the module and runs
beside the others (it is one thread, as each in-process prefill is): on two
cores it no longer adds its ~40 s after theirs.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO

import pytest

from llamad.llama_ffi import Batch, Context, ContextOptions, Model

pytestmark = pytest.mark.timeout(300)

TEXT = (
    "In a quiet harbour town of grey stone houses, the old lighthouse keeper "
    "kept a journal of every storm. "
) * 60
OTHER = "The baker rose before dawn to knead the dough for the village. " * 60
N_PROMPT = 600  # a KV view over 512 cells: the decode takes the split path, 3 groups
N_OTHER = 600


def _tokens(model: Model, text: str, n: int) -> list[int]:
    tokens = model.tokenize(text, parse_special=True)[:n]
    assert len(tokens) == n
    return tokens


def _fill(ctx: Context, seq: int, tokens: Sequence[int], chunk: int = 63) -> None:
    """Prefill in chunks under 64 rows (the vector path, on any thread count)."""
    batch = Batch(64)
    for start in range(0, len(tokens), chunk):
        batch.clear()
        batch.add_tokens(tokens[start : start + chunk], seq, start, logits_last=True)
        ctx.decode(batch)


def _step(ctx: Context, seq: int, pos: int, threads: int) -> list[float]:
    """One decode of one token at ``pos`` on ``threads`` threads: its logits."""
    ctx.set_threads(threads, threads)
    batch = Batch(1)
    batch.add(42, pos, seq, logits=True)
    ctx.decode(batch)
    return list(ctx.logits(0))


Unified = Callable[[], contextlib.AbstractContextManager[Context]]


@pytest.fixture(scope="module")
def unified(model: Model) -> Unified:
    """A fresh unified context, closed when the block ends (as ``make_ctx``'s,
    one thread; module-scoped, for the module-scoped logits below)."""
    opts = ContextOptions(
        n_ctx=4096,
        n_batch=64,
        n_ubatch=64,
        n_seq_max=4,
        kv_unified=True,
        n_threads=1,
        n_threads_batch=1,
    )
    return lambda: contextlib.closing(model.context(opts))


@pytest.fixture(scope="module")
def prompt(model: Model) -> list[int]:
    return _tokens(model, TEXT, N_PROMPT)


@pytest.fixture(scope="module")
def other(model: Model) -> list[int]:
    return _tokens(model, OTHER, N_OTHER)


@pytest.fixture(scope="module")
def solo(unified: Unified, prompt: list[int]) -> list[float]:
    """The prompt alone in a fresh context, the next token decoded on one thread."""
    with unified() as ctx:
        _fill(ctx, 0, prompt)
        return _step(ctx, 0, N_PROMPT, threads=1)


@pytest.fixture(scope="module")
def two_threads(unified: Unified, prompt: list[int]) -> list[float]:
    """The same, decoded on two threads (the split path: its groups on both)."""
    with unified() as ctx:
        _fill(ctx, 0, prompt)
        return _step(ctx, 0, N_PROMPT, threads=2)


def test_two_threads_give_the_logits_of_one(two_threads: list[float], solo: list[float]) -> None:
    assert two_threads == solo


def test_another_sequences_cells_below_change_nothing_on_two_threads(
    unified: Unified, prompt: list[int], other: list[int], solo: list[float]
) -> None:
    with unified() as ctx:
        _fill(ctx, 1, other)  # below: the view grows to ~1,200 cells
        _fill(ctx, 0, prompt)
        assert _step(ctx, 0, N_PROMPT, threads=2) == solo


def test_a_row_decoded_beside_another_is_the_row_decoded_alone(
    unified: Unified, prompt: list[int], other: list[int], two_threads: list[float]
) -> None:
    # Alone, the row takes the split path (its groups on two threads); beside
    # another row, the row path (each row whole, on one thread): the same sums.
    with unified() as ctx:
        _fill(ctx, 0, prompt)
        _fill(ctx, 1, other)
        ctx.set_threads(2, 2)
        batch = Batch(2)
        batch.add(42, N_PROMPT, 0, logits=True)
        batch.add(7, N_OTHER, 1, logits=True)
        ctx.decode(batch)
        assert list(ctx.logits(0)) == two_threads


_UNTILED = """
import sys
from llamad import paths
from llamad.llama_ffi import Batch, ContextOptions, Model

text, other, n, n_other = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
model = Model(paths.default_model_path())
prompt = model.tokenize(text, parse_special=True)[:n]
filler = model.tokenize(other, parse_special=True)[:n_other]


def last_logits(chunk, neighbour):
    opts = ContextOptions(n_ctx=4096, n_batch=512, n_ubatch=512, n_seq_max=4,
                          kv_unified=True, n_threads=1, n_threads_batch=1)
    with model.context(opts) as ctx:
        batch = Batch(512)
        if neighbour:
            batch.add_tokens(filler[:512], 1, 0)
            ctx.decode(batch)
        for start in range(0, len(prompt), chunk):
            batch.clear()
            batch.add_tokens(prompt[start:start + chunk], 0, start, logits_last=True)
            ctx.decode(batch)
        return list(ctx.logits(batch.n_tokens - 1))


solo = last_logits(63, False)
print("= 512-row chunks", last_logits(512, False) == solo)
print("= 64-row chunks", last_logits(64, False) == solo)
print("= 512-row chunks above another sequence", last_logits(512, True) == solo)
"""


UNTILED_TEST = "test_without_the_tiled_path_a_prompts_logits_do_not_depend_on_its_chunks_or_cells"


@dataclass
class Child:
    """The child of the last test (``UNTILED_TEST``), started, not waited for.
    Its output goes to files, so that no pipe fills while nobody reads it."""

    proc: subprocess.Popen[bytes]
    stdout: IO[bytes]
    stderr: IO[bytes]

    def wait(self, timeout: float) -> tuple[str, str]:
        self.proc.wait(timeout)
        outs = []
        for f in (self.stdout, self.stderr):
            f.seek(0)
            outs.append(f.read().decode("utf-8", "replace"))
        return outs[0], outs[1]


@pytest.fixture(scope="module")
def untiled_child() -> Iterator[Child]:
    env = {**os.environ, "GGML_CPU_FA_TILED": "0"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", _UNTILED, TEXT, OTHER, str(N_PROMPT), str(N_OTHER)],
            env=env,
            stdout=out,
            stderr=err,
        )
        try:
            yield Child(proc, out, err)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.fixture(scope="module", autouse=True)
def _untiled_child_from_the_start(request: pytest.FixtureRequest) -> None:
    """Start the child with the module's first test when its test is to run."""
    if any(getattr(item, "originalname", None) == UNTILED_TEST for item in request.session.items):
        request.getfixturevalue("untiled_child")


def test_without_the_tiled_path_a_prompts_logits_do_not_depend_on_its_chunks_or_cells(
    untiled_child: Child,
) -> None:
    stdout, stderr = untiled_child.wait(timeout=280)
    assert untiled_child.proc.returncode == 0, stderr[-3000:]
    lines = [line for line in stdout.splitlines() if line.startswith("= ")]
    assert lines == [
        "= 512-row chunks True",
        "= 64-row chunks True",
        "= 512-row chunks above another sequence True",
    ], stdout
