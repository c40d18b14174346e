"""What a config key may hold: a :class:`Kind` per key (:mod:`llamad.config.keys`).

A kind parses a raw TOML value or raises :class:`ValueError` with what was
expected; the same kind describes the key's type for the reference and
renders its default for the example, so the documentation cannot drift from
what is accepted.

Choices that belong to another layer's enum (KV types, flash attention) are
read from that enum when first needed, so importing the schema never loads
libllama.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llamad.config.units import DURATION_HINT, SIZE_HINT, format_size, parse_duration, parse_size

__all__ = [
    "AbsPath",
    "Boolean",
    "Duration",
    "Integer",
    "Kind",
    "ManyOf",
    "Number",
    "NumberList",
    "OneOf",
    "PathList",
    "Size",
    "Text",
    "toml_literal",
]


def toml_literal(value: Any) -> str:
    """``value`` as TOML writes it (for messages, the example and the reference)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple | frozenset):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        inner = ", ".join(f"{k} = {toml_literal(v)}" for k, v in value.items())
        return "{" + inner + "}"
    return repr(value)


def _got(value: object) -> str:
    kind = type(value).__name__
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, bool | int | float | str | list | tuple):
        return toml_literal(value)
    return f"a {kind}"  # a TOML date or time


class Kind:
    """How one key's raw value is checked and read."""

    def parse(self, value: object) -> Any:
        raise NotImplementedError

    def type_text(self) -> str:
        """The type as the reference shows it."""
        raise NotImplementedError

    def render(self, value: Any) -> str:
        """A value of this kind as TOML (the default in the example)."""
        return toml_literal(value)

    def expected(self) -> str:
        """What a refusal says was expected (by default the reference's type)."""
        return self.type_text()

    def fail(self, value: object) -> ValueError:
        return ValueError(f"expected {self.expected()}, got {_got(value)}")


def _bounds(ge: float | None, gt: float | None, le: float | None, lt: float | None) -> str:
    parts = []
    if ge is not None:
        parts.append(f">= {ge}")
    if gt is not None:
        parts.append(f"> {gt}")
    if le is not None:
        parts.append(f"<= {le}")
    if lt is not None:
        parts.append(f"< {lt}")
    return " and ".join(parts)


def _in_bounds(
    x: float, ge: float | None, gt: float | None, le: float | None, lt: float | None
) -> bool:
    return (
        (ge is None or x >= ge)
        and (gt is None or x > gt)
        and (le is None or x <= le)
        and (lt is None or x < lt)
    )


