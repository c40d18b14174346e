"""JSON Schema grammars in the real llama.cpp grammar sampler with the real model."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest

from llamad.llama_ffi import Context, Model, Sampler, SamplerParams
from llamad.llama_ffi.chat_template import apply_chat_template
from llamad.llama_ffi.json_schema import GrammarOptions, json_schema_to_gbnf

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

MakeCtx = Callable[..., Context]

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "hobbies": {
            "type": "array",
            "items": {"type": "string", "maxLength": 16},
            "minItems": 1,
            "maxItems": 3,
        },
        "mood": {"enum": ["happy", "calm", "tired"]},
    },
    "required": ["name", "age", "hobbies", "mood"],
}

WEATHER = {
    "type": "object",
    "properties": {
        "date": {"type": "string", "format": "date"},
        "celsius": {"type": "number", "minimum": -50, "maximum": 50},
        "rain": {"type": ["boolean", "null"]},
    },
    "required": ["date", "celsius", "rain"],
    "additionalProperties": False,
}

STEPS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 9},
            "step": {"type": "string", "maxLength": 24},
        },
        "required": ["n", "step"],
    },
    "minItems": 2,
    "maxItems": 3,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("schema", "ask", "whitespace"),
    [
        (PERSON, "Describe a fictional person as JSON.", "limited"),
        (WEATHER, "Give today's weather in Paris as JSON.", "none"),
        (STEPS, "List the steps to make tea as JSON.", "limited"),
    ],
)
def test_schema_grammar_yields_json_that_validates(
    model: Model, make_ctx: MakeCtx, schema: dict[str, Any], ask: str, whitespace: str
) -> None:
    grammar = json_schema_to_gbnf(schema, GrammarOptions(whitespace=whitespace))  # type: ignore[arg-type]
    ctx = make_ctx()
    ctx.prefill(apply_chat_template(model, [{"role": "user", "content": ask}]))
    with Sampler(model, SamplerParams(greedy=True, grammar=grammar)) as sampler:
        tokens = ctx.generate(sampler, 160)
    assert tokens[-1] in model.eog_tokens, "the grammar should end generation before the limit"
    text = model.detokenize(tokens[:-1])
    jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())


# Every construct the converter emits, in grammars llama.cpp must parse as written.
CONSTRUCTS: dict[str, Any] = {
    "any": {},
    "formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f} for f in ("date", "time", "date-time", "uuid")
        },
    },
    "numbers": {
        "type": "array",
        "prefixItems": [
            {"type": "number", "exclusiveMinimum": -273.15, "maximum": 1e3},
            {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-6},
            {"type": "integer", "minimum": -5000, "exclusiveMaximum": 123456},
            {"type": "number"},
        ],
        "items": False,
    },
    "open_keys": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "idx": {"type": "string"},
            'q"\\': {"type": "null"},
        },
        "additionalProperties": {"type": "string", "maxLength": 4},
    },
    "long_strings": {
        "type": "array",
        "items": {"type": "string", "minLength": 1500, "maxLength": 4321},
        "maxItems": 2500,
    },
    "recursion": {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            }
        },
        "anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}],
    },
    "union": {
        "oneOf": [
            {"type": "object", "properties": {"k": {"const": "a"}}, "required": ["k"]},
            {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]},
            {"enum": [1, "x\n\u00e9\U0001f600", None]},
        ]
    },
}


@pytest.mark.parametrize("name", sorted(CONSTRUCTS))
def test_generated_grammar_is_accepted_by_llama_cpp(model: Model, name: str) -> None:
    for whitespace in ("limited", "none"):
        grammar = json_schema_to_gbnf(CONSTRUCTS[name], GrammarOptions(whitespace=whitespace))  # type: ignore[arg-type]
        Sampler(model, SamplerParams(grammar=grammar)).close()  # GrammarError if llama.cpp refuses
