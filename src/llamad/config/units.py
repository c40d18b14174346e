"""Durations and byte sizes as people write them in a config file.

A duration is a number in the key's own unit (seconds for ``keep_alive`` and
every ``*_s`` key, milliseconds for every ``*_ms`` key) or a string with
units: ``"500ms"``, ``"30s"``, ``"10m"``, ``"1h"``, ``"2d"``, or several
(``"1h30m"``). A size is a number of bytes or a string with a unit: decimal
(``"500MB"``, ``"2GB"``) or binary (``"512MiB"``, ``"2GiB"``); ``"1.5GiB"``
rounds down to whole bytes. Both refuse negative, infinite and malformed
values with a :class:`ValueError` whose message says what was expected.
"""

from __future__ import annotations

import math
import re
from typing import Final

__all__ = ["format_duration", "format_size", "parse_duration", "parse_size"]

_DURATION_UNITS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_DURATION: Final = re.compile(r"(?:\d+(?:\.\d+)?(?:ms|s|m|h|d))+")

_SIZE_UNITS: Final = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE: Final = re.compile(r"(\d+(?:\.\d+)?)\s*([A-Za-z]+)")

DURATION_HINT: Final = 'a duration like "500ms", "30s", "10m", "1h" or "1h30m"'
SIZE_HINT: Final = 'a size like 1048576, "512MiB", "2GiB" or "500MB"'


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def parse_duration(value: object, *, unit_s: float = 1.0) -> float:
    """``value`` in seconds: a number of ``unit_s`` seconds or a string with units."""
    number = _number(value)
    if number is not None:
        seconds = number * unit_s
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        if not _DURATION.fullmatch(text):
            raise ValueError(f"expected {DURATION_HINT}, got {value!r}")
        seconds = sum(float(n) * _DURATION_UNITS[unit] for n, unit in _DURATION_PART.findall(text))
    else:
        raise ValueError(f"expected {DURATION_HINT}, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"expected a duration >= 0, got {value!r}")
    return seconds


def parse_size(value: object) -> int:
    """``value`` in bytes: an integer or a string with a unit."""
    if isinstance(value, bool):
        raise ValueError(f"expected {SIZE_HINT}, got {value!r}")
    if isinstance(value, int):
        size = value
    elif isinstance(value, str):
        match = _SIZE.fullmatch(value.strip())
        factor = _SIZE_UNITS.get(match.group(2).lower()) if match else None
        if match is None or factor is None:
            raise ValueError(f"expected {SIZE_HINT}, got {value!r}")
        number, _, fraction = match.group(1).partition(".")
        # Exact arithmetic: a float would misread "1000TiB"-sized counts.
        size = int(number) * factor + int(fraction or "0") * factor // 10 ** len(fraction)
    else:
        raise ValueError(f"expected {SIZE_HINT}, got {value!r}")
    if size < 0:
        raise ValueError(f"expected a size >= 0, got {value!r}")
    return size


def format_size(n: int) -> str:
    """``n`` bytes as :func:`parse_size` reads it back exactly: the largest binary
    unit that keeps it whole (``"2GiB"``), else the plain count (``"1000B"``)."""
    for name, factor in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= factor and n % factor == 0:
            return f"{n // factor}{name}"
    return f"{n}B"


def format_duration(seconds: float) -> str:
    """``seconds`` as :func:`parse_duration` reads it back (``"1h30m"``, ``"250ms"``)."""
    ms = round(seconds * 1000)
    if ms % 1000:
        return f"{ms}ms"
    out, rest = "", ms // 1000
    for name, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out += f"{rest // size}{name}"
            rest %= size
    return out or "0s"
