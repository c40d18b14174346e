"""JSON Schema → GBNF grammar for llama.cpp's grammar sampler.

The converter is sound first: every string the grammar accepts parses as JSON
that validates against the schema. Where JSON Schema asks for something a
stateless grammar cannot express (``uniqueItems``, ``not``, ``pattern``, ...)
conversion fails with :class:`~llamad.errors.SchemaError` naming the keyword
and where it sits, rather than handing back a looser grammar.

The grammar is deliberately *narrower* than the schema in a few places; a
narrower grammar only takes freedom away from the model, a looser one would
hand the caller JSON that fails validation:

- An object schema that declares ``properties`` (or ``required``) and says
  nothing about ``additionalProperties`` gets no undeclared keys: models
  invent keys when allowed to. Say ``"additionalProperties": true`` to allow
  them. Declared properties appear in declaration order; undeclared keys
  follow them, never spell a declared name, and contain no escapes.
- Numbers have at most ``max_digits`` digits in each of the integral and the
  fractional part and a two-digit exponent; integers are written without a
  fraction or exponent, and never as ``-0``. A number with ``minimum``/``maximum`` bounds has no
  exponent and at most 15 significant digits, so the bound comparison cannot
  be flipped by binary floating-point rounding on the consumer's side.
- Whitespace is limited to one space, or a newline and up to ``max_indent``
  spaces or tabs, after ``{ [ , :`` and before ``} ]``; none before or after
  the root value, so the grammar ends exactly where the value does and the
  model stops.
- Strings never use ``\\u`` escapes of surrogate halves (characters outside
  the BMP are written as themselves), so ``minLength``/``maxLength`` count
  what JSON Schema counts: code points.
- ``enum``/``const`` values are written compactly, as listed (an integral
  float such as ``2.0`` as the equal integer ``2``).
- A schema without ``type`` produces values of the types its keywords
  describe (``properties`` → objects, ``minimum`` → numbers, ...), or any
  JSON value when it has none.
- A ``maxLength``/``maxItems`` above 2**20 is treated as no bound (no context
  window holds that much output); a ``minLength``/``minItems`` above 2**16 is
  refused.
- ``oneOf`` is accepted only when its branches provably exclude each other
  (different JSON types, disjoint constant sets, or objects told apart by a
  required discriminator property or by a closed property set); otherwise an
  instance could match two branches and fail ``oneOf``.

llama.cpp rewrites ``x{m,n}`` into ``n`` helper rules, refuses more than 2000
and silently drops an upper bound above 2000; long repetitions are therefore
built from chunks of at most :data:`REPEAT_CHUNK`.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Final, Literal, TypeAlias

from llamad.errors import BadRequest, SchemaError

__all__ = [
    "REPEAT_CHUNK",
    "GrammarOptions",
    "SchemaError",
    "json_schema_to_gbnf",
]

REPEAT_CHUNK: Final = 1000
"""Largest repetition count written into a grammar (llama.cpp's limit is 2000)."""

_FLOAT_DIGITS: Final = 15  # decimal digits that survive a round trip through a double
_MAX_MIN_COUNT: Final = 1 << 16  # a larger minLength / minItems cannot be generated anyway
_UNBOUNDED_ABOVE: Final = 1 << 20  # a larger maxLength / maxItems is treated as no bound
_ABSENT: Final = object()


# ---------------------------------------------------------------- grammar IR


@dataclass(frozen=True)
class _Lit:
    text: str


@dataclass(frozen=True)
class _Chars:
    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True)
class _Ref:
    name: str


@dataclass(frozen=True)
class _Seq:
    items: tuple[_Expr, ...]


@dataclass(frozen=True)
class _Alt:
    options: tuple[_Expr, ...]


@dataclass(frozen=True)
class _Rep:
    item: _Expr
    lo: int
    hi: int | None


_Expr: TypeAlias = _Lit | _Chars | _Ref | _Seq | _Alt | _Rep

EMPTY: Final[_Expr] = _Seq(())  # matches the empty string
NOTHING: Final[_Expr] = _Alt(())  # matches no string at all


def _seq(*items: _Expr) -> _Expr:
    out: list[_Expr] = []
    for item in items:
        if item == NOTHING:
            return NOTHING
        for part in item.items if isinstance(item, _Seq) else (item,):
            if isinstance(part, _Lit) and out and isinstance(out[-1], _Lit):
                out[-1] = _Lit(out[-1].text + part.text)
            else:
                out.append(part)
    return out[0] if len(out) == 1 else _Seq(tuple(out))


def _alt(*options: _Expr) -> _Expr:
    out: list[_Expr] = []
    nullable = False
    for option in options:
        for part in option.options if isinstance(option, _Alt) else (option,):
            if part == EMPTY:
                nullable = True
            elif part not in out:
                out.append(part)
    body = out[0] if len(out) == 1 else _Alt(tuple(out))
    if nullable:
        return _rep(body, 0, 1) if out else EMPTY
    return body


def _rep(item: _Expr, lo: int, hi: int | None) -> _Expr:
    if hi is not None and hi < lo:
        return NOTHING
    if item == NOTHING:
        return EMPTY if lo == 0 else NOTHING
    if item == EMPTY or hi == 0:
        return EMPTY
    if lo == 1 and hi == 1:
        return item
    if isinstance(item, _Rep) and item.lo == 0 and item.hi == 1 and lo == 0 and hi == 1:
        return item
    chunk = _Rep(item, REPEAT_CHUNK, REPEAT_CHUNK)
    if lo > REPEAT_CHUNK:
        blocks, rest = divmod(lo, REPEAT_CHUNK)
        tail_hi = None if hi is None else hi - blocks * REPEAT_CHUNK
        return _seq(_rep(chunk, blocks, blocks), _rep(item, rest, tail_hi))
    if hi is not None and hi > REPEAT_CHUNK:
        if lo > 0:
            return _seq(_rep(item, lo, lo), _rep(item, 0, hi - lo))
        # Up to (blocks - 1) chunks and at most one chunk more, or exactly
        # `blocks` chunks and the remainder: together 0..hi, nested to a
        # depth that does not grow with hi.
        blocks, rest = divmod(hi, REPEAT_CHUNK)
        return _alt(
            _seq(_rep(chunk, 0, blocks - 1), _Rep(item, 0, REPEAT_CHUNK)),
            _seq(_rep(chunk, blocks, blocks), _rep(item, 0, rest)),
        )
    return _Rep(item, lo, hi)


def _opt(item: _Expr) -> _Expr:
    return _rep(item, 0, 1)


def _chars(spec: str | Sequence[tuple[int, int]], *, negated: bool = False) -> _Expr:
    ranges = [(ord(c), ord(c)) for c in spec] if isinstance(spec, str) else list(spec)
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted(r for r in ranges if r[0] <= r[1]):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    if not merged and not negated:
        return NOTHING
    return _Chars(tuple(merged), negated)


