"""The schema walk: one JSON Schema node at a time to a grammar expression."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

from llamad.llama_ffi.json_schema.formats import FORMATS, format_rule
from llamad.llama_ffi.json_schema.gbnf import (
    EMPTY,
    NOTHING,
    Expr,
    Lit,
    Ref,
    alt,
    chars,
    opt,
    rep,
    seq,
)
from llamad.llama_ffi.json_schema.json_rules import STRING_EXCLUDED, JsonRules, unescaped
from llamad.llama_ffi.json_schema.keywords import (
    TYPE_KEYWORDS,
    TYPES,
    check_keywords,
    count,
    declared_types,
    only,
    pointer_part,
    resolve_ref,
    schema_error,
    schema_list,
)
from llamad.llama_ffi.json_schema.numbers import decimal_range, integer_range, read_bounds
from llamad.llama_ffi.json_schema.one_of import exclusive
from llamad.llama_ffi.json_schema.options import GrammarOptions
from llamad.llama_ffi.json_schema.rules import Rules
from llamad.llama_ffi.json_schema.values import canonical, compact_json, types_of

_ABSENT: Final = object()


def json_schema_to_gbnf(
    schema: Mapping[str, Any] | bool | str | bytes,
    options: GrammarOptions | None = None,
    *,
    prefix: str = "",
    suffix: str = "",
) -> str:
    """Convert a JSON Schema (a mapping, a boolean, or its JSON text) to GBNF.

    The returned grammar's start rule is ``root``; ``prefix`` and ``suffix``
    are literal text the grammar demands before and after the value (a tool
    call's markers, ``<tool_call>`` ... ``</tool_call>``), while ``$ref: "#"``
    still means the value. Raises
    :class:`~llamad.errors.SchemaError` (code ``bad_schema``) with
    ``details={"path", "keyword"}`` for invalid or unsupported schemas and for
    schemas no JSON value satisfies.
    """
    if isinstance(schema, str | bytes):
        try:
            schema = json.loads(schema)
        except (ValueError, UnicodeDecodeError) as exc:
            raise schema_error("", None, f"schema is not valid JSON: {exc}") from exc
    _refuse_lone_surrogates(schema)
    return _Converter(schema, options or GrammarOptions()).convert(prefix, suffix)


def _refuse_lone_surrogates(schema: Any) -> None:
    # A lone surrogate (which json.loads makes of a "\ud800" escape) is not
    # text: a grammar literal holding one would ask the model for bytes that
    # are not UTF-8, and the output could never equal the schema's value.
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            texts = [value]
        elif isinstance(value, Mapping):
            texts = [k for k in value if isinstance(k, str)]
            stack.extend((v, f"{path}/{pointer_part(str(k))}") for k, v in value.items())
        elif isinstance(value, list | tuple):
            texts = []
            stack.extend((v, f"{path}/{i}") for i, v in enumerate(value))
        else:
            continue
        for text in texts:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                raise schema_error(
                    path, None, f"{text!r} holds a lone surrogate, which is not Unicode text"
                ) from None


class _Converter:
    def __init__(self, root: Any, options: GrammarOptions) -> None:
        self._root = root
        self._opts = options
        self._rules = Rules()
        self._json = JsonRules(self._rules, options)
        self._ref_names: dict[str, str] = {}

    def convert(self, prefix: str = "", suffix: str = "") -> str:
        root = self._rules.reserve("root")
        if prefix or suffix:
            value = self._rules.reserve("value")
            self._ref_names["#"] = value
            self._rules.define(value, self._visit(self._root, "", "value", is_root=True))
            self._rules.define(root, seq(Lit(prefix), Ref(value), Lit(suffix)))
        else:
            self._ref_names["#"] = root
            self._rules.define(root, self._visit(self._root, "", "root", is_root=True))
        self._rules.prune(root)
        if self._rules.defs[root] == NOTHING:
            raise schema_error("", None, "no JSON value satisfies this schema")
        cycle = self._rules.left_recursive()
        if cycle is not None:
            raise schema_error("", "$ref", f"reference cycle through {cycle!r} consumes no input")
        self._rules.inline_aliases()
        return self._rules.render(root)

    # -- applicators

    def _visit(self, schema: Any, path: str, hint: str, *, is_root: bool = False) -> Expr:
        if schema is True:
            return self._json.value()
        if schema is False:
            return NOTHING
        if not isinstance(schema, Mapping):
            raise schema_error(path, None, "a schema must be an object or a boolean")
        assertions = check_keywords(schema, path, is_root=is_root)
        if "$ref" in schema:
            only(assertions, {"$ref"}, "$ref", path)
            return self._ref(schema["$ref"], path)
        if "allOf" in schema:
            return self._all_of(schema, assertions, path, hint)
        for keyword in ("anyOf", "oneOf"):
            if keyword in schema:
                return self._any_of(schema, keyword, assertions, path, hint)
        if "enum" in schema or "const" in schema:
            only(
                assertions, {"enum", "const", "type"}, "enum" if "enum" in schema else "const", path
            )
            return self._constants(schema, path)
        return self._typed(schema, path, hint)

    def _ref(self, ref: Any, path: str) -> Expr:
        key, target = resolve_ref(self._root, ref, path)
        name = self._ref_names.get(key)
        if name is None:
            hint = urllib.parse.unquote(key.rsplit("/", 1)[-1]) or "ref"
            name = self._rules.reserve(hint)
            self._ref_names[key] = name
            self._rules.define(name, self._visit(target, key[1:], name))
        return Ref(name)

    def _all_of(
        self, schema: Mapping[str, Any], assertions: set[str], path: str, hint: str
    ) -> Expr:
        branches = schema_list(schema["allOf"], "allOf", path)
        only(assertions, {"allOf"}, "allOf", path)
        if len(branches) != 1:
            raise schema_error(path, "allOf", "only a single-element allOf is supported")
        return self._visit(branches[0], f"{path}/allOf/0", hint)

    def _any_of(
        self, schema: Mapping[str, Any], keyword: str, assertions: set[str], path: str, hint: str
    ) -> Expr:
        branches = schema_list(schema[keyword], keyword, path)
        only(assertions, {keyword}, keyword, path)
        if keyword == "oneOf":
            for i, a in enumerate(branches):
                for j in range(i + 1, len(branches)):
                    if not exclusive(self._root, a, branches[j]):
                        raise schema_error(
                            path, "oneOf",
                            f"branches {i} and {j} may both match one value, which oneOf forbids;"
                            " use anyOf or make them exclusive (a const discriminator property)",
                        )  # fmt: skip
        return alt(
            *(
                self._rules.named(
                    f"{hint}-{i}", self._visit(b, f"{path}/{keyword}/{i}", f"{hint}-{i}")
                )
                for i, b in enumerate(branches)
            )
        )

    def _constants(self, schema: Mapping[str, Any], path: str) -> Expr:
        candidates: list[Any] | None = None
        if "enum" in schema:
            if not isinstance(schema["enum"], list):
                raise schema_error(path, "enum", "must be an array")
            candidates = list(schema["enum"])
        if "const" in schema:
            const = schema["const"]
            if candidates is None:
                candidates = [const]
            else:
                key = canonical(const, path, "const")
                candidates = [v for v in candidates if canonical(v, path, "enum") == key]
        assert candidates is not None
        types = declared_types(schema, path)
        seen: set[str] = set()
        options: list[Expr] = []
        for value in candidates:
            key = canonical(value, path, "enum")
            if key in seen or (types is not None and not (types_of(value) & types)):
                continue
            seen.add(key)
            options.append(Lit(compact_json(value, path, "enum")))
        return alt(*options)

    # -- typed schemas

    def _typed(self, schema: Mapping[str, Any], path: str, hint: str) -> Expr:
        types = declared_types(schema, path)
        if types is None:
            types = {t for t, kws in TYPE_KEYWORDS.items() if kws & schema.keys()}
            if not types:
                return self._json.value()
        if "number" in types:
            types.discard("integer")
        options: list[Expr] = []
        for name in TYPES:
            if name not in types:
                continue
            if name == "null":
                options.append(Lit("null"))
            elif name == "boolean":
                options.append(alt(Lit("true"), Lit("false")))
            elif name == "string":
                options.append(self._string(schema, path))
            elif name in ("number", "integer"):
                options.append(self._number(schema, path, integer=name == "integer"))
            elif name == "object":
                options.append(self._rules.named(hint, self._object(schema, path, hint)))
            else:
                options.append(self._rules.named(hint, self._array(schema, path, hint)))
        return alt(*options)

    def _string(self, schema: Mapping[str, Any], path: str) -> Expr:
        lo = count(schema, "minLength", path)
        hi = count(schema, "maxLength", path)
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in FORMATS:
                supported = ", ".join(FORMATS)
                raise schema_error(
                    path, "format", f"format {fmt!r} is not supported (supported: {supported})"
                )
            if lo is not None or hi is not None:
                raise schema_error(path, "format", "cannot be combined with minLength/maxLength")
            return seq(Lit('"'), format_rule(self._rules, fmt), Lit('"'))
        if lo is None and hi is None:
            return self._json.string()
        return seq(Lit('"'), rep(self._json.char(), lo or 0, hi), Lit('"'))

    def _number(self, schema: Mapping[str, Any], path: str, *, integer: bool) -> Expr:
        bounds = read_bounds(schema, path)
        if bounds.unbounded:
            return self._json.integer() if integer else self._json.number()
        if integer:
            return integer_range(*bounds.integers(), self._opts.max_digits)
        return decimal_range(bounds)

    # -- objects

    def _object(self, schema: Mapping[str, Any], path: str, hint: str) -> Expr:
        props = schema.get("properties", {})
        if not isinstance(props, Mapping) or not all(isinstance(k, str) for k in props):
            raise schema_error(path, "properties", "must be an object mapping names to schemas")
        required = schema.get("required", [])
        if (
            not isinstance(required, list)
            or not all(isinstance(r, str) for r in required)
            or len(set(required)) != len(required)
        ):
            raise schema_error(path, "required", "must be an array of distinct strings")
        extra_schema = schema.get("additionalProperties", _ABSENT)
        if extra_schema is _ABSENT:
            extra_schema = not (props or required)
        names = list(props) + [r for r in required if r not in props]
        if not names and extra_schema is True:
            return self._json.object()

        ws = self._json.ws()
        members: list[tuple[Expr, bool]] = []
        for name in names:
            sub_hint = f"{hint}-{name}"
            sub_path = f"{path}/properties/{pointer_part(name)}"
            value = self._rules.named(
                sub_hint, self._visit(props.get(name, True), sub_path, sub_hint)
            )
            key = Lit(json.dumps(name, ensure_ascii=False) + ":")
            members.append(
                (self._rules.named(f"{sub_hint}-kv", seq(key, ws, value)), name in required)
            )
        extra = NOTHING
        if extra_schema is not False:
            value = self._visit(extra_schema, f"{path}/additionalProperties", f"{hint}-extra")
            value = self._rules.named(f"{hint}-extra", value)
            extra = seq(self._undeclared_key(names), Lit(":"), ws, value)
            extra = self._rules.named(f"{hint}-extra-kv", extra)

        sep = seq(Lit(","), ws)
        after = rep(seq(sep, extra), 0, None)  # members after something was written
        first = seq(extra, after)  # members when nothing was written yet
        for i in reversed(range(len(members))):
            member, is_required = members[i]
            if not is_required and after != EMPTY and i > 0:
                after = self._rules.named(f"{hint}-after-{names[i]}", after)
            here = seq(member, after)
            first = here if is_required else alt(here, first)
            after = seq(seq(sep, member) if is_required else opt(seq(sep, member)), after)
        return self._json.wrap("{", first, not any(r for _, r in members), "}")

    def _undeclared_key(self, declared: list[str]) -> Expr:
        if not declared:
            return self._json.string()
        # Escape-free keys: an escape could spell a declared name in another form.
        spelled = [n for n in declared if all(unescaped(c) for c in n)]
        free = rep(chars(STRING_EXCLUDED, negated=True), 0, None)

        def trie(words: set[str]) -> Expr:
            heads = sorted({w[0] for w in words if w})
            options: list[Expr] = [] if "" in words else [EMPTY]
            for c in heads:
                options.append(seq(Lit(c), trie({w[1:] for w in words if w[:1] == c})))
            others = chars([*STRING_EXCLUDED, *((ord(c), ord(c)) for c in heads)], negated=True)
            options.append(seq(others, free))
            return alt(*options)

        return seq(Lit('"'), trie(set(spelled)), Lit('"'))

    # -- arrays

    def _array(self, schema: Mapping[str, Any], path: str, hint: str) -> Expr:
        lo = count(schema, "minItems", path) or 0
        hi = count(schema, "maxItems", path)
        if "prefixItems" in schema:
            prefix, prefix_key = schema["prefixItems"], "prefixItems"
            rest, rest_key = schema.get("items", True), "items"
            if "additionalItems" in schema:
                raise schema_error(
                    path, "additionalItems", "cannot be combined with prefixItems; use items"
                )
        elif isinstance(schema.get("items"), list):
            prefix, prefix_key = schema["items"], "items"
            rest, rest_key = schema.get("additionalItems", True), "additionalItems"
        else:
            prefix, prefix_key = [], "prefixItems"
            rest, rest_key = schema.get("items", True), "items"
        if not isinstance(prefix, list):
            raise schema_error(path, prefix_key, "must be an array of schemas")
        if hi is not None and hi < lo:
            return NOTHING
        if not prefix and rest is True and lo == 0 and hi is None:
            return self._json.array()
        slots = [
            self._rules.named(
                f"{hint}-{i}", self._visit(p, f"{path}/{prefix_key}/{i}", f"{hint}-{i}")
            )
            for i, p in enumerate(prefix)
        ]
        item = self._rules.named(
            f"{hint}-item", self._visit(rest, f"{path}/{rest_key}", f"{hint}-item")
        )
        sep = seq(Lit(","), self._json.ws())

        def from_index(i: int) -> Expr:
            # items i.. (each after a separator); may stop here iff i >= minItems
            if hi is not None and i >= hi:
                return EMPTY
            if i < len(slots):
                one = seq(sep, slots[i], from_index(i + 1))
                return one if i < lo else opt(one)
            return rep(seq(sep, item), max(0, lo - i), None if hi is None else hi - i)

        if hi == 0:
            return self._json.wrap("[", NOTHING, True, "]")
        if slots:
            return self._json.wrap("[", seq(slots[0], from_index(1)), lo == 0, "]")
        more = rep(seq(sep, item), max(0, lo - 1), None if hi is None else hi - 1)
        return self._json.wrap("[", seq(item, more), lo == 0, "]")
