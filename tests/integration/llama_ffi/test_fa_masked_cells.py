"""Flash attention passes masked cells without changing what it computes
(llamad's llama.cpp patch 0005).

In a unified KV cache a row attends over the whole view, and the cells of
other sequences (idle entries a server keeps for reuse) are masked. The patch
makes ggml-cpu pass them faster: the tiled prompt path decides that a 64 x 64
tile is all masked on the mask's f16 bits before converting anything, and the
vector path skips a run of masked cells 16 at a time. Neither may change what
is summed, which these tests pin:

- a prompt placed above another sequence's cells, starting mid-tile, gives
  through the tiled path (one batch of 200 rows) the logits of the vector path
  (63-row chunks) within rounding, and the same greedy token;
- a decode after runs of masked cells of every length around 16 (the skip's
  step) gives the very logits of the same sequence with nothing masked
  between its cells.

Each test computes in one thread (the default is what the other llama_ffi
tests use; the thread count does not matter here, patch 0003 pins that).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import pytest

from llamad.llama_ffi import Batch, Context, ContextOptions, Model

pytestmark = pytest.mark.timeout(300)

TEXT = (
    "The river ran past the mill and under the stone bridge, where the children "
    "fished for trout on summer evenings while their parents talked. "
) * 20
OTHER = "Snow fell on the mountain pass and the travellers waited at the inn. " * 20
N_PROMPT = 200  # over 64 rows in one batch: the tiled path
N_BELOW = 100  # the prompt's cells start at 100: mid-tile (tiles are 64 cells)
# Rounding between the two paths (the tiles' f32 sums against the vector
# path's f16 V accumulation, in another order): 0.55 at most on this prompt.
# A tile skipped whose later rows saw a cell moved them by 12.5; the vector
# path passing one cell too many, by 1.5.
TOLERANCE = 1.0

Fresh = Callable[[], contextlib.AbstractContextManager[Context]]


@pytest.fixture(scope="module")
def fresh(model: Model) -> Fresh:
    opts = ContextOptions(
        n_ctx=4096,
        n_batch=256,
        n_ubatch=256,
        n_seq_max=4,
        kv_unified=True,
        n_threads=1,
        n_threads_batch=1,
    )
    return lambda: contextlib.closing(model.context(opts))


def _tokens(model: Model, text: str, n: int) -> list[int]:
    tokens = model.tokenize(text, parse_special=True)[:n]
    assert len(tokens) == n
    return tokens


def _fill(ctx: Context, seq: int, tokens: Sequence[int], pos: int, chunk: int) -> list[float]:
    """Decode ``tokens`` into ``seq`` from ``pos`` in ``chunk``-row batches;
    the last row's logits."""
    batch = Batch(256)
    for start in range(0, len(tokens), chunk):
        batch.clear()
        batch.add_tokens(tokens[start : start + chunk], seq, pos + start, logits_last=True)
        ctx.decode(batch)
    return list(ctx.logits(batch.n_tokens - 1))


def _argmax(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def test_the_tiled_path_above_another_sequence_gives_the_vector_paths_logits(
    fresh: Fresh, model: Model
) -> None:
    prompt = _tokens(model, TEXT, N_PROMPT)
    below = _tokens(model, OTHER, N_BELOW)
    results = []
    for chunk in (N_PROMPT, 63):  # one tiled batch; the vector path
        with fresh() as ctx:
            _fill(ctx, 1, below, 0, N_BELOW)
            results.append(_fill(ctx, 0, prompt, 0, chunk))
            # The prompt's cells are the ones above seq 1's: it starts mid-tile.
            assert ctx.seq_cell_end(0) == N_BELOW + N_PROMPT
    tiled, vector = results
    assert tiled != vector, "both ran one path: the comparison says nothing"
    worst = max(abs(a - b) for a, b in zip(tiled, vector, strict=True))
    assert worst < TOLERANCE, worst
    assert _argmax(tiled) == _argmax(vector)


@pytest.mark.parametrize("gap", [1, 15, 16, 17, 31, 33, 100])
def test_a_decode_past_a_run_of_masked_cells_is_the_decode_without_it(
    fresh: Fresh, model: Model, gap: int
) -> None:
    prompt = _tokens(model, TEXT, 40)
    head, tail = prompt[:20], prompt[20:]
    with fresh() as ctx:
        _fill(ctx, 0, prompt, 0, 15)
        alone = _fill(ctx, 0, [42], len(prompt), 1)
    with fresh() as ctx:
        # seq 0's cells: its head, then `gap` cells of seq 1, then its tail.
        _fill(ctx, 0, head, 0, 15)
        _fill(ctx, 1, _tokens(model, OTHER, gap), 0, 15)
        _fill(ctx, 0, tail, len(head), 15)
        assert ctx.seq_cell_end(0) == len(prompt) + gap
        apart = _fill(ctx, 0, [42], len(prompt), 1)
    assert apart == alone
