"""Sampler.sample_logits: sampling a kept copy of a row's logits (SPEC M3's memoised primer).

A row restored with the logits of its prompt's last position samples its
first token from them instead of decoding that position again. That is only
the cold reply if sampling a copy of a row is sampling the row itself: the
same token, and the chain (penalty history, grammar, seeded draw) left in the
same state, so every later token agrees too.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Sequence

import pytest

from llamad.llama_ffi import (
    Batch,
    Context,
    GrammarError,
    Model,
    NoLogits,
    Sampler,
    SamplerParams,
)

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

MakeCtx = Callable[..., Context]

# A grammar whose allowed set changes with every accepted token: a chain that
# sampled without accepting would allow "The" again and pick another token.
ANSWER = 'root ::= "The answer is " [0-9] [0-9] "."'

CHAINS = {
    # Greedy with a penalty: accepting feeds the penalty history.
    "greedy": SamplerParams(greedy=True, repeat_penalty=1.5, penalty_last_n=64),
    "seeded_dist": SamplerParams(temperature=1.1, top_k=40, top_p=0.95, min_p=0.0, seed=4242),
    "grammar": SamplerParams(temperature=0.9, seed=7, grammar=ANSWER),
}


def step(ctx: Context, token: int, pos: int) -> None:
    batch = Batch(1)
    batch.add(token, pos, 0, logits=True)
    ctx.decode(batch)


@pytest.mark.parametrize("name", list(CHAINS))
def test_sampling_a_copy_of_a_row_gives_its_token_and_leaves_the_chain_alike(
    model: Model, make_ctx: MakeCtx, prompt_tokens: list[int], name: str
) -> None:
    params = CHAINS[name]
    ctx = make_ctx()
    pos = ctx.prefill(prompt_tokens)
    got_row: list[int] = []
    got_copy: list[int] = []
    with Sampler(model, params) as from_row, Sampler(model, params) as from_copy:
        for _ in range(10):
            kept = ctx.logits(-1)  # a copy, as a row keeps it
            got_row.append(ctx.sample(from_row))
            got_copy.append(from_copy.sample_logits(kept))
            # Decode the row's token whatever the copy gave: a chain left in
            # another state shows at a later step.
            step(ctx, got_row[-1], pos)
            pos += 1
    assert got_copy == got_row
    if name == "grammar":
        text = model.detokenize([t for t in got_row if t not in model.eog_tokens])
        assert text.startswith("The answer is ")
    else:
        assert len(set(got_row)) > 1  # the chain's state mattered: not one token repeated


def test_the_copy_may_lie_anywhere_and_be_any_float32_buffer(
    model: Model, make_ctx: MakeCtx, prompt_tokens: list[int]
) -> None:
    ctx = make_ctx()
    ctx.prefill(prompt_tokens)
    kept = ctx.logits(-1)
    greedy = SamplerParams(greedy=True)
    with Sampler(model, greedy) as s:
        expected = ctx.sample(s)
    # Unaligned inside a larger buffer (a record's bytes in a file), cast back to floats.
    raw = bytearray(b"\0" * 3) + bytearray(kept.tobytes())
    view = memoryview(raw)[3:].cast("f")
    with Sampler(model, greedy) as s:
        assert s.sample_logits(view) == expected
    with Sampler(model, greedy) as s:
        assert s.sample_logits(array("f", kept)) == expected


@pytest.mark.parametrize(
    "bad",
    ["one_short", "one_long", "bytes", "doubles", "list", "empty"],
)
def test_logits_of_another_size_or_type_are_refused(
    model: Model, make_ctx: MakeCtx, prompt_tokens: list[int], bad: str
) -> None:
    ctx = make_ctx()
    ctx.prefill(prompt_tokens)
    kept = ctx.logits(-1)
    given: object = {
        "one_short": kept[:-1],
        "one_long": kept + array("f", [0.0]),
        "bytes": kept.tobytes(),  # right length, but bytes, not float32s
        "doubles": array("d", kept),
        "list": list(kept),
        "empty": array("f"),
    }[bad]
    with Sampler(model, SamplerParams(greedy=True)) as s:
        with pytest.raises(NoLogits):
            s.sample_logits(given)
        # The refusal left the chain usable.
        assert s.sample_logits(kept) == max(range(len(kept)), key=lambda i: (kept[i], -i))


def test_a_grammar_that_rules_out_every_kept_logit_is_a_grammar_error(
    model: Model, make_ctx: MakeCtx, prompt_tokens: Sequence[int]
) -> None:
    seven = model.tokenize("7", add_special=False)
    assert len(seven) == 1
    ctx = make_ctx()
    ctx.prefill(list(prompt_tokens))
    kept = ctx.logits(-1)
    banned = array("f", kept)
    banned[seven[0]] = -math.inf  # the only token the grammar allows
    with Sampler(model, SamplerParams(greedy=True, grammar='root ::= "7"')) as s:
        for _ in range(2):
            with pytest.raises(GrammarError):
                s.sample_logits(banned)
        # Nothing was accepted (the grammar would have aborted the process):
        # the chain still allows its one token.
        assert s.sample_logits(kept) == seven[0]