def _digit_range(lo: int, hi: int) -> _Expr:
    return _chars([(ord("0") + lo, ord("0") + hi)]) if lo <= hi else NOTHING


_DIGIT: Final = _digit_range(0, 9)
_NONZERO: Final = _digit_range(1, 9)
_HEX: Final = _chars([(ord("0"), ord("9")), (ord("a"), ord("f")), (ord("A"), ord("F"))])
# Characters a JSON string may hold unescaped.
_STRING_EXCLUDED: Final = ((0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\")))


# ------------------------------------------------------------ GBNF rendering


def _escape_char(cp: int, *, in_class: bool) -> str:
    special = {ord("\\"): "\\\\", ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t"}
    if cp in special:
        return special[cp]
    if in_class and chr(cp) in "[]-^":
        # llama.cpp has no escape for '^'; the others it does, but one hex form is simplest.
        return f"\\x{cp:02X}"
    if not in_class and cp == ord('"'):
        return '\\"'
    if cp < 0x20 or cp == 0x7F:
        return f"\\x{cp:02X}"
    if 0xD800 <= cp <= 0xDFFF or not chr(cp).isprintable():
        return f"\\u{cp:04X}" if cp <= 0xFFFF else f"\\U{cp:08X}"
    return chr(cp)


def _render(expr: _Expr) -> str:
    if isinstance(expr, _Lit):
        return '"' + "".join(_escape_char(ord(c), in_class=False) for c in expr.text) + '"'
    if isinstance(expr, _Chars):
        body = "".join(
            _escape_char(lo, in_class=True)
            if lo == hi
            else f"{_escape_char(lo, in_class=True)}-{_escape_char(hi, in_class=True)}"
            for lo, hi in expr.ranges
        )
        return f"[{'^' if expr.negated else ''}{body}]"
    if isinstance(expr, _Ref):
        return expr.name
    if isinstance(expr, _Alt):
        return " | ".join(_render(o) for o in expr.options)
    if isinstance(expr, _Rep):
        return _render_atom(expr.item) + _repeat_suffix(expr.lo, expr.hi)
    if not expr.items:
        return '""'
    return " ".join(_render_in_seq(i) for i in expr.items)


def _render_in_seq(item: _Expr) -> str:
    # llama.cpp multiplies the helper-rule counts of all repetitions in one
    # sequence; a group is its own sequence, so counted repetitions get one.
    if isinstance(item, _Alt) or (
        isinstance(item, _Rep) and _repeat_suffix(item.lo, item.hi)[0] == "{"
    ):
        return f"({_render(item)})"
    return _render(item)


def _render_atom(item: _Expr) -> str:
    simple = isinstance(item, _Ref | _Chars) or (isinstance(item, _Lit) and len(item.text) == 1)
    return _render(item) if simple else f"({_render(item)})"


def _repeat_suffix(lo: int, hi: int | None) -> str:
    if (lo, hi) == (0, 1):
        return "?"
    if (lo, hi) == (0, None):
        return "*"
    if (lo, hi) == (1, None):
        return "+"
    if hi is None:
        return f"{{{lo},}}"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


# --------------------------------------------------------------- rule table


class _Rules:
    """Named rules; identical expressions share one name."""

    def __init__(self) -> None:
        self.defs: dict[str, _Expr] = {}
        self._reserved: set[str] = set()
        self._builtins: dict[str, str] = {}
        self._by_expr: dict[_Expr, str] = {}

    def reserve(self, hint: str) -> str:
        base = re.sub(r"[^a-z0-9]+", "-", hint.lower()).strip("-") or "r"
        name, n = base, 1
        while name in self._reserved:
            n += 1
            name = f"{base}-{n}"
        self._reserved.add(name)
        return name

    def define(self, name: str, expr: _Expr) -> None:
        self.defs[name] = expr
        self._by_expr.setdefault(expr, name)

    def named(self, hint: str, expr: _Expr) -> _Expr:
        """A reference to a rule for ``expr`` (small expressions stay inline)."""
        if isinstance(expr, _Ref | _Lit | _Chars) or expr in (EMPTY, NOTHING):
            return expr
        existing = self._by_expr.get(expr)
        if existing is None:
            existing = self.reserve(hint)
            self.define(existing, expr)
        return _Ref(existing)

    def builtin(self, key: str, build: Callable[[], _Expr]) -> _Ref:
        """The helper rule ``key`` (named so unless a schema name took it), built once."""
        name = self._builtins.get(key)
        if name is None:
            # Reserve before building: the generic rules are mutually recursive.
            name = self._builtins[key] = self.reserve(key)
            self.define(name, build())
        return _Ref(name)


# ---------------------------------------------------------------- options


Whitespace: TypeAlias = Literal["limited", "none"]


@dataclass(frozen=True)
class GrammarOptions:
    """How the generated grammar spends the model's freedom.

    ``whitespace="none"`` forces compact JSON (fewest tokens); ``"limited"``
    allows the readable forms models like to write, bounded by
    ``max_indent`` so a model cannot loop on whitespace. ``max_digits`` bounds
    the integral and fractional digits of unbounded numbers.
    """

    whitespace: Whitespace = "limited"
    max_indent: int = 20
    max_digits: int = 16

    def __post_init__(self) -> None:
        if self.whitespace not in ("limited", "none"):
            raise BadRequest(
                f"whitespace: must be 'limited' or 'none', not {self.whitespace!r}",
                details={"field": "whitespace"},
            )
        if not isinstance(self.max_indent, int) or not 0 <= self.max_indent <= 200:
            raise BadRequest(
                f"max_indent: must be an int in [0, 200], not {self.max_indent!r}",
                details={"field": "max_indent"},
            )
        if not isinstance(self.max_digits, int) or not 1 <= self.max_digits <= 100:
            raise BadRequest(
                f"max_digits: must be an int in [1, 100], not {self.max_digits!r}",
                details={"field": "max_digits"},
            )


def json_schema_to_gbnf(
    schema: Mapping[str, Any] | bool | str | bytes,
    options: GrammarOptions | None = None,
) -> str:
    """Convert a JSON Schema (a mapping, a boolean, or its JSON text) to GBNF.

    The returned grammar's start rule is ``root``. Raises
    :class:`~llamad.errors.SchemaError` (code ``bad_schema``) with
    ``details={"path", "keyword"}`` for invalid or unsupported schemas and for
    schemas no JSON value satisfies.
    """
    if isinstance(schema, str | bytes):
        try:
            schema = json.loads(schema)
        except (ValueError, UnicodeDecodeError) as exc:
            raise _error("", None, f"schema is not valid JSON: {exc}") from exc
    return _Converter(schema, options or GrammarOptions()).convert()


# ------------------------------------------------------------- keyword sets

_ANNOTATIONS: Final = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "deprecated",
        "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "contentSchema",
        "discriminator", "$anchor", "$dynamicAnchor", "$defs", "definitions",
        "$schema", "$id", "$vocabulary",
    }
)  # fmt: skip
_UNSUPPORTED: Final = {
    "pattern": "regular expressions are not supported; use enum or format",
    "patternProperties": "is not supported",
    "propertyNames": "is not supported",
    "minProperties": "is not supported",
    "maxProperties": "is not supported",
    "dependentRequired": "is not supported",
    "dependentSchemas": "is not supported",
    "dependencies": "is not supported",
    "unevaluatedProperties": "is not supported; use additionalProperties",
    "unevaluatedItems": "is not supported; use items",
    "contains": "is not supported",
    "minContains": "is not supported",
    "maxContains": "is not supported",
    "uniqueItems": "uniqueItems: true cannot be expressed by a grammar",
    "multipleOf": "is not supported",
    "not": "is not supported",
    "if": "conditionals are not supported",
    "then": "conditionals are not supported",
    "else": "conditionals are not supported",
    "$dynamicRef": "is not supported; use $ref",
    "$recursiveRef": "is not supported; use $ref",
    "$recursiveAnchor": "is not supported; use $ref",
    "nullable": "is an OpenAPI keyword; use a type list such as ['string', 'null']",
}
_TYPE_KEYWORDS: Final = {
    "string": frozenset({"minLength", "maxLength", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems"}),
}
_APPLICATORS: Final = frozenset({"type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf"})
_KNOWN: Final = _APPLICATORS.union(*_TYPE_KEYWORDS.values())
_TYPES: Final = ("null", "boolean", "object", "array", "string", "number", "integer")
_FORMATS: Final = ("date", "time", "date-time", "uuid")


def _error(path: str, keyword: str | None, reason: str) -> SchemaError:
    where = path or "/"
    head = f"{keyword} at {where}" if keyword else f"schema at {where}"
    return SchemaError(f"{head}: {reason}", details={"path": where, "keyword": keyword})


def _pointer_part(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


# ------------------------------------------------------------ digit languages


@dataclass(frozen=True)
class _Digits:
    """A set of digit strings: whether it holds "" and an expression for the rest."""

    empty: bool
    nonempty: _Expr

    def anywhere(self) -> _Expr:
        return _alt(EMPTY, self.nonempty) if self.empty else self.nonempty


def _any_digits(budget: int) -> _Digits:
    return _Digits(True, _rep(_DIGIT, 1, budget) if budget > 0 else NOTHING)


def _fraction_between(
    lo: str | None, lo_incl: bool, hi: str | None, hi_incl: bool, budget: int
) -> _Digits:
    """Digit strings ``d`` (at most ``budget`` long) with ``0.d`` within the bounds.

    Bounds are digit strings without trailing zeros (``""`` is zero); ``None``
    means unbounded on that side.
    """
    if lo == "" and lo_incl:
        lo = None
    if hi == "" and not hi_incl:
        return _Digits(False, NOTHING)
    if lo is None and hi is None:
        return _any_digits(budget)
    if lo == "" and hi == "":
        return _Digits(False, NOTHING)
    if lo is None and hi == "":
        return _Digits(True, _rep(_Lit("0"), 1, budget) if budget > 0 else NOTHING)
    empty = lo is None and (hi is None or hi != "" or hi_incl)
    if budget <= 0:
        return _Digits(empty, NOTHING)
    if lo == "" and hi is None:
        return _Digits(False, _positive_digits(budget))
    first_lo = None if lo is None else int(lo[0]) if lo else 0
    first_hi = None if hi is None else int(hi[0]) if hi else 0
    free_lo = 0 if first_lo is None else first_lo + 1
    free_hi = 9 if first_hi is None else first_hi - 1
    options: list[_Expr] = [
        _seq(_digit_range(free_lo, free_hi), _any_digits(budget - 1).anywhere())
    ]
    for d in sorted({x for x in (first_lo, first_hi) if x is not None}):
        rest_lo = lo[1:] if lo is not None and first_lo == d else None
        rest_hi = hi[1:] if hi is not None and first_hi == d else None
        if (first_lo is not None and d < first_lo) or (first_hi is not None and d > first_hi):
            continue
        tail = _fraction_between(rest_lo, lo_incl, rest_hi, hi_incl, budget - 1)
        options.append(_seq(_Lit(str(d)), tail.anywhere()))
    return _Digits(empty, _alt(*options))


def _positive_digits(budget: int) -> _Expr:
    """Digit strings of at most ``budget`` digits, not all zero."""
    if budget <= 0:
        return NOTHING
    return _alt(
        _seq(_NONZERO, _rep(_DIGIT, 0, budget - 1)),
        _seq(_Lit("0"), _positive_digits(budget - 1)),
    )


def _same_length_range(lo: str, hi: str) -> _Expr:
    """Equal-length digit strings between ``lo`` and ``hi`` inclusive."""
    if lo == hi:
        return _Lit(lo)
    if len(lo) == 1:
        return _digit_range(int(lo), int(hi))
    if lo[0] == hi[0]:
        return _seq(_Lit(lo[0]), _same_length_range(lo[1:], hi[1:]))
    n = len(lo) - 1
    lo_full = lo[1:] == "0" * n
    hi_full = hi[1:] == "9" * n
    first = int(lo[0]) + (0 if lo_full else 1)
    last = int(hi[0]) - (0 if hi_full else 1)
    options = []
    if not lo_full:
        options.append(_seq(_Lit(lo[0]), _same_length_range(lo[1:], "9" * n)))
    options.append(_seq(_digit_range(first, last), _rep(_DIGIT, n, n)))
    if not hi_full:
        options.append(_seq(_Lit(hi[0]), _same_length_range("0" * n, hi[1:])))
    return _alt(*options)


def _uint_by_length(lo: int, hi: int | None, max_len: int) -> Iterator[tuple[int, _Expr]]:
    """(digit count, expression) for canonical decimals of the integers in [lo, hi]."""
    if hi is not None and hi < lo:
        return
    top = len(str(hi)) if hi is not None else max_len
    for length in range(len(str(lo)), min(top, max_len) + 1):
        first = max(lo, 10 ** (length - 1) if length > 1 else 0)
        last = 10**length - 1 if hi is None else min(hi, 10**length - 1)
        if first <= last:
            yield length, _same_length_range(str(first), str(last))


def _split_decimal(value: Decimal) -> tuple[int, str]:
    """A non-negative decimal as (integral part, fraction digits without trailing zeros)."""
    whole = int(value)
    frac = value - whole
    digits = format(frac, "f").partition(".")[2].rstrip("0") if frac else ""
    return whole, digits


# --------------------------------------------------------------- converter


class _Converter:
    def __init__(self, root: Any, options: GrammarOptions) -> None:
        self._root = root
        self._opts = options
        self._rules = _Rules()
        self._ref_names: dict[str, str] = {}

    # -- driver

    def convert(self) -> str:
        root = self._rules.reserve("root")
        self._ref_names["#"] = root
        self._rules.define(root, self._visit(self._root, "", "root", is_root=True))
        self._prune(root)
        if self._rules.defs[root] == NOTHING:
            raise _error("", None, "no JSON value satisfies this schema")
        self._check_left_recursion()
        self._inline_aliases()
        order = [root] + [n for n in self._rules.defs if n != root]
        return "".join(f"{n} ::= {_render(self._rules.defs[n])}\n" for n in order)

    # -- whitespace and generic JSON

    def _ws(self) -> _Expr:
        if self._opts.whitespace == "none":
            return EMPTY
        indent = _rep(_chars(" \t"), 0, self._opts.max_indent)
        return self._rules.builtin("ws", lambda: _opt(_alt(_Lit(" "), _seq(_Lit("\n"), indent))))

    def _char(self) -> _Ref:
        def build() -> _Expr:
            not_surrogate = _alt(
                _seq(_chars("0123456789abcABCefEF"), _rep(_HEX, 3, 3)),
                _seq(_chars("dD"), _digit_range(0, 7), _rep(_HEX, 2, 2)),
            )
            escape = _alt(_chars('"\\/bfnrt'), _seq(_Lit("u"), not_surrogate))
            return _alt(_chars(_STRING_EXCLUDED, negated=True), _seq(_Lit("\\"), escape))

        return self._rules.builtin("char", build)

    def _string_rule(self) -> _Ref:
        return self._rules.builtin(
            "string", lambda: _seq(_Lit('"'), _rep(self._char(), 0, None), _Lit('"'))
        )

    def _integer_rule(self) -> _Ref:
        digits = self._opts.max_digits
        magnitude = _seq(_NONZERO, _rep(_DIGIT, 0, digits - 1))
        return self._rules.builtin(
            "integer", lambda: _alt(_Lit("0"), _seq(_opt(_Lit("-")), magnitude))
        )

    def _number_rule(self) -> _Ref:
        def build() -> _Expr:
            digits = self._opts.max_digits
            integral = _alt(_Lit("0"), _seq(_NONZERO, _rep(_DIGIT, 0, digits - 1)))
            fraction = _seq(_Lit("."), _rep(_DIGIT, 1, digits))
            exponent = _seq(_chars("eE"), _opt(_chars("+-")), _rep(_DIGIT, 1, 2))
            return _seq(_opt(_Lit("-")), integral, _opt(fraction), _opt(exponent))

        return self._rules.builtin("number", build)

    def _value_rule(self) -> _Ref:
        def build() -> _Expr:
            return _alt(
                self._object_rule(), self._array_rule(), self._string_rule(), self._number_rule(),
                _Lit("true"), _Lit("false"), _Lit("null"),
            )  # fmt: skip

        return self._rules.builtin("value", build)

    def _object_rule(self) -> _Ref:
        def build() -> _Expr:
            member = _seq(self._string_rule(), _Lit(":"), self._ws(), self._value_rule())
            return self._container("{", member, "}")

        return self._rules.builtin("object", build)

    def _array_rule(self) -> _Ref:
        return self._rules.builtin("array", lambda: self._container("[", self._value_rule(), "]"))

    def _container(self, open_: str, item: _Expr, close: str) -> _Expr:
        """``open (item (, item)*)? close`` with bounded whitespace."""
        items = _seq(item, _rep(_seq(_Lit(","), self._ws(), item), 0, None))
        return self._wrap(open_, items, True, close)

    def _wrap(self, open_: str, body: _Expr, allows_empty: bool, close: str) -> _Expr:
        ws = self._ws()
        inner = _seq(body, ws)
        return _seq(_Lit(open_), ws, _alt(inner, EMPTY) if allows_empty else inner, _Lit(close))

    # -- schema walk

    def _visit(self, schema: Any, path: str, hint: str, *, is_root: bool = False) -> _Expr:
        if schema is True:
            return self._value_rule()
        if schema is False:
            return NOTHING
        if not isinstance(schema, Mapping):
            raise _error(path, None, "a schema must be an object or a boolean")
        assertions = self._check_keywords(schema, path, is_root=is_root)
        if "$ref" in schema:
            self._only(assertions, {"$ref"}, "$ref", path)
            return self._ref(schema["$ref"], path)
        if "allOf" in schema:
            return self._all_of(schema, assertions, path, hint)
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return self._any_of(schema, keyword, assertions, path, hint)
        if "enum" in schema or "const" in schema:
            self._only(
                assertions, {"enum", "const", "type"}, "enum" if "enum" in schema else "const", path
            )
            return self._constants(schema, path)
        return self._typed(schema, path, hint)

    def _check_keywords(self, schema: Mapping[str, Any], path: str, *, is_root: bool) -> set[str]:
        assertions: set[str] = set()
        for key, value in schema.items():
            if not isinstance(key, str):
                raise _error(path, str(key), "schema keywords must be strings")
            if key.startswith("x-") or key in _ANNOTATIONS:
                if key == "$id" and not is_root:
                    raise _error(path, key, "$id below the root is not supported")
                continue
            if key in _UNSUPPORTED and not (key == "uniqueItems" and value is False):
                raise _error(path, key, _UNSUPPORTED[key])
            if key not in _KNOWN and key != "uniqueItems":
                raise _error(path, key, "unknown keyword")
            assertions.add(key)
        assertions.discard("uniqueItems")
        return assertions

    @staticmethod
    def _only(assertions: set[str], allowed: set[str], owner: str, path: str) -> None:
        extra = sorted(assertions - allowed)
        if extra:
            raise _error(path, extra[0], f"cannot be combined with {owner} here")

    def _ref(self, ref: Any, path: str) -> _Expr:
        key, target = self._resolve(ref, path)
        name = self._ref_names.get(key)
        if name is None:
            hint = urllib.parse.unquote(key.rsplit("/", 1)[-1]) or "ref"
            name = self._rules.reserve(hint)
            self._ref_names[key] = name
            self._rules.define(name, self._visit(target, key[1:], name))
        return _Ref(name)

    def _resolve(self, ref: Any, path: str) -> tuple[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise _error(
                path, "$ref", f"only local references ('#/...') are supported, not {ref!r}"
            )
        pointer = urllib.parse.unquote(ref[1:])
        if pointer and not pointer.startswith("/"):
            raise _error(path, "$ref", f"anchors are not supported: {ref!r}")
        node = self._root
        for raw in pointer.split("/")[1:]:
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise _error(path, "$ref", f"{ref!r} does not resolve")
        return "#" + pointer, node

    def _all_of(
        self, schema: Mapping[str, Any], assertions: set[str], path: str, hint: str
    ) -> _Expr:
        branches = self._schema_list(schema["allOf"], "allOf", path)
        self._only(assertions, {"allOf"}, "allOf", path)
        if len(branches) != 1:
            raise _error(path, "allOf", "only a single-element allOf is supported")
        return self._visit(branches[0], f"{path}/allOf/0", hint)

    def _any_of(
        self, schema: Mapping[str, Any], keyword: str, assertions: set[str], path: str, hint: str
    ) -> _Expr:
        branches = self._schema_list(schema[keyword], keyword, path)
        self._only(assertions, {keyword}, keyword, path)
        if keyword == "oneOf":
            for i, a in enumerate(branches):
                for j in range(i + 1, len(branches)):
                    if not self._exclusive(a, branches[j]):
                        raise _error(
                            path, "oneOf",
                            f"branches {i} and {j} may both match one value, which oneOf forbids;"
                            " use anyOf or make them exclusive (a const discriminator property)",
                        )  # fmt: skip
        return _alt(
            *(
                self._rules.named(
                    f"{hint}-{i}", self._visit(b, f"{path}/{keyword}/{i}", f"{hint}-{i}")
                )
                for i, b in enumerate(branches)
            )
        )

    @staticmethod
    def _schema_list(value: Any, keyword: str, path: str) -> list[Any]:
        if not isinstance(value, list) or not value:
            raise _error(path, keyword, "must be a non-empty array of schemas")
        return value

    # -- enum / const

    def _constants(self, schema: Mapping[str, Any], path: str) -> _Expr:
        candidates: list[Any] | None = None
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise _error(path, "enum", "must be an array")
            candidates = list(schema["enum"])
        if "const" in schema:
            const = schema["const"]
            if candidates is None:
                candidates = [const]
            else:
                key = _canonical(const, path, "const")
                candidates = [v for v in candidates if _canonical(v, path, "enum") == key]
        assert candidates is not None
        types = self._declared_types(schema, path)
        seen: set[str] = set()
        options: list[_Expr] = []
        for value in candidates:
            key = _canonical(value, path, "enum")
            if key in seen or (types is not None and not (_types_of(value) & types)):
                continue
            seen.add(key)
            options.append(_Lit(_compact_json(value)))
        return _alt(*options)

    # -- typed schemas

    def _declared_types(self, schema: Mapping[str, Any], path: str) -> set[str] | None:
        if "type" not in schema:
            return None
        raw = schema["type"]
        names = [raw] if isinstance(raw, str) else raw
        if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
            raise _error(path, "type", "must be a type name or a non-empty array of distinct names")
        for name in names:
            if name not in _TYPES:
                raise _error(path, "type", f"unknown type {name!r}")
        return set(names)

    def _typed(self, schema: Mapping[str, Any], path: str, hint: str) -> _Expr:
        types = self._declared_types(schema, path)
        if types is None:
            types = {t for t, kws in _TYPE_KEYWORDS.items() if kws & schema.keys()}
            if not types:
                return self._value_rule()
        if "number" in types:
            types.discard("integer")
        options: list[_Expr] = []
        for name in _TYPES:
            if name not in types:
                continue
            if name == "null":
                options.append(_Lit("null"))
            elif name == "boolean":
                options.append(_alt(_Lit("true"), _Lit("false")))
            elif name == "string":
                options.append(self._string(schema, path))
            elif name in ("number", "integer"):
                options.append(self._number(schema, path, integer=name == "integer"))
            elif name == "object":
                options.append(self._rules.named(hint, self._object(schema, path, hint)))
            else:
                options.append(self._rules.named(hint, self._array(schema, path, hint)))
        return _alt(*options)

    def _count(self, schema: Mapping[str, Any], keyword: str, path: str) -> int | None:
        value = schema.get(keyword)
        if value is None and keyword not in schema:
            return None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _error(path, keyword, "must be a non-negative integer")
        if keyword.startswith("min") and value > _MAX_MIN_COUNT:
            raise _error(path, keyword, f"more than {_MAX_MIN_COUNT} cannot be generated")
        if keyword.startswith("max") and value > _UNBOUNDED_ABOVE:
            # No context window holds that much output: the bound cannot bite.
            return None
        return value

    def _string(self, schema: Mapping[str, Any], path: str) -> _Expr:
        lo = self._count(schema, "minLength", path)
        hi = self._count(schema, "maxLength", path)
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in _FORMATS:
                supported = ", ".join(_FORMATS)
                raise _error(
                    path, "format", f"format {fmt!r} is not supported (supported: {supported})"
                )
            if lo is not None or hi is not None:
                raise _error(path, "format", "cannot be combined with minLength/maxLength")
            return _seq(_Lit('"'), self._format(fmt), _Lit('"'))
        if lo is None and hi is None:
            return self._string_rule()
        return _seq(_Lit('"'), _rep(self._char(), lo or 0, hi), _Lit('"'))

    def _format(self, fmt: str) -> _Ref:
        two = _rep(_DIGIT, 2, 2)
        day28 = _alt(
            _seq(_Lit("0"), _NONZERO), _seq(_Lit("1"), _DIGIT), _seq(_Lit("2"), _digit_range(0, 8))
        )
        day30 = _alt(day28, _Lit("29"), _Lit("30"))
        day31 = _alt(day30, _Lit("31"))
        by4 = _alt(
            _seq(_Lit("0"), _chars("48")),
            _seq(_chars("2468"), _chars("048")),
            _seq(_chars("13579"), _chars("26")),
        )

        def date() -> _Expr:
            year = _alt(  # 0001..9999: Python's date and RFC 3339 have no year zero
                _seq(_Lit("000"), _NONZERO),
                _seq(_Lit("00"), _NONZERO, _DIGIT),
                _seq(_Lit("0"), _NONZERO, two),
                _seq(_NONZERO, _rep(_DIGIT, 3, 3)),
            )
            leap_year = _alt(_seq(two, by4), _seq(by4, _Lit("00")))
            month_day = _alt(
                _seq(
                    _alt(_seq(_Lit("0"), _chars("13578")), _seq(_Lit("1"), _chars("02"))),
                    _Lit("-"),
                    day31,
                ),
                _seq(_alt(_seq(_Lit("0"), _chars("469")), _Lit("11")), _Lit("-"), day30),
                _seq(_Lit("02-"), day28),
            )
            return _alt(_seq(year, _Lit("-"), month_day), _seq(leap_year, _Lit("-02-29")))

        def time() -> _Expr:
            hour = _alt(_seq(_chars("01"), _DIGIT), _seq(_Lit("2"), _digit_range(0, 3)))
            sixty = _seq(_digit_range(0, 5), _DIGIT)
            offset = _alt(_Lit("Z"), _seq(_chars("+-"), hour, _Lit(":"), sixty))
            fraction = _opt(_seq(_Lit("."), _rep(_DIGIT, 1, 9)))
            return _seq(hour, _Lit(":"), sixty, _Lit(":"), sixty, fraction, offset)

        def uuid() -> _Expr:
            groups = [_rep(_HEX, n, n) for n in (8, 4, 4, 4, 12)]
            return _seq(groups[0], *(_seq(_Lit("-"), g) for g in groups[1:]))

        builders = {
            "date": date,
            "time": time,
            "uuid": uuid,
            "date-time": lambda: _seq(self._format("date"), _Lit("T"), self._format("time")),
        }
        return self._rules.builtin(f"{fmt}-format", builders[fmt])

    # -- numbers

    def _bounds(
        self, schema: Mapping[str, Any], path: str
    ) -> tuple[Decimal | None, bool, Decimal | None, bool]:
        def number(keyword: str) -> Decimal | None:
            value = schema.get(keyword)
            if keyword not in schema:
                return None
            if isinstance(value, bool):
                raise _error(path, keyword, "must be a number")
            if not isinstance(value, int | float) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise _error(path, keyword, "must be a finite number")
            try:
                return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
            except InvalidOperation as exc:  # pragma: no cover - repr of a finite float parses
                raise _error(path, keyword, "must be a finite number") from exc

        lo, lo_incl = number("minimum"), True
        hi, hi_incl = number("maximum"), True
        for keyword, is_lower in (("exclusiveMinimum", True), ("exclusiveMaximum", False)):
            if keyword not in schema:
                continue
            flag = schema[keyword]
            if isinstance(flag, bool):  # draft 4: a flag on minimum / maximum
                if is_lower:
                    lo_incl = not flag or lo is None
                else:
                    hi_incl = not flag or hi is None
                continue
            bound = number(keyword)
            if is_lower and bound is not None and (lo is None or bound >= lo):
                lo, lo_incl = bound, False
            elif not is_lower and bound is not None and (hi is None or bound <= hi):
                hi, hi_incl = bound, False
        return lo, lo_incl, hi, hi_incl

    def _number(self, schema: Mapping[str, Any], path: str, *, integer: bool) -> _Expr:
        lo, lo_incl, hi, hi_incl = self._bounds(schema, path)
        if lo is None and hi is None:
            return self._integer_rule() if integer else self._number_rule()
        if integer:
            ilo = None if lo is None else math.ceil(lo) if lo_incl else math.floor(lo) + 1
            ihi = None if hi is None else math.floor(hi) if hi_incl else math.ceil(hi) - 1
            return self._integer_range(ilo, ihi)
        options: list[_Expr] = []
        if hi is None or hi > 0 or (hi == 0 and hi_incl):
            start, start_incl = (lo, lo_incl) if lo is not None and lo >= 0 else (Decimal(0), True)
            options.append(self._magnitude(start, start_incl, hi, hi_incl))
        if lo is None or lo < 0:
            # -m with m above -hi (or above zero) and up to -lo
            m_lo, m_lo_incl = (-hi, hi_incl) if hi is not None and hi < 0 else (Decimal(0), False)
            m_hi = None if lo is None else -lo
            options.append(_seq(_Lit("-"), self._magnitude(m_lo, m_lo_incl, m_hi, lo_incl)))
        return _alt(*options)

    def _magnitude(self, lo: Decimal, lo_incl: bool, hi: Decimal | None, hi_incl: bool) -> _Expr:
        """Non-negative decimals (no exponent, <= 15 digits) within the bounds."""
        if hi is not None and (hi < lo or (hi == lo and not (lo_incl and hi_incl))):
            return NOTHING
        whole_lo, frac_lo = _split_decimal(lo)
        whole_hi, frac_hi = _split_decimal(hi) if hi is not None else (None, None)

        def with_fraction(integral: _Expr, width: int, digits: _Digits) -> _Expr:
            budget = _FLOAT_DIGITS - width
            if budget < 0:
                return NOTHING
            fraction = _seq(_Lit("."), digits.nonempty)
            return _seq(integral, _alt(EMPTY, fraction) if digits.empty else fraction)

        options: list[_Expr] = []
        inner_hi = None if whole_hi is None else whole_hi - 1
        for width, integral in _uint_by_length(whole_lo + 1, inner_hi, _FLOAT_DIGITS):
            options.append(with_fraction(integral, width, _any_digits(_FLOAT_DIGITS - width)))
        width_lo = len(str(whole_lo))
        if whole_hi == whole_lo:
            digits = _fraction_between(frac_lo, lo_incl, frac_hi, hi_incl, _FLOAT_DIGITS - width_lo)
            options.append(with_fraction(_Lit(str(whole_lo)), width_lo, digits))
        else:
            digits = _fraction_between(frac_lo, lo_incl, None, True, _FLOAT_DIGITS - width_lo)
            options.append(with_fraction(_Lit(str(whole_lo)), width_lo, digits))
            if whole_hi is not None:
                width_hi = len(str(whole_hi))
                digits = _fraction_between(None, True, frac_hi, hi_incl, _FLOAT_DIGITS - width_hi)
                options.append(with_fraction(_Lit(str(whole_hi)), width_hi, digits))
        return _alt(*options)

    def _integer_range(self, lo: int | None, hi: int | None) -> _Expr:
        def uint(a: int, b: int | None) -> _Expr:
            cap = len(str(b)) if b is not None else max(len(str(a)), self._opts.max_digits)
            return _alt(*(e for _, e in _uint_by_length(a, b, cap)))

        options: list[_Expr] = []
        if hi is None or hi >= 0:
            options.append(uint(max(lo, 0) if lo is not None else 0, hi))
        if lo is None or lo < 0:
            mag_lo = 1 if hi is None or hi >= 0 else -hi
            options.append(_seq(_Lit("-"), uint(mag_lo, None if lo is None else -lo)))
        return _alt(*options)

    # -- objects

    def _object(self, schema: Mapping[str, Any], path: str, hint: str) -> _Expr:
        props = schema.get("properties", {})
        if not isinstance(props, Mapping) or not all(isinstance(k, str) for k in props):
            raise _error(path, "properties", "must be an object mapping names to schemas")
        required = schema.get("required", [])
        if (
            not isinstance(required, list)
            or not all(isinstance(r, str) for r in required)
            or len(set(required)) != len(required)
        ):
            raise _error(path, "required", "must be an array of distinct strings")
        extra_schema = schema.get("additionalProperties", _ABSENT)
        if extra_schema is _ABSENT:
            extra_schema = not (props or required)
        names = list(props) + [r for r in required if r not in props]
        if not names and extra_schema is True:
            return self._object_rule()

        ws = self._ws()
        members: list[tuple[_Expr, bool]] = []
        for name in names:
            sub_hint = f"{hint}-{name}"
            sub_path = f"{path}/properties/{_pointer_part(name)}"
            value = self._rules.named(
                sub_hint, self._visit(props.get(name, True), sub_path, sub_hint)
            )
            key = _Lit(json.dumps(name, ensure_ascii=False) + ":")
            members.append(
                (self._rules.named(f"{sub_hint}-kv", _seq(key, ws, value)), name in required)
            )
        extra = NOTHING
        if extra_schema is not False:
            value = self._visit(extra_schema, f"{path}/additionalProperties", f"{hint}-extra")
            value = self._rules.named(f"{hint}-extra", value)
            extra = _seq(self._undeclared_key(names), _Lit(":"), ws, value)
            extra = self._rules.named(f"{hint}-extra-kv", extra)

        sep = _seq(_Lit(","), ws)
        after = _rep(_seq(sep, extra), 0, None)  # members after something was written
        first = _seq(extra, after)  # members when nothing was written yet
        for i in reversed(range(len(members))):
            member, is_required = members[i]
            if not is_required and after not in (EMPTY,) and i > 0:
                after = self._rules.named(f"{hint}-after-{names[i]}", after)
            here = _seq(member, after)
            first = here if is_required else _alt(here, first)
            after = _seq(_seq(sep, member) if is_required else _opt(_seq(sep, member)), after)
        return self._wrap("{", first, not any(r for _, r in members), "}")

    def _undeclared_key(self, declared: list[str]) -> _Expr:
        if not declared:
            return self._string_rule()
        # Escape-free keys: an escape could spell a declared name in another form.
        spelled = [n for n in declared if all(_key_char(c) for c in n)]
        free = _rep(_chars(_STRING_EXCLUDED, negated=True), 0, None)

        def trie(words: set[str]) -> _Expr:
            heads = sorted({w[0] for w in words if w})
            options: list[_Expr] = [] if "" in words else [EMPTY]
            for c in heads:
                options.append(_seq(_Lit(c), trie({w[1:] for w in words if w[:1] == c})))
            others = _chars([*_STRING_EXCLUDED, *((ord(c), ord(c)) for c in heads)], negated=True)
            options.append(_seq(others, free))
            return _alt(*options)

        return _seq(_Lit('"'), trie(set(spelled)), _Lit('"'))

    # -- arrays

    def _array(self, schema: Mapping[str, Any], path: str, hint: str) -> _Expr:
        lo = self._count(schema, "minItems", path) or 0
        hi = self._count(schema, "maxItems", path)
        if "prefixItems" in schema:
            prefix, prefix_key = schema["prefixItems"], "prefixItems"
            rest, rest_key = schema.get("items", True), "items"
            if "additionalItems" in schema:
                raise _error(
                    path, "additionalItems", "cannot be combined with prefixItems; use items"
                )
        elif isinstance(schema.get("items"), list):
            prefix, prefix_key = schema["items"], "items"
            rest, rest_key = schema.get("additionalItems", True), "additionalItems"
        else:
            prefix, prefix_key = [], "prefixItems"
            rest, rest_key = schema.get("items", True), "items"
        if not isinstance(prefix, list):
            raise _error(path, prefix_key, "must be an array of schemas")
        if hi is not None and hi < lo:
            return NOTHING
        if not prefix and rest is True and lo == 0 and hi is None:
            return self._array_rule()
        slots = [
            self._rules.named(
                f"{hint}-{i}", self._visit(p, f"{path}/{prefix_key}/{i}", f"{hint}-{i}")
            )
            for i, p in enumerate(prefix)
        ]
        item = self._rules.named(
            f"{hint}-item", self._visit(rest, f"{path}/{rest_key}", f"{hint}-item")
        )
        sep = _seq(_Lit(","), self._ws())

        def from_index(i: int) -> _Expr:
            # items i.. (each after a separator); may stop here iff i >= minItems
            if hi is not None and i >= hi:
                return EMPTY
            if i < len(slots):
                one = _seq(sep, slots[i], from_index(i + 1))
                return one if i < lo else _opt(one)
            return _rep(_seq(sep, item), max(0, lo - i), None if hi is None else hi - i)

        if hi == 0:
            return self._wrap("[", NOTHING, True, "]")
        if slots:
            return self._wrap("[", _seq(slots[0], from_index(1)), lo == 0, "]")
        more = _rep(_seq(sep, item), max(0, lo - 1), None if hi is None else hi - 1)
        return self._wrap("[", _seq(item, more), lo == 0, "]")

    # -- oneOf exclusivity

    def _deref(self, schema: Any, depth: int = 0) -> Any:
        while isinstance(schema, Mapping) and "$ref" in schema and depth < 32:
            schema = self._resolve(schema["$ref"], "")[1]
            depth += 1
        return schema

    def _constant_set(self, schema: Any) -> set[str] | None:
        schema = self._deref(schema)
        if not isinstance(schema, Mapping):
            return None
        if "const" in schema:
            return {_canonical(schema["const"], "", "const")}
        if "enum" in schema and isinstance(schema["enum"], list):
            return {_canonical(v, "", "enum") for v in schema["enum"]}
        return None

    def _kinds(self, schema: Any, depth: int = 0) -> set[str]:
        """JSON types a value valid under ``schema`` may have (integer counts as number)."""
        every = {"null", "boolean", "object", "array", "string", "number"}
        schema = self._deref(schema)
        if schema is False:
            return set()
        if not isinstance(schema, Mapping) or depth > 32:
            return every
        kinds = every
        if "type" in schema:
            raw = schema["type"]
            names = {raw} if isinstance(raw, str) else set(raw) if isinstance(raw, list) else every
            kinds = {"number" if n == "integer" else str(n) for n in names}
        constants = [schema["const"]] if "const" in schema else schema.get("enum")
        if isinstance(constants, list):
            kinds = kinds & {
                "number" if t == "integer" else t for v in constants for t in _types_of(v)
            }
        for keyword in ("anyOf", "oneOf", "allOf"):
            branches = schema.get(keyword)
            if isinstance(branches, list) and branches:
                parts = [self._kinds(b, depth + 1) for b in branches]
                first, *rest = parts
                kinds &= first.intersection(*rest) if keyword == "allOf" else first.union(*rest)
        return kinds

    def _exclusive(self, a: Any, b: Any) -> bool:
        ca, cb = self._constant_set(a), self._constant_set(b)
        if ca is not None and cb is not None:
            return not ca & cb
        common = self._kinds(a) & self._kinds(b)
        if not common:
            return True
        return common == {"object"} and (
            self._objects_exclusive(a, b) or self._objects_exclusive(b, a)
        )

    def _objects_exclusive(self, a: Any, b: Any) -> bool:
        a, b = self._deref(a), self._deref(b)
        if not (isinstance(a, Mapping) and isinstance(b, Mapping)):
            return False
        a_props, b_props = a.get("properties", {}), b.get("properties", {})
        a_req, b_req = a.get("required", []), b.get("required", [])
        if not all(isinstance(x, Mapping) for x in (a_props, b_props)):
            return False
        if not all(isinstance(x, list) for x in (a_req, b_req)):
            return False
        for key in a_req:
            if key in b_req and key in a_props and key in b_props:
                ca, cb = self._constant_set(a_props[key]), self._constant_set(b_props[key])
                if ca is not None and cb is not None and not ca & cb:
                    return True
            closed = b.get("additionalProperties") is False and "patternProperties" not in b
            if closed and key not in b_props:
                return True
        return False

    # -- cleanup

    def _prune(self, root: str) -> None:
        """Drop rules that derive no finite string, then unreachable ones."""
        productive: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, expr in self._rules.defs.items():
                if name not in productive and _productive(expr, productive):
                    productive.add(name)
                    changed = True
        defs = {
            n: _substitute_dead(e, productive)
            for n, e in self._rules.defs.items()
            if n in productive
        }
        defs.setdefault(root, NOTHING)
        reachable: list[str] = [root]
        seen = {root}
        while reachable:
            for ref in _refs(defs[reachable.pop()]):
                if ref not in seen:
                    seen.add(ref)
                    reachable.append(ref)
        self._rules.defs = {n: e for n, e in defs.items() if n in seen}

    def _inline_aliases(self) -> None:
        """``a ::= b`` where nothing else uses ``b``: give ``a`` the body of ``b``."""
        defs = self._rules.defs
        uses: dict[str, int] = {}
        for expr in defs.values():
            for ref in _refs(expr):
                uses[ref] = uses.get(ref, 0) + 1
        for name in list(defs):
            target = defs.get(name)
            while isinstance(target, _Ref) and target.name != name and uses.get(target.name) == 1:
                defs[name] = target = defs.pop(target.name)

    def _check_left_recursion(self) -> None:
        defs = self._rules.defs
        nullable: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, expr in defs.items():
                if name not in nullable and _nullable(expr, nullable):
                    nullable.add(name)
                    changed = True
        leading = {n: _leading_refs(e, nullable) for n, e in defs.items()}
        for start in defs:
            stack, seen = list(leading[start]), set()
            while stack:
                name = stack.pop()
                if name == start:
                    raise _error("", "$ref", f"reference cycle through {start!r} consumes no input")
                if name not in seen:
                    seen.add(name)
                    stack.extend(leading.get(name, ()))


# ---------------------------------------------------------------- IR helpers


def _key_char(c: str) -> bool:
    cp = ord(c)
    return not any(lo <= cp <= hi for lo, hi in _STRING_EXCLUDED)


def _types_of(value: Any) -> set[str]:
    if value is None:
        return {"null"}
    if isinstance(value, bool):
        return {"boolean"}
    if isinstance(value, int):
        return {"integer", "number"}
    if isinstance(value, float):
        return {"number", "integer"} if value.is_integer() else {"number"}
    if isinstance(value, str):
        return {"string"}
    if isinstance(value, list):
        return {"array"}
    if isinstance(value, Mapping):
        return {"object"}
    return set()


def _compact_json(value: Any) -> str:
    """``value`` as compact JSON; integral floats as integers (equal in JSON Schema,
    and an integer under every draft's ``integer`` type)."""

    def normal(v: Any) -> Any:
        if isinstance(v, float) and v.is_integer():
            return int(v)
        if isinstance(v, list):
            return [normal(x) for x in v]
        if isinstance(v, Mapping):
            return {k: normal(x) for k, x in v.items()}
        return v

    return json.dumps(normal(value), ensure_ascii=False, separators=(",", ":"))


def _canonical(value: Any, path: str, keyword: str) -> str:
    """A key equal for values JSON Schema calls equal (1 == 1.0, true != 1)."""

    def normal(v: Any) -> Any:
        if isinstance(v, bool) or v is None or isinstance(v, str):
            return v
        if isinstance(v, int | float):
            if isinstance(v, float) and not math.isfinite(v):
                raise _error(path, keyword, "values must be finite JSON numbers")
            return int(v) if isinstance(v, float) and v.is_integer() else v
        if isinstance(v, list):
            return [normal(x) for x in v]
        if isinstance(v, Mapping) and all(isinstance(k, str) for k in v):
            return {k: normal(x) for k, x in v.items()}
        raise _error(path, keyword, f"{type(v).__name__} is not a JSON value")

    return json.dumps(normal(value), sort_keys=True, ensure_ascii=False)


def _productive(expr: _Expr, productive: set[str]) -> bool:
    if isinstance(expr, _Lit | _Chars):
        return True
    if isinstance(expr, _Ref):
        return expr.name in productive
    if isinstance(expr, _Seq):
        return all(_productive(i, productive) for i in expr.items)
    if isinstance(expr, _Alt):
        return any(_productive(o, productive) for o in expr.options)
    return expr.lo == 0 or _productive(expr.item, productive)


def _substitute_dead(expr: _Expr, productive: set[str]) -> _Expr:
    if isinstance(expr, _Ref):
        return expr if expr.name in productive else NOTHING
    if isinstance(expr, _Seq):
        return _seq(*(_substitute_dead(i, productive) for i in expr.items))
    if isinstance(expr, _Alt):
        return _alt(*(_substitute_dead(o, productive) for o in expr.options))
    if isinstance(expr, _Rep):
        return _rep(_substitute_dead(expr.item, productive), expr.lo, expr.hi)
    return expr


def _refs(expr: _Expr) -> Iterator[str]:
    if isinstance(expr, _Ref):
        yield expr.name
    elif isinstance(expr, _Seq):
        for i in expr.items:
            yield from _refs(i)
    elif isinstance(expr, _Alt):
        for o in expr.options:
            yield from _refs(o)
    elif isinstance(expr, _Rep):
        yield from _refs(expr.item)


def _nullable(expr: _Expr, nullable: set[str]) -> bool:
    if isinstance(expr, _Lit):
        return not expr.text
    if isinstance(expr, _Chars):
        return False
    if isinstance(expr, _Ref):
        return expr.name in nullable
    if isinstance(expr, _Seq):
        return all(_nullable(i, nullable) for i in expr.items)
    if isinstance(expr, _Alt):
        return any(_nullable(o, nullable) for o in expr.options)
    return expr.lo == 0 or _nullable(expr.item, nullable)


def _leading_refs(expr: _Expr, nullable: set[str]) -> set[str]:
    """Rules that can be entered before ``expr`` consumes a character."""
    if isinstance(expr, _Ref):
        return {expr.name}
    if isinstance(expr, _Seq):
        out: set[str] = set()
        for item in expr.items:
            out |= _leading_refs(item, nullable)
            if not _nullable(item, nullable):
                break
        return out
    if isinstance(expr, _Alt):
        return set().union(*(_leading_refs(o, nullable) for o in expr.options))
    if isinstance(expr, _Rep):
        return _leading_refs(expr.item, nullable)
    return set()
