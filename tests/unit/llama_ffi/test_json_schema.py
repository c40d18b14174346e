"""JSON Schema → GBNF: what each supported keyword accepts and rejects.

Grammars are read back with the independent GBNF reader in
``test_json_schema_gbnf`` (which also enforces llama.cpp's repetition
limits); instances are checked with the ``jsonschema`` package.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
import re
from decimal import Decimal
from typing import Any

import jsonschema
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gbnf import Grammar, parse_gbnf
from llamad.errors import BadRequest, SchemaError, from_wire
from llamad.llama_ffi.json_schema import GrammarOptions, gbnf, json_schema_to_gbnf

pytestmark = pytest.mark.timeout(60)


@functools.lru_cache(maxsize=256)
def _grammar_cached(schema_json: str, whitespace: str) -> Grammar:
    return parse_gbnf(json_schema_to_gbnf(schema_json, GrammarOptions(whitespace=whitespace)))  # type: ignore[arg-type]


def grammar(schema: Any, whitespace: str = "limited") -> Grammar:
    return _grammar_cached(json.dumps(schema), whitespace)


def accepts(schema: Any, text: str) -> bool:
    return grammar(schema).accepts(text)


# RFC 3339 checks: jsonschema only checks date-time/time when optional packages are installed.
_TIME = re.compile(r"(\d\d):(\d\d):(\d\d)(\.\d+)?(?:[Zz]|[+-](\d\d):(\d\d))")
FORMATS = jsonschema.FormatChecker()


@FORMATS.checks("time", raises=ValueError)
def _is_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    m = _TIME.fullmatch(value)
    if not m:
        return False
    hour, minute, second = int(m[1]), int(m[2]), int(m[3])
    off_h, off_m = int(m[5] or 0), int(m[6] or 0)
    return hour < 24 and minute < 60 and second < 60 and off_h < 24 and off_m < 60


@FORMATS.checks("date-time", raises=ValueError)
def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    date, sep, time = value[:10], value[10:11], value[11:]
    if sep not in ("T", "t") or not re.fullmatch(r"\d{4}-\d\d-\d\d", date):
        return False
    dt.date.fromisoformat(date)
    return _is_time(time)


def valid(schema: Any, instance: Any) -> bool:
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=FORMATS).is_valid(instance)


def check(schema: Any, good: list[str], bad: list[str]) -> None:
    g = grammar(schema)
    for text in good:
        assert valid(schema, json.loads(text)), f"test bug: {text} is not valid"
        assert g.accepts(text), f"rejected {text!r}"
    for text in bad:
        assert not g.accepts(text), f"accepted {text!r}"


# ------------------------------------------------------------------ objects

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "nick": {"type": "string"},
    },
    "required": ["name", "age"],
}


def test_object_requires_required_and_allows_optional_properties() -> None:
    check(
        PERSON,
        good=[
            '{"name": "a", "age": 3}',
            '{"name":"a","age":3,"nick":"b"}',
            '{"name": "", "age": -7}',
        ],
        bad=[
            '{"name": "a"}',
            '{"age": 3}',
            "{}",
            '{"name": "a", "age": "3"}',
            '{"name": 1, "age": 3}',
        ],
    )


def test_object_with_declared_properties_gets_no_undeclared_keys() -> None:
    assert not accepts(PERSON, '{"name": "a", "age": 3, "x": 1}')
    closed = {**PERSON, "additionalProperties": False}
    assert not accepts(closed, '{"name": "a", "age": 3, "x": 1}')


def test_properties_follow_declaration_order() -> None:
    assert accepts(PERSON, '{"name": "a", "age": 3, "nick": "n"}')
    assert not accepts(PERSON, '{"age": 3, "name": "a"}')


def test_all_optional_properties_allow_any_subset_and_empty_object() -> None:
    schema = {"type": "object", "properties": {k: {"type": "integer"} for k in "abcd"}}
    for mask in range(16):
        keys = [k for i, k in enumerate("abcd") if mask >> i & 1]
        text = json.dumps({k: 1 for k in keys})
        assert accepts(schema, text), text
    assert not accepts(schema, '{"a": 1,}')
    assert not accepts(schema, '{, "a": 1}')
    assert not accepts(schema, '{"a": 1 "b": 1}')


def test_additional_properties_true_never_repeats_a_declared_name() -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "ok": {"type": "boolean"}},
        "additionalProperties": True,
    }
    check(
        schema,
        good=[
            '{"id": 1, "other": [1, "x"], "i": null, "idx": {}}',
            '{"zz": 1}',
            "{}",
            '{"o": 1, "okay": 2}',
        ],
        bad=['{"id": 1, "id": "x"}', '{"ok": true, "ok": 1}', '{"id": 1, "\\u0069d": "x"}'],
    )


def test_additional_properties_schema_constrains_undeclared_values() -> None:
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}},
        "required": ["id"],
        "additionalProperties": {"type": "string", "maxLength": 2},
    }
    check(
        schema,
        good=['{"id": 1}', '{"id": 1, "a": "xy", "b": ""}'],
        bad=['{"id": 1, "a": 1}', '{"id": 1, "a": "xyz"}', '{"a": "x"}'],
    )


def test_object_without_properties_accepts_any_object() -> None:
    for schema in ({"type": "object"}, {"type": "object", "additionalProperties": True}):
        check(
            schema,
            good=['{"a": [1, {"b": null}], "\\u00e9": "x"}', "{}"],
            bad=["[]", '"x"', "{a: 1}"],
        )


def test_required_name_without_property_schema_takes_any_value() -> None:
    schema = {"type": "object", "required": ["k"]}
    check(schema, good=['{"k": [1, "2"]}', '{"k": null}'], bad=["{}", '{"j": 1}'])


# ------------------------------------------------------------------- arrays


def test_array_items_and_length_bounds() -> None:
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 4}
    for n in range(7):
        text = json.dumps(list(range(n)))
        assert accepts(schema, text) == (2 <= n <= 4), text
    assert not accepts(schema, '[1, "2"]')


def test_array_without_items_accepts_any_values() -> None:
    check({"type": "array"}, good=['[1, "a", [null], {"b": true}]', "[]"], bad=["{}", "[1,]"])


def test_prefix_items_fix_leading_positions() -> None:
    schema = {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "items": {"type": "boolean"},
        "minItems": 1,
        "maxItems": 4,
    }
    check(
        schema,
        good=['["a"]', '["a", 1]', '["a", 1, true, false]'],
        bad=["[]", "[1]", '["a", "b"]', '["a", 1, 2]', '["a", 1, true, true, true]'],
    )


def test_prefix_items_with_items_false_is_a_closed_tuple() -> None:
    schema = {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "null"}],
        "items": False,
    }
    check(schema, good=["[]", '["a"]', '["a", null]'], bad=['["a", null, 1]', "[null]"])


def test_draft7_tuple_items_and_additional_items() -> None:
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "array",
        "items": [{"type": "integer"}],
        "additionalItems": {"type": "string"},
    }
    check(schema, good=["[]", "[1]", '[1, "a", "b"]'], bad=['["a"]', "[1, 2]"])


# ------------------------------------------------------------------ strings


def test_string_length_counts_code_points() -> None:
    schema = {"type": "string", "minLength": 2, "maxLength": 3}
    check(
        schema,
        good=['"ab"', '"\u00e9\U0001f600"', '"\\u00e9x"', '"a\\nb"', '"abc"', '"\\uD7FF\\uE000"'],
        bad=['"a"', '"abcd"', '"\\ud83d\\ude00"', '"\\uD800\\uDC00"', '"\\udbff\\udfff"'],
    )


def test_strings_reject_raw_control_characters_and_bad_escapes() -> None:
    schema = {"type": "string"}
    check(
        schema,
        good=['"tab\\there"', '"q\\"\\\\"', '"\\/"'],
        bad=['"a\tb"', '"\\x41"', '"\\u12"', '"a'],
    )


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        (
            "date",
            ["2024-02-29", "2000-02-29", "0001-01-01", "1999-12-31", "2023-04-30"],
            ["2023-02-29", "1900-02-29", "0000-01-01", "2023-04-31", "2023-13-01", "2023-1-01"],
        ),
        (
            "time",
            ["23:59:59Z", "00:00:00.123456+05:30", "12:00:00-00:00"],
            ["24:00:00Z", "12:60:00Z", "12:00:00", "12:00Z", "12:00:00+5:30"],
        ),
        (
            "date-time",
            ["2024-02-29T12:34:56Z", "1999-12-31T23:59:59.5-08:00"],
            ["2023-02-29T12:34:56Z", "2024-01-01 12:00:00Z", "2024-01-01T12:00:00"],
        ),
        (
            "uuid",
            ["123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-ABCD-EF0123456789"],
            ["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g"],
        ),
    ],
)
def test_string_format(fmt: str, good: list[str], bad: list[str]) -> None:
    schema = {"type": "string", "format": fmt}
    check(schema, good=[json.dumps(g) for g in good], bad=[json.dumps(b) for b in bad])
    for b in bad:
        assert not valid(schema, b), f"test bug: {b} is valid"


@settings(max_examples=25, deadline=None)
@given(year=st.integers(0, 9999) | st.integers(0, 99).map(lambda c: c * 100))
def test_date_format_accepts_exactly_the_calendar_dates(year: int) -> None:
    g = grammar({"type": "string", "format": "date"})
    for month in range(14):
        for day in range(33):
            text = f"{year:04d}-{month:02d}-{day:02d}"
            try:
                dt.date.fromisoformat(text)
                real = True
            except ValueError:
                real = False
            assert g.accepts(json.dumps(text)) == real, text


# ------------------------------------------------------------------ numbers


def test_unbounded_numbers_and_integers() -> None:
    check(
        {"type": "number"},
        good=["0", "-0", "12", "-3.25", "1e5", "6.02E+23", "1.5e-7"],
        bad=["01", "1.", ".5", "+1", "1e", "NaN", "Infinity", "--1"],
    )
    check({"type": "integer"}, good=["0", "-12", "4096"], bad=["1.0", "1e3", "-0", "007", "-"])


_BOUND = st.integers(-1000, 1000)


@settings(max_examples=200, deadline=None)
@given(
    lo=st.none() | _BOUND,
    hi=st.none() | _BOUND,
    lo_x=st.booleans(),
    hi_x=st.booleans(),
    n=st.integers(-1200, 1200),
)
def test_integer_bounds_accept_exactly_the_range(
    lo: int | None, hi: int | None, lo_x: bool, hi_x: bool, n: int
) -> None:
    schema: dict[str, Any] = {"type": "integer"}
    if lo is not None:
        schema["exclusiveMinimum" if lo_x else "minimum"] = lo
    if hi is not None:
        schema["exclusiveMaximum" if hi_x else "maximum"] = hi
    inside = (lo is None or (n > lo if lo_x else n >= lo)) and (
        hi is None or (n < hi if hi_x else n <= hi)
    )
    try:
        g = grammar(schema)
    except SchemaError as exc:
        assert exc.details["keyword"] is None  # only an empty range may fail
        assert not any(
            (lo is None or (m > lo if lo_x else m >= lo))
            and (hi is None or (m < hi if hi_x else m <= hi))
            for m in range(-1001, 1002)
        )
        return
    assert g.accepts(str(n)) == inside


_DECIMAL = st.decimals(min_value=-1000, max_value=1000, places=3, allow_nan=False)


@st.composite
def _decimal_text(draw: st.DrawFn) -> str:
    whole = draw(st.integers(0, 1500))
    frac = draw(st.text("0123456789", max_size=min(6, 15 - len(str(whole)))))
    text = str(whole) + ("." + frac if frac else "")
    negative = draw(st.booleans()) and Decimal(text) != 0
    return ("-" if negative else "") + text


def _near(anchor: Decimal, delta: Decimal, zeros: int) -> str:
    """A JSON decimal close to ``anchor``, possibly with trailing zeros."""
    value = anchor + delta
    text = format(value.normalize(), "f") if value else "0"
    if zeros:
        text += ("" if "." in text else ".") + "0" * zeros
    return text


_DELTAS = st.sampled_from(["0", "0.0001", "0.0005", "0.001", "0.01", "0.1", "0.5", "1"]).map(
    Decimal
)


@settings(max_examples=400, deadline=None)
@given(
    lo=st.none() | _DECIMAL,
    hi=st.none() | _DECIMAL,
    lo_x=st.booleans(),
    hi_x=st.booleans(),
    data=st.data(),
)
def test_number_bounds_accept_exactly_the_decimals_in_range(
    lo: Decimal | None, hi: Decimal | None, lo_x: bool, hi_x: bool, data: st.DataObject
) -> None:
    anchors = [b for b in (lo, hi) if b is not None]
    if anchors and data.draw(st.booleans()):
        anchor = data.draw(st.sampled_from(anchors))
        sign = data.draw(st.sampled_from([1, -1]))
        text = _near(anchor, sign * data.draw(_DELTAS), data.draw(st.integers(0, 2)))
    else:
        text = data.draw(_decimal_text())
    assume(lo is not None or hi is not None)
    schema: dict[str, Any] = {"type": "number"}
    if lo is not None:
        schema["exclusiveMinimum" if lo_x else "minimum"] = float(lo)
    if hi is not None:
        schema["exclusiveMaximum" if hi_x else "maximum"] = float(hi)
    if lo is not None and hi is not None and (lo > hi or (lo == hi and (lo_x or hi_x))):
        with pytest.raises(SchemaError):
            json_schema_to_gbnf(schema)
        return
    value = Decimal(text)
    inside = (lo is None or (value > lo if lo_x else value >= lo)) and (
        hi is None or (value < hi if hi_x else value <= hi)
    )
    assert accepts(schema, text) == inside
    if inside:
        assert valid(schema, json.loads(text))


@pytest.mark.parametrize(
    ("bounds", "good", "bad"),
    [
        (
            {"exclusiveMinimum": 5, "maximum": 5.5},
            ["5.1", "5.5", "5.50", "5.0001"],
            ["5", "5.0", "5.5001", "6"],
        ),
        ({"minimum": 5, "exclusiveMaximum": 5.5}, ["5", "5.0", "5.49999"], ["5.5", "5.50", "4.9"]),
        (
            {"exclusiveMinimum": -1, "exclusiveMaximum": 0},
            ["-0.5", "-0.999"],
            ["0", "-0", "-0.0", "-1", "-1.0"],
        ),
        (
            {"minimum": 0.05, "maximum": 0.5},
            ["0.05", "0.050", "0.5", "0.1", "0.4999"],
            ["0.049", "0.5001", "0.04999"],
        ),
        (
            {"minimum": -2.5, "maximum": -2.25},
            ["-2.5", "-2.3", "-2.25"],
            ["-2.2", "-2.6", "-2", "2.3"],
        ),
        ({"exclusiveMinimum": 0}, ["0.0001", "7", "123.5"], ["0", "0.0", "-1", "-0.1"]),
        ({"maximum": 0}, ["0", "0.0", "-5", "-0.5"], ["0.1", "1"]),
        ({"exclusiveMaximum": 0}, ["-0.1", "-3"], ["0", "0.0", "-0", "-0.0", "0.1"]),
        ({"minimum": 7, "maximum": 7}, ["7", "7.00"], ["7.01", "6.99"]),
        (
            {"minimum": 1e-7, "maximum": 2e-7},
            ["0.0000001", "0.00000015"],
            ["0.00000009", "0.0000002000001"],
        ),
    ],
)
def test_number_bound_edges(bounds: dict[str, float], good: list[str], bad: list[str]) -> None:
    check({"type": "number", **bounds}, good=good, bad=bad)
    for b in bad:
        value = Decimal(b)
        assert not (
            value >= Decimal(repr(bounds.get("minimum", -1e9)))
            and value > Decimal(repr(bounds.get("exclusiveMinimum", -1e9)))
            and value <= Decimal(repr(bounds.get("maximum", 1e9)))
            and value < Decimal(repr(bounds.get("exclusiveMaximum", 1e9)))
        ), f"test bug: {b} is inside"


def test_bounded_numbers_stay_within_float_precision() -> None:
    # 99.99999999999999999 would parse to the float 100.0 and break exclusiveMaximum
    schema = {"type": "number", "exclusiveMaximum": 100}
    assert accepts(schema, "99.9999999999999")
    assert not accepts(schema, "99.99999999999999999")
    assert not accepts(schema, "1e1")


def test_draft4_boolean_exclusive_bounds() -> None:
    schema = {
        "type": "number",
        "minimum": 0,
        "exclusiveMinimum": True,
        "maximum": 1,
        "exclusiveMaximum": True,
    }
    check(
        {"$schema": "http://json-schema.org/draft-04/schema#", **schema},
        good=["0.5", "0.001"],
        bad=["0", "1", "1.0", "0.0"],
    )


# --------------------------------------------------------------- constants


def test_enum_accepts_exactly_its_values() -> None:
    schema = {"enum": ["red", 1, 2.5, None, True, [1, "x"], {"k": "v"}]}
    check(
        schema,
        good=['"red"', "1", "2.5", "null", "true", '[1,"x"]', '{"k":"v"}'],
        bad=['"Red"', "2", "false", '[1, "x", 2]', '{"k":"w"}', '"1"'],
    )


def test_enum_is_filtered_by_type() -> None:
    check({"type": "string", "enum": ["a", 1, None]}, good=['"a"'], bad=["1", "null"])
    check(
        {"type": ["integer", "null"], "enum": ["a", 1, None, 1.5]},
        good=["1", "null"],
        bad=['"a"', "1.5"],
    )


def test_const_and_const_within_enum() -> None:
    check({"const": "fixed"}, good=['"fixed"'], bad=['"other"'])
    check({"const": 2, "enum": [1, 2.0, 3]}, good=["2"], bad=["1", "3"])


def test_integral_float_constants_are_written_as_integers() -> None:
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "integer",
        "enum": [1.0],
    }
    check(draft4, good=["1"], bad=["1.0"])


def test_enum_string_escapes_round_trip() -> None:
    value = 'say "hi"\n\\ \u00e9'
    check({"enum": [value]}, good=[json.dumps(value, ensure_ascii=False)], bad=['"say"'])


# ----------------------------------------------------------- combinations


def test_type_list_makes_nullable_values() -> None:
    check({"type": ["string", "null"], "maxLength": 2}, good=['"ab"', "null"], bad=['"abc"', "0"])


def test_any_of_accepts_each_branch() -> None:
    schema = {
        "anyOf": [
            {"type": "integer", "minimum": 10},
            {"type": "string", "maxLength": 1},
            {"type": "null"},
        ]
    }
    check(schema, good=["10", '"x"', "null"], bad=["9", '"xy"', "true"])


def test_one_of_accepts_branches_told_apart_by_type() -> None:
    schema = {"oneOf": [{"type": "integer"}, {"type": "string"}, {"const": None}]}
    check(schema, good=["1", '"a"', "null"], bad=["true"])


def test_one_of_accepts_a_const_discriminator() -> None:
    schema = {
        "$defs": {
            "Cat": {
                "type": "object",
                "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                "required": ["kind", "lives"],
            },
            "Dog": {
                "type": "object",
                "properties": {"kind": {"const": "dog"}, "good": {"type": "boolean"}},
                "required": ["kind", "good"],
            },
        },
        "oneOf": [{"$ref": "#/$defs/Cat"}, {"$ref": "#/$defs/Dog"}],
        "discriminator": {"propertyName": "kind"},
    }
    check(
        schema,
        good=['{"kind": "cat", "lives": 9}', '{"kind": "dog", "good": true}'],
        bad=['{"kind": "cat", "good": true}', '{"kind": "cow", "lives": 1}'],
    )


def test_one_of_accepts_objects_told_apart_by_closed_property_sets() -> None:
    schema = {
        "oneOf": [
            {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "properties": {"b": {"type": "integer"}},
                "required": ["b"],
                "additionalProperties": False,
            },
        ]
    }
    check(schema, good=['{"a": 1}', '{"b": 2}'], bad=["{}", '{"a": 1, "b": 2}'])


@pytest.mark.parametrize(
    "branches",
    [
        [{"type": "integer"}, {"type": "number"}],
        [{"type": "string"}, {"type": "string", "maxLength": 3}],
        [{"enum": [1, 2]}, {"enum": [2.0, 3]}],
        [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "object"}],
        [{"properties": {"a": {"type": "integer"}}}, {"type": "string"}],
    ],
)
def test_one_of_with_possibly_overlapping_branches_raises(branches: list[Any]) -> None:
    with pytest.raises(SchemaError) as info:
        json_schema_to_gbnf({"oneOf": branches})
    assert info.value.details == {"path": "/", "keyword": "oneOf"}


def test_schema_names_never_capture_helper_rules() -> None:
    names = ("string", "value", "ws", "char", "root", "number", "integer", "object", "date-format")
    schema = {
        "$defs": {n: {"const": n} for n in names},
        "type": "object",
        "properties": {
            **{f"p{i}": {"$ref": f"#/$defs/{n}"} for i, n in enumerate(names)},
            "s": {"type": "string"},
            "v": {},
            "d": {"type": "string", "format": "date"},
        },
        "required": [f"p{i}" for i in range(len(names))] + ["s", "v", "d"],
    }
    refs = ", ".join(f'"p{i}": "{n}"' for i, n in enumerate(names))
    good = "{" + refs + ', "s": "free text", "v": [1, {"x": null}], "d": "2024-02-29"}'
    check(schema, good=[good], bad=[good.replace('"p0": "string"', '"p0": "x"')])


def test_single_element_all_of_is_its_element() -> None:
    schema = {"allOf": [{"type": "integer", "maximum": 3}], "title": "small"}
    check(schema, good=["3", "-1"], bad=["4", '"3"'])


# ---------------------------------------------------------------- references


TREE = {
    "$defs": {
        "Node": {
            "type": "object",
            "properties": {
                "value": {"type": "integer"},
                "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            },
            "required": ["value"],
        }
    },
    "$ref": "#/$defs/Node",
}


def test_recursive_ref_accepts_nested_values() -> None:
    check(
        TREE,
        good=[
            '{"value": 1}',
            '{"value": 1, "children": [{"value": 2, "children": [{"value": 3}]}, {"value": 4}]}',
        ],
        bad=['{"value": 1, "children": [{}]}', '{"children": []}'],
    )


def test_ref_to_definitions_and_to_root() -> None:
    draft7 = {
        "definitions": {"n": {"type": "integer"}},
        "type": "array",
        "items": {"$ref": "#/definitions/n"},
    }
    check(draft7, good=["[1, 2]"], bad=['["1"]'])
    linked = {
        "type": "object",
        "properties": {
            "v": {"type": "integer"},
            "next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]},
        },
        "required": ["v", "next"],
    }
    check(
        linked,
        good=['{"v": 1, "next": {"v": 2, "next": null}}'],
        bad=['{"v": 1, "next": {"v": 2}}'],
    )


def test_ref_pointer_escapes_resolve() -> None:
    schema = {
        "$defs": {"a/b": {"type": "integer"}, "c~d": {"type": "string"}, "e f": {"type": "null"}}
    }
    for ref, good in (("#/$defs/a~1b", "1"), ("#/$defs/c~0d", '"x"'), ("#/$defs/e%20f", "null")):
        check({**schema, "$ref": ref}, good=[good], bad=["true"])


# ------------------------------------------------------------- whitespace


def test_whitespace_is_limited_and_pretty_printing_fits() -> None:
    value = {"name": "a", "age": 3, "nick": "n"}
    assert accepts(PERSON, json.dumps(value, indent=2))
    assert accepts(PERSON, json.dumps(value, indent="\t"))
    assert accepts(PERSON, '{ "name": "a", "age": 3 }')
    assert accepts(PERSON, '{"name": "a",\n' + " " * 20 + '"age": 3}')
    assert not accepts(PERSON, '{"name": "a",\n' + " " * 21 + '"age": 3}')
    assert not accepts(PERSON, '{"name": "a",  "age": 3}')
    assert not accepts(PERSON, ' {"name": "a", "age": 3}')
    assert not accepts(PERSON, '{"name": "a", "age": 3} ')
    assert not accepts(PERSON, '{"name": "a", "age": 3}\n')


def test_whitespace_none_accepts_only_compact_json() -> None:
    g = grammar(PERSON, whitespace="none")
    assert g.accepts('{"name":"a","age":3}')
    assert not g.accepts('{"name": "a","age":3}')
    assert not g.accepts('{ "name":"a","age":3}')


# --------------------------------------------------------- llama.cpp limits


@pytest.mark.parametrize("chunk", [3, 7])
def test_chunked_repetition_keeps_exact_bounds(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    # A small chunk exercises the same splitting llama.cpp's limit forces above 1000.
    monkeypatch.setattr(gbnf, "REPEAT_CHUNK", chunk)
    for lo, hi in [(0, 23), (5, 23), (17, None), (10, 10), (0, 21), (22, 40), (3, 9)]:
        schema: dict[str, Any] = {"type": "string", "minLength": lo}
        if hi is not None:
            schema["maxLength"] = hi
        g = parse_gbnf(json_schema_to_gbnf(schema))
        for n in range(45):
            assert g.accepts(json.dumps("x" * n)) == (lo <= n and (hi is None or n <= hi)), (
                lo,
                hi,
                n,
            )
    items = parse_gbnf(json_schema_to_gbnf({"type": "array", "minItems": 8, "maxItems": 19}))
    for n in range(25):
        assert items.accepts(json.dumps([0] * n)) == (8 <= n <= 19)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": 4321},
        {"type": "string", "minLength": 2500, "maxLength": 65536},
        {"type": "array", "minItems": 3001},
        {"type": "array", "items": {"type": "string", "maxLength": 2001}, "maxItems": 100_000},
    ],
)
def test_long_bounds_stay_within_llama_repetition_limits(schema: Any) -> None:
    parse_gbnf(json_schema_to_gbnf(schema))  # raises where llama.cpp would refuse or clamp


def test_huge_max_length_means_unbounded_and_huge_min_length_raises() -> None:
    assert accepts({"type": "string", "maxLength": 2**40}, json.dumps("y" * 50))
    with pytest.raises(SchemaError) as info:
        json_schema_to_gbnf({"type": "string", "minLength": 2**40})
    assert info.value.details["keyword"] == "minLength"


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"type": "string", "pattern": "^a+$"}, "pattern", "/"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems", "/"),
        ({"not": {"type": "null"}}, "not", "/"),
        ({"if": {}, "then": {}}, "if", "/"),
        ({"type": "object", "patternProperties": {"^x": {}}}, "patternProperties", "/"),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "multipleOf": 2}}},
            "multipleOf",
            "/properties/a",
        ),
        ({"type": "object", "minProperties": 1}, "minProperties", "/"),
        ({"type": "array", "items": {"contains": {}}}, "contains", "/items"),
        ({"type": "string", "format": "email"}, "format", "/"),
        ({"$ref": "https://example.invalid/s.json"}, "$ref", "/"),
        ({"$ref": "#/$defs/missing"}, "$ref", "/"),
        ({"$ref": "#anchor"}, "$ref", "/"),
        ({"$defs": {"x": {"type": "integer"}}, "$ref": "#/$defs/x", "minimum": 1}, "minimum", "/"),
        ({"allOf": [{"type": "integer"}, {"minimum": 0}]}, "allOf", "/"),
        ({"type": "integer", "anyOf": [{"minimum": 0}]}, "type", "/"),
        ({"type": "object", "properties": {"a": {"requried": ["x"]}}}, "requried", "/properties/a"),
        ({"type": "strnig"}, "type", "/"),
        ({"type": "string", "minLength": -1}, "minLength", "/"),
        ({"type": "string", "maxLength": 2.5}, "maxLength", "/"),
        ({"type": "object", "required": "a"}, "required", "/"),
        ({"enum": "a"}, "enum", "/"),
        ({"enum": [float("nan")]}, "enum", "/"),
        ({"anyOf": []}, "anyOf", "/"),
        ({"type": "number", "maximum": "10"}, "maximum", "/"),
        ({"type": "number", "minimum": True}, "minimum", "/"),
        ({"type": ["string", "null"], "nullable": True}, "nullable", "/"),
        ({"properties": {"a/b": {"$id": "x"}}}, "$id", "/properties/a~1b"),
        ({"type": "string", "format": "date", "maxLength": 3}, "format", "/"),
        ({"type": "array", "prefixItems": [{}], "additionalItems": {}}, "additionalItems", "/"),
    ],
)
def test_unsupported_or_invalid_keyword_raises_naming_keyword_and_path(
    schema: Any, keyword: str, path: str
) -> None:
    with pytest.raises(SchemaError) as info:
        json_schema_to_gbnf(schema)
    err = info.value
    assert err.code == "bad_schema"
    assert err.details == {"path": path, "keyword": keyword}
    assert keyword in err.message


@pytest.mark.parametrize(
    "schema",
    [
        False,
        {"type": "integer", "minimum": 5, "maximum": 3},
        {"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1},
        {"type": "array", "minItems": 3, "maxItems": 2},
        {"type": "object", "properties": {"a": False}, "required": ["a"]},
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": False, "minItems": 2},
        {"enum": []},
        {"type": "string", "enum": [1, 2]},
        {
            "$defs": {
                "loop": {
                    "type": "object",
                    "properties": {"x": {"$ref": "#/$defs/loop"}},
                    "required": ["x"],
                }
            },
            "$ref": "#/$defs/loop",
        },
    ],
)
def test_unsatisfiable_schema_raises(schema: Any) -> None:
    with pytest.raises(SchemaError) as info:
        json_schema_to_gbnf(schema)
    assert info.value.details == {"path": "/", "keyword": None}


def test_unsatisfiable_optional_parts_are_dropped() -> None:
    schema = {
        "type": "object",
        "properties": {
            "gone": False,
            "kept": {"type": "integer"},
            "loop": {"$ref": "#/$defs/loop"},
        },
        "$defs": {"loop": {"type": "array", "items": {"$ref": "#/$defs/loop"}, "minItems": 1}},
    }
    check(schema, good=['{"kept": 1}', "{}"], bad=['{"gone": 1}', '{"loop": []}'])


def test_left_recursive_ref_cycle_raises() -> None:
    schema = {
        "$defs": {"a": {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "null"}]}},
        "$ref": "#/$defs/a",
    }
    with pytest.raises(SchemaError) as info:
        json_schema_to_gbnf(schema)
    assert info.value.details["keyword"] == "$ref"


def test_schema_given_as_json_text() -> None:
    assert "root ::=" in json_schema_to_gbnf('{"type": "integer"}')
    assert "root ::=" in json_schema_to_gbnf(b'{"type": "integer"}')
    with pytest.raises(SchemaError):
        json_schema_to_gbnf("{not json")
    with pytest.raises(SchemaError):
        json_schema_to_gbnf(json.dumps([1, 2]))


def test_schema_error_survives_the_wire() -> None:
    with pytest.raises(SchemaError) as info:
        json_schema_to_gbnf({"type": "string", "pattern": "x"})
    rebuilt = from_wire(info.value.to_wire())
    assert type(rebuilt) is SchemaError
    assert isinstance(rebuilt, BadRequest)
    assert rebuilt.details == {"path": "/", "keyword": "pattern"}


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("whitespace", {"whitespace": "lots"}),
        ("max_indent", {"max_indent": -1}),
        ("max_digits", {"max_digits": 0}),
    ],
)
def test_grammar_options_are_validated(field: str, kwargs: dict[str, Any]) -> None:
    with pytest.raises(BadRequest) as info:
        GrammarOptions(**kwargs)
    assert info.value.details == {"field": field}


# --------------------------------------------------------------- soundness

CORPUS: dict[str, Any] = {
    "person": {
        **PERSON,
        "properties": {
            **PERSON["properties"],
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "minLength": 1, "maxLength": 8},
                    "zip": {"type": "integer"},
                },
                "required": ["city"],
            },
        },
    },
    "numbers": {
        "type": "object",
        "properties": {
            "ratio": {"type": "number", "minimum": 0, "maximum": 1},
            "temp": {"type": "number", "exclusiveMinimum": -273.15, "maximum": 1000.5},
            "n": {"type": "integer", "minimum": -1000, "exclusiveMaximum": -5},
            "tiny": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 0.001},
            "free": {"type": "number"},
            "count": {"type": "integer"},
        },
        "required": ["ratio", "temp", "n", "tiny", "free", "count"],
    },
    "formats": {
        "type": "object",
        "properties": {
            f: {"type": "string", "format": f} for f in ("date", "time", "date-time", "uuid")
        },
        "required": ["date", "time", "date-time", "uuid"],
    },
    "open": {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "idx": {"type": "boolean"}},
        "required": ["id"],
        "additionalProperties": {"type": "string", "maxLength": 4},
    },
    "open_any": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}},
        "additionalProperties": True,
    },
    "tuple": {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "integer"}],
        "items": False,
        "minItems": 1,
    },
    "nullable": {"type": ["string", "null", "boolean"], "maxLength": 3},
    "any_of": {
        "anyOf": [
            {"type": "integer", "maximum": -1},
            {"type": "array", "items": {"type": "boolean"}},
            {"const": {"k": [1, 2]}},
        ]
    },
    "one_of": {
        "oneOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}, {"enum": [None, True]}]
    },
    "tree": TREE,
    "enum_mixed": {"enum": ["a", 1, 1.5, None, True, [1], {"x": "y"}]},
    "anything": {},
    "true": True,
    "long": {
        "type": "array",
        "items": {"type": "string", "minLength": 3, "maxLength": 1200},
        "maxItems": 2,
    },
}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(CORPUS))
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_every_sampled_string_is_json_that_validates(name: str, seed: int) -> None:
    rng = random.Random(seed)
    schema = CORPUS[name]
    text = grammar(schema).sample(rng, max_depth=25)
    instance = json.loads(text)
    errors = [
        e.message
        for e in jsonschema.Draft202012Validator(schema, format_checker=FORMATS).iter_errors(
            instance
        )
    ]
    assert not errors, (text, errors)