@dataclass(frozen=True)
class Integer(Kind):
    ge: int | None = None
    le: int | None = None

    def parse(self, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(value)
        if not _in_bounds(value, self.ge, None, self.le, None):
            raise self.fail(value)
        return value

    def type_text(self) -> str:
        bounds = _bounds(self.ge, None, self.le, None)
        return f"an integer {bounds}" if bounds else "an integer"


@dataclass(frozen=True)
class Number(Kind):
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def parse(self, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(value)
        x = float(value)
        if not math.isfinite(x) or not _in_bounds(x, self.ge, self.gt, self.le, self.lt):
            raise self.fail(value)
        return x

    def type_text(self) -> str:
        bounds = _bounds(self.ge, self.gt, self.le, self.lt)
        return f"a number {bounds}" if bounds else "a finite number"


@dataclass(frozen=True)
class Boolean(Kind):
    def parse(self, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.fail(value)
        return value

    def type_text(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Text(Kind):
    """A non-empty string; ``pattern`` (a full match) and ``hint`` say which."""

    pattern: str | None = None
    hint: str = "a non-empty string"

    def parse(self, value: object) -> str:
        if not isinstance(value, str) or not value or "\0" in value:
            raise self.fail(value)
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise self.fail(value)
        return value

    def type_text(self) -> str:
        return self.hint


Choices = tuple[str, ...] | Callable[[], tuple[str, ...]]


def _choices(choices: Choices) -> tuple[str, ...]:
    return choices() if callable(choices) else choices


@dataclass(frozen=True)
class OneOf(Kind):
    """One of a fixed set of names (``choices`` may be a function, read when first used)."""

    choices: Choices

    def parse(self, value: object) -> str:
        names = _choices(self.choices)
        if not isinstance(value, str) or value not in names:
            raise self.fail(value)
        return value

    def type_text(self) -> str:
        return "one of " + ", ".join(_choices(self.choices))


@dataclass(frozen=True)
class ManyOf(Kind):
    """A non-empty array of distinct names from ``choices``."""

    choices: Choices

    def parse(self, value: object) -> tuple[str, ...]:
        names = _choices(self.choices)
        if (
            not isinstance(value, list)
            or not value
            or any(not isinstance(v, str) or v not in names for v in value)
            or len(set(value)) != len(value)
        ):
            raise self.fail(value)
        return tuple(value)

    def type_text(self) -> str:
        return "a non-empty array of distinct names from " + ", ".join(_choices(self.choices))


@dataclass(frozen=True)
class NumberList(Kind):
    """An array of finite numbers >= 0 (GPU shares)."""

    def parse(self, value: object) -> tuple[float, ...]:
        if not isinstance(value, list) or any(
            isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf
            for v in value
        ):
            raise self.fail(value)
        return tuple(float(v) for v in value)

    def type_text(self) -> str:
        return "an array of numbers >= 0"


def _abs_path(value: object) -> str | None:
    if not isinstance(value, str) or not value or "\0" in value:
        return None
    if any("\ud800" <= c <= "\udfff" for c in value):
        return None
    expanded = os.path.expanduser(value)
    # Not normalised: "link/.." means what the kernel says once the link is
    # resolved (llamad.config.security), not what a string operation says.
    return expanded if os.path.isabs(expanded) else None


@dataclass(frozen=True)
class AbsPath(Kind):
    """An absolute path (``~`` expanded); ``keywords`` are taken as they are."""

    keywords: tuple[str, ...] = ()

    def parse(self, value: object) -> str:
        if isinstance(value, str) and value in self.keywords:
            return value
        path = _abs_path(value)
        if path is None:
            raise self.fail(value)
        return path

    def type_text(self) -> str:
        words = " or ".join(json.dumps(k) for k in self.keywords)
        return f"an absolute path or {words}" if words else "an absolute path"


@dataclass(frozen=True)
class PathList(Kind):
    """An array of absolute paths."""

    def parse(self, value: object) -> tuple[str, ...]:
        if not isinstance(value, list):
            raise self.fail(value)
        paths = [_abs_path(v) for v in value]
        if any(p is None for p in paths):
            raise self.fail(value)
        return tuple(p for p in paths if p is not None)

    def type_text(self) -> str:
        return "an array of absolute paths"


@dataclass(frozen=True)
class Duration(Kind):
    """A duration (:mod:`llamad.config.units`) read as seconds (``unit="s"``, a
    float) or milliseconds (``unit="ms"``, an int). ``never``: ``"never"``
    (and ``0``) read as ``None``. ``positive``: 0 is refused."""

    unit: str = "s"
    never: bool = False
    positive: bool = False

    def parse(self, value: object) -> float | int | None:
        if self.never and value == "never":
            return None
        try:
            seconds = parse_duration(value, unit_s=0.001 if self.unit == "ms" else 1.0)
        except ValueError:
            raise self.fail(value) from None
        if seconds == 0 and self.never:
            return None
        if seconds == 0 and self.positive:
            raise self.fail(value)
        if self.unit == "ms":
            return round(seconds * 1000)
        return seconds

    def type_text(self) -> str:
        text = f"duration ({self.unit})"
        if self.positive:
            text += ", > 0"
        if self.never:
            text += ', or "never"'
        return text

    def expected(self) -> str:
        unit = "milliseconds" if self.unit == "ms" else "seconds"
        text = f"a number of {unit} or {DURATION_HINT}"
        if self.positive:
            text += " (> 0)"
        if self.never:
            text += ', or "never" (also 0)'
        return text

    def render(self, value: Any) -> str:
        if value is None:
            return json.dumps("never")
        return toml_literal(value)


@dataclass(frozen=True)
class Size(Kind):
    """A byte count (:mod:`llamad.config.units`), at least ``ge``."""

    ge: int = 0

    def parse(self, value: object) -> int:
        try:
            size = parse_size(value)
        except ValueError:
            raise self.fail(value) from None
        if size < self.ge:
            raise self.fail(value)
        return size

    def type_text(self) -> str:
        return f"size, >= {format_size(self.ge)}" if self.ge else "size"

    def expected(self) -> str:
        text = f"a number of bytes or {SIZE_HINT}"
        return f"{text} (>= {format_size(self.ge)})" if self.ge else text

    def render(self, value: Any) -> str:
        return json.dumps(format_size(value)) if isinstance(value, int) else toml_literal(value)
