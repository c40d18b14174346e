"""Whether two ``oneOf`` branches provably exclude each other.

``oneOf`` fails on an instance that matches two branches, and a grammar
cannot count matches; the converter therefore accepts ``oneOf`` only when no
instance can match two branches: different JSON types, disjoint constant
sets, or objects told apart by a required discriminator property or by a
closed property set. Anything this cannot prove counts as overlapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from llamad.llama_ffi.json_schema.keywords import resolve_ref
from llamad.llama_ffi.json_schema.values import canonical, types_of

_MAX_DEPTH: Final = 32  # $ref chains and nested applicators followed before giving up
_EVERY_KIND: Final = frozenset({"null", "boolean", "object", "array", "string", "number"})


def exclusive(root: Any, a: Any, b: Any) -> bool:
    """Whether no value is valid under both ``a`` and ``b`` (``$ref`` resolved in ``root``)."""
    ca, cb = _constant_set(root, a), _constant_set(root, b)
    if ca is not None and cb is not None:
        return not ca & cb
    common = _kinds(root, a) & _kinds(root, b)
    if not common:
        return True
    return common == {"object"} and (
        _objects_exclusive(root, a, b) or _objects_exclusive(root, b, a)
    )


def _deref(root: Any, schema: Any) -> Any:
    depth = 0
    while isinstance(schema, Mapping) and "$ref" in schema and depth < _MAX_DEPTH:
        schema = resolve_ref(root, schema["$ref"], "")[1]
        depth += 1
    return schema


def _constant_set(root: Any, schema: Any) -> set[str] | None:
    schema = _deref(root, schema)
    if not isinstance(schema, Mapping):
        return None
    if "const" in schema:
        return {canonical(schema["const"], "", "const")}
    if "enum" in schema and isinstance(schema["enum"], list):
        return {canonical(v, "", "enum") for v in schema["enum"]}
    return None


def _kinds(root: Any, schema: Any, depth: int = 0) -> set[str]:
    """JSON types a value valid under ``schema`` may have (integer counts as number)."""
    schema = _deref(root, schema)
    if schema is False:
        return set()
    if not isinstance(schema, Mapping) or depth > _MAX_DEPTH:
        return set(_EVERY_KIND)
    kinds = set(_EVERY_KIND)
    if "type" in schema:
        raw = schema["type"]
        names = {raw} if isinstance(raw, str) else set(raw) if isinstance(raw, list) else kinds
        kinds = {"number" if n == "integer" else str(n) for n in names}
    constants = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(constants, list):
        kinds = kinds & {"number" if t == "integer" else t for v in constants for t in types_of(v)}
    for keyword in ("anyOf", "oneOf", "allOf"):
        branches = schema.get(keyword)
        if isinstance(branches, list) and branches:
            parts = [_kinds(root, b, depth + 1) for b in branches]
            first, *rest = parts
            kinds &= first.intersection(*rest) if keyword == "allOf" else first.union(*rest)
    return kinds


def _objects_exclusive(root: Any, a: Any, b: Any) -> bool:
    """Whether a required property of ``a`` rules out every object valid under ``b``."""
    a, b = _deref(root, a), _deref(root, b)
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
            ca, cb = _constant_set(root, a_props[key]), _constant_set(root, b_props[key])
            if ca is not None and cb is not None and not ca & cb:
                return True
        closed = b.get("additionalProperties") is False and "patternProperties" not in b
        if closed and key not in b_props:
            return True
    return False
