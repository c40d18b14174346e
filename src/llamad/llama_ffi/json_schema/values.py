"""JSON instance values as JSON Schema compares and writes them."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from llamad.llama_ffi.json_schema.keywords import schema_error


def types_of(value: Any) -> set[str]:
    """The type names ``value`` satisfies (an integral float is an integer)."""
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


def canonical(value: Any, path: str, keyword: str) -> str:
    """A key equal for values JSON Schema calls equal (1 == 1.0, true != 1)."""
    return json.dumps(_normal(value, path, keyword), sort_keys=True, ensure_ascii=False)


def compact_json(value: Any, path: str, keyword: str) -> str:
    """``value`` as compact JSON; integral floats as integers (equal in JSON Schema,
    and an integer under every draft's ``integer`` type)."""
    return json.dumps(_normal(value, path, keyword), ensure_ascii=False, separators=(",", ":"))


def _normal(value: Any, path: str, keyword: str) -> Any:
    """``value`` with integral floats as ints; raises if it is not a JSON value."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise schema_error(path, keyword, "values must be finite JSON numbers")
        return int(value) if isinstance(value, float) and value.is_integer() else value
    if isinstance(value, list):
        return [_normal(x, path, keyword) for x in value]
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: _normal(x, path, keyword) for k, x in value.items()}
    raise schema_error(path, keyword, f"{type(value).__name__} is not a JSON value")
