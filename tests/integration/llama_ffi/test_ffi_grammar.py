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
    ("grammar", "reason"),
    [
        ("root ::= [0-9", "parse: error parsing grammar: unexpected end of input"),
        ('root ::= "unterminated', "parse: error parsing grammar: unexpected end of input"),
        (
            "root ::= undefined-rule",
            "parse: error parsing grammar: Undefined rule identifier 'undefined-rule'",
        ),
        ("this is not gbnf", "parse: error parsing grammar: expecting ::= at is not gbnf"),
        ('root ::= root "a"', "left recursion detected for nonterminal at index 0"),
    ],
)
def test_invalid_grammar_raises_grammar_error_with_llama_cpps_reason(
    model: Model, grammar: str, reason: str
) -> None:
    # The parser's own reason used to go to stderr with fprintf; patch 0002
    # sends it through the log callback, where llama_errors() hands it over.
    with pytest.raises(GrammarError) as refused:
        Sampler(model, SamplerParams(grammar=grammar))
    assert reason in refused.value.message
    assert reason in refused.value.details["reason"]


def test_missing_root_rule_raises_grammar_error(model: Model) -> None:
    with pytest.raises(GrammarError) as refused:
        Sampler(model, SamplerParams(grammar=DIGITS, grammar_root="start"))
    assert refused.value.details["reason"] == "grammar does not contain a 'start' symbol"


def test_a_long_bad_grammar_is_named_in_one_short_line(model: Model) -> None:
    rules = "\n".join(f"r{i} ::= [a-z]+" for i in range(2000))
    with pytest.raises(GrammarError) as refused:
        Sampler(model, SamplerParams(grammar=f"root ::= r0\n{rules}\nbroken ::= (\n{rules}"))
    assert "expecting" in refused.value.message
    assert "\n" not in refused.value.message
    assert len(refused.value.message) < 300


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
