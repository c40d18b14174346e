"""The JSON Schema vocabulary the converter knows, and readers for keyword values.

Every reader raises :class:`~llamad.errors.SchemaError` naming the keyword and
the JSON pointer of the schema that holds it.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any, Final

from llamad.errors import SchemaError

_MAX_MIN_COUNT: Final = 1 << 16  # a larger minLength / minItems cannot be generated anyway
_UNBOUNDED_ABOVE: Final = 1 << 20  # a larger maxLength / maxItems is treated as no bound

ANNOTATIONS: Final = frozenset(
    {
        "title", "description", "default", "examples", "$comment", "deprecated",
        "readOnly", "writeOnly", "contentEncoding", "contentMediaType", "contentSchema",
        "discriminator", "$anchor", "$dynamicAnchor", "$defs", "definitions",
        "$schema", "$id", "$vocabulary",
    }
)  # fmt: skip
UNSUPPORTED: Final = {
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
TYPE_KEYWORDS: Final = {
    "string": frozenset({"minLength", "maxLength", "format"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}),
    "object": frozenset({"properties", "required", "additionalProperties"}),
    "array": frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems"}),
}
"""Keywords that each imply a type when a schema has no ``type``."""
APPLICATORS: Final = frozenset({"type", "enum", "const", "$ref", "anyOf", "oneOf", "allOf"})
KNOWN: Final = APPLICATORS.union(*TYPE_KEYWORDS.values())
TYPES: Final = ("null", "boolean", "object", "array", "string", "number", "integer")
"""Type names, in the order a type list's alternatives are written."""


def schema_error(path: str, keyword: str | None, reason: str) -> SchemaError:
    """A :class:`SchemaError` for ``keyword`` (or the whole schema) at ``path``."""
    where = path or "/"
    head = f"{keyword} at {where}" if keyword else f"schema at {where}"
    return SchemaError(f"{head}: {reason}", details={"path": where, "keyword": keyword})


def pointer_part(name: str) -> str:
    """``name`` escaped as one JSON pointer segment."""
    return name.replace("~", "~0").replace("/", "~1")


def check_keywords(schema: Mapping[str, Any], path: str, *, is_root: bool) -> set[str]:
    """The assertion keywords of ``schema``; raises on unknown or unsupported ones."""
    assertions: set[str] = set()
    for key, value in schema.items():
        if not isinstance(key, str):
            raise schema_error(path, str(key), "schema keywords must be strings")
        if key.startswith("x-") or key in ANNOTATIONS:
            if key == "$id" and not is_root:
                raise schema_error(path, key, "$id below the root is not supported")
            continue
        if key in UNSUPPORTED and not (key == "uniqueItems" and value is False):
            raise schema_error(path, key, UNSUPPORTED[key])
        if key not in KNOWN and key != "uniqueItems":
            raise schema_error(path, key, "unknown keyword")
        assertions.add(key)
    assertions.discard("uniqueItems")
    return assertions


def only(assertions: set[str], allowed: set[str], owner: str, path: str) -> None:
    """Refuse assertions besides ``allowed`` next to ``owner``."""
    extra = sorted(assertions - allowed)
    if extra:
        raise schema_error(path, extra[0], f"cannot be combined with {owner} here")


def schema_list(value: Any, keyword: str, path: str) -> list[Any]:
    """The value of ``keyword`` as a non-empty list of schemas."""
    if not isinstance(value, list) or not value:
        raise schema_error(path, keyword, "must be a non-empty array of schemas")
    return value


def declared_types(schema: Mapping[str, Any], path: str) -> set[str] | None:
    """The names in ``type``, or ``None`` when the schema has no ``type``."""
    if "type" not in schema:
        return None
    raw = schema["type"]
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not names or len(set(map(str, names))) != len(names):
        raise schema_error(
            path, "type", "must be a type name or a non-empty array of distinct names"
        )
    for name in names:
        if name not in TYPES:
            raise schema_error(path, "type", f"unknown type {name!r}")
    return set(names)


def count(schema: Mapping[str, Any], keyword: str, path: str) -> int | None:
    """A ``min*``/``max*`` count; ``None`` when absent or too large to bite."""
    value = schema.get(keyword)
    if value is None and keyword not in schema:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise schema_error(path, keyword, "must be a non-negative integer")
    if keyword.startswith("min") and value > _MAX_MIN_COUNT:
        raise schema_error(path, keyword, f"more than {_MAX_MIN_COUNT} cannot be generated")
    if keyword.startswith("max") and value > _UNBOUNDED_ABOVE:
        # No context window holds that much output: the bound cannot bite.
        return None
    return value


def resolve_ref(root: Any, ref: Any, path: str) -> tuple[str, Any]:
    """The canonical key (``#`` and a decoded pointer) and target of a local ``$ref``."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise schema_error(
            path, "$ref", f"only local references ('#/...') are supported, not {ref!r}"
        )
    pointer = urllib.parse.unquote(ref[1:])
    if pointer and not pointer.startswith("/"):
        raise schema_error(path, "$ref", f"anchors are not supported: {ref!r}")
    node = root
    for raw in pointer.split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise schema_error(path, "$ref", f"{ref!r} does not resolve")
    return "#" + pointer, node
