"""The GBNF reader of ``tests/support/gbnf.py`` against llama.cpp's own grammars and rules.

The JSON Schema tests check generated grammars with that reader rather than
trusting the converter's own data structures; these tests keep it honest.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gbnf import GbnfError, parse_gbnf
from llamad import paths

# --------------------------------------------------------------- the tests


def _llama_grammar(name: str) -> str:
    path = Path(paths.llama_prefix()) / "src" / "grammars" / name
    if not path.is_file():
        pytest.skip(f"pinned llama.cpp source not extracted ({path})")
    return path.read_text()


@pytest.mark.timeout(30)
def test_recognizer_reads_llama_cpp_json_grammar() -> None:
    grammar = parse_gbnf(_llama_grammar("json.gbnf"))
    for ok in ['{"a": [1, 2.5, -3e4, true, null, "x\\n"]}', "{}", '{\n  "k": {"n": {}}\n}']:
        assert grammar.accepts(ok), ok
    for bad in ["[1]", '{"a": 01}', '{"a" 1}', '{"a": "\x01"}', "{", '{"a": tru}']:
        assert not grammar.accepts(bad), bad


@pytest.mark.timeout(30)
def test_recognizer_reads_llama_cpp_arithmetic_and_list_grammars() -> None:
    arithmetic = parse_gbnf(_llama_grammar("arithmetic.gbnf"))
    assert arithmetic.accepts("1+x*(2-y)=3\n")
    assert not arithmetic.accepts("1+=3\n")
    lists = parse_gbnf(_llama_grammar("list.gbnf"))
    assert lists.accepts("- one\n- two\n")
    assert not lists.accepts("- one\u2028two\n")


@pytest.mark.timeout(10)
def test_counted_repetition_matches_exactly_its_range() -> None:
    grammar = parse_gbnf('root ::= "a"{2,4} ("bc"){1,} [x-z]{3}\n')
    for n in range(7):
        assert grammar.accepts("a" * n + "bc" + "xyz") == (2 <= n <= 4)
    assert grammar.accepts("aabcbcbczzx")
    assert not grammar.accepts("aaxyz")
    assert not grammar.accepts("aabcxy")


@pytest.mark.timeout(10)
def test_escapes_and_negated_classes_follow_llama_cpp() -> None:
    grammar = parse_gbnf('root ::= "\\x41\\u00e9\\"" [^\\x00-\\x1F"\\\\\\-]+ .\n')
    assert grammar.accepts('Aé"ok!')
    assert not grammar.accepts('Aé"o-k!')
    assert not grammar.accepts('Aé"\\x')


@pytest.mark.timeout(10)
def test_nullable_rules_and_empty_alternatives() -> None:
    grammar = parse_gbnf('root ::= a b "!"\na ::= | "x"\nb ::= a a\n')
    for text in ["!", "x!", "xx!", "xxx!"]:
        assert grammar.accepts(text), text
    assert not grammar.accepts("xxxx!")


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text",
    [
        'root ::= "a"{0,2001}\n',
        'root ::= "a"{2001}\n',
        "root ::= [0-9]{0,100} [0-9]{0,100}\n",
        "root ::= missing\n",
        'root ::= root "a" | "b"\n',
        'root ::= "a" "b\n',
        'start ::= "a"\n',
        'root ::= "\\q"\n',
    ],
)
def test_parser_refuses_what_llama_cpp_refuses_or_clamps(text: str) -> None:
    with pytest.raises(GbnfError):
        parse_gbnf(text)


@pytest.mark.timeout(60)
@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_sampled_strings_are_accepted(seed: int) -> None:
    rng = random.Random(seed)
    grammar = parse_gbnf(_llama_grammar("json.gbnf"))
    text = grammar.sample(rng, max_depth=12)
    assert grammar.accepts(text)
    json.loads(text)
