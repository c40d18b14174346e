"""A JSON request body as a msgspec Struct, a bad one a ``BadRequest`` naming the field."""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

import msgspec

from llamad.errors import BadRequest

__all__ = ["convert_body", "decode_body"]

T = TypeVar("T")

_AT: Final = re.compile(r" - at `\$\.?(.*)`$")
_MISSING: Final = re.compile(r"missing required field `([^`]*)`")


def decode_body(body: bytes, typ: type[T]) -> T:
    """``body`` (JSON; empty is ``{}``) as ``typ``. ``details["field"]`` is
    where msgspec found the fault (``messages[0].role``), the missing field
    itself when one is missing, ``""`` for a body that is not JSON."""
    try:
        return msgspec.json.decode(body or b"{}", type=typ)
    except msgspec.ValidationError as exc:
        raise _refusal(exc) from None
    except msgspec.DecodeError as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}", details={"field": ""}) from None


def convert_body(body: Any, typ: type[T]) -> T:
    """``body`` (decoded JSON, as the gateway's ``Gate.json_body`` reads it) as
    ``typ``, a fault named as :func:`decode_body` names it."""
    try:
        return msgspec.convert(body, typ)
    except msgspec.ValidationError as exc:
        raise _refusal(exc) from None


def _refusal(exc: msgspec.ValidationError) -> BadRequest:
    message = str(exc)
    at = _AT.search(message)
    where = at.group(1) if at else ""
    missing = _MISSING.search(message)
    if missing:
        where = f"{where}.{missing.group(1)}" if where else missing.group(1)
    return BadRequest(message, details={"field": where})
