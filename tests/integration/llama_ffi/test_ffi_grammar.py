"""GBNF grammars constrain sampling; a bad grammar is a typed error (SPEC L6)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from llamad.llama_ffi import Context, GrammarError, Model, Sampler, SamplerParams

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

MakeCtx = Callable[..., Context]

DIGITS = "root ::= [0-9]+"


@pytest.mark.parametrize(
    "params",
    [
        SamplerParams(greedy=True, grammar=DIGITS),
        SamplerParams(temperature=1.0, seed=3, grammar=DIGITS),
    ],
)
def test_digits_only_grammar_yields_only_digits(
    model: Model, make_ctx: MakeCtx, params: SamplerParams
) -> None:
    ctx = make_ctx()
    ctx.prefill(model.tokenize("Write a short story about a dragon:"))
    with Sampler(model, params) as s:
        tokens = ctx.generate(s, 12)
    text = model.detokenize([t for t in tokens if t not in model.eog_tokens])
    assert text, "the grammar produced nothing"
    assert text.isdigit() and text.isascii()


@pytest.mark.parametrize(
    "grammar",
    [
        "root ::= [0-9",
        'root ::= "unterminated',
        "root ::= undefined-rule",
        "this is not gbnf",
    ],
)
def test_invalid_grammar_raises_grammar_error(model: Model, grammar: str) -> None:
    with pytest.raises(GrammarError):
        Sampler(model, SamplerParams(grammar=grammar))


def test_missing_root_rule_raises_grammar_error(model: Model) -> None:
    with pytest.raises(GrammarError):
        Sampler(model, SamplerParams(grammar=DIGITS, grammar_root="start"))


def test_prompt_tokens_accepted_into_a_grammar_chain_skip_the_grammar(
    model: Model, make_ctx: MakeCtx
) -> None:
    ctx = make_ctx()
    prompt = model.tokenize("Letters, not digits: abc")
    ctx.prefill(prompt)
    with Sampler(model, SamplerParams(greedy=True, repeat_penalty=1.3, grammar=DIGITS)) as s:
        s.accept(prompt)  # would abort inside llama.cpp if fed to the grammar
        text = model.detokenize([t for t in ctx.generate(s, 6) if t not in model.eog_tokens])
    assert text.isdigit()
