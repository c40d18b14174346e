"""A chain that is the greedy sampler alone picks on the raw row (shim.c).

Such a chain (greedy, no grammar, penalties or biases) skips the n_vocab
candidates the general path fills and scans the logits themselves. That is
only a speed-up if it picks exactly what llama.cpp's greedy sampler picks on
the candidates: the first largest logit, a NaN never beating anything, a NaN
or ``-inf`` pick refused before it is accepted. The general path is reached
with the same greedy sampler behind a zero logit bias on a token out of the
way, which changes no logit's value.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable, Sequence

import pytest

from llamad.llama_ffi import Context, GrammarError, Model, Sampler, SamplerParams
from llamad.llama_ffi.native import ffi, lib

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

MakeCtx = Callable[..., Context]

OUT_OF_THE_WAY = 7  # the zero bias's token: no row below picks it
BARE = SamplerParams(greedy=True)
CANDIDATES = SamplerParams(greedy=True, logit_bias=((OUT_OF_THE_WAY, 0.0),))


def reference(row: Sequence[float]) -> int | None:
    """llama.cpp's greedy sampler on candidates in id order; None where the
    shim refuses its pick (NaN or ``-inf``)."""
    best = 0
    for i in range(1, len(row)):
        if row[i] > row[best]:
            best = i
    picked = row[best]
    return None if math.isnan(picked) or picked == -math.inf else best


def pick(model: Model, params: SamplerParams, row: array[float]) -> int | None:
    with Sampler(model, params) as s:
        try:
            return s.sample_logits(row)
        except GrammarError:
            return None


def shaped(kept: array[float], shape: str) -> array[float]:
    """The model's real row, reshaped to put the scan's edge cases in it."""
    row = array("f", kept)
    n = len(row)
    top = max(row)
    if shape == "real":
        pass
    elif shape == "tie_in_other_lanes":
        # The maximum three times, in three of the eight lanes, after the first.
        for i in (1003, 2005, n - 2):
            row[i] = top + 1.0
    elif shape == "tie_in_one_lane":
        for i in (1000, 1008, 40000):
            row[i] = top + 1.0
    elif shape == "max_is_last":
        row[n - 1] = top + 1.0
    elif shape == "max_is_first":
        row[0] = top + 1.0
    elif shape == "nan_in_the_middle":
        row[500] = math.nan
        row[n - 1] = math.nan
    elif shape == "nan_after_the_max_in_its_lane":
        # A NaN sixteen entries after the maximum: the same lane of the SSE
        # maximum, which must keep the maximum, not take the NaN.
        row[1600] = top + 1.0
        row[1616] = math.nan
    elif shape == "nan_first":
        row[0] = math.nan
    elif shape == "all_minus_inf":
        row = array("f", [-math.inf]) * n
    elif shape == "plus_inf":
        row[30001] = math.inf
    elif shape == "signed_zeros":
        row = array("f", [-1.0]) * n
        row[11] = -0.0
        row[12] = 0.0
    elif shape == "signed_zeros_in_one_block":
        # Both zeros in one block of four of the SSE scan, -0 first.
        row = array("f", [-1.0]) * n
        row[8] = -0.0
        row[9] = 0.0
    else:  # pragma: no cover - a typo in the parameters
        raise AssertionError(shape)
    assert reference(row) != OUT_OF_THE_WAY
    return row


SHAPES = [
    "real",
    "tie_in_other_lanes",
    "tie_in_one_lane",
    "max_is_last",
    "max_is_first",
    "nan_in_the_middle",
    "nan_after_the_max_in_its_lane",
    "nan_first",
    "all_minus_inf",
    "plus_inf",
    "signed_zeros",
    "signed_zeros_in_one_block",
]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_bare_greedy_chain_picks_what_the_candidates_path_picks(
    model: Model, make_ctx: MakeCtx, prompt_tokens: list[int], shape: str
) -> None:
    ctx = make_ctx()
    ctx.prefill(prompt_tokens)
    row = shaped(ctx.logits(-1), shape)
    bare = pick(model, BARE, row)
    assert bare == pick(model, CANDIDATES, row)
    assert bare == reference(row)


def test_the_decoded_row_gives_the_same_token_on_both_paths(
    model: Model, make_ctx: MakeCtx, prompt_tokens: list[int]
) -> None:
    # Context.sample reads the row where llama.cpp left it (llamad_sample).
    got = {}
    for name, params in (("bare", BARE), ("candidates", CANDIDATES)):
        ctx = make_ctx()
        ctx.prefill(prompt_tokens)
        with Sampler(model, params) as s:
            got[name] = ctx.generate(s, 12, stop_at_eog=False)
    assert got["bare"] == got["candidates"]
    assert len(set(got["bare"])) > 1


def test_a_chain_with_more_than_greedy_is_not_picked_on_the_raw_row(
    model: Model, make_ctx: MakeCtx, prompt_tokens: list[int]
) -> None:
    ctx = make_ctx()
    ctx.prefill(prompt_tokens)
    kept = ctx.logits(-1)
    top = reference(kept)
    assert top is not None
    banned = SamplerParams(greedy=True, logit_bias=((top, -math.inf),))
    second = pick(model, banned, kept)
    assert second is not None and second != top
    without_top = array("f", kept)
    without_top[top] = -math.inf
    assert second == reference(without_top)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 13, 15, 16, 17, 31, 33, 63])
def test_rows_of_any_length_are_scanned_to_their_last_entry(model: Model, n: int) -> None:
    # The model's rows are a multiple of sixteen long; the shim takes any
    # length, so the tails after the SSE passes' last full blocks (sixteen
    # for the maximum, four for the first entry equal to it) are checked here.
    rng = random.Random(n)
    with Sampler(model, BARE) as s, s.native_handle.lease() as chain:
        for case in range(40):
            values = [float(rng.randint(-3, 3)) for _ in range(n)]
            if case % 4 == 0:
                values[-1] = 9.0  # the only maximum, in the tail
            row = ffi.new("float[]", values)
            scratch = ffi.new("llama_token_data[]", n)
            out = ffi.new("llama_token *")
            assert lib.llamad_sample_logits(chain, row, scratch, n, out) == 0
            assert out[0] == reference(values), values
