"""Prometheus's text exposition format, version 0.0.4: families in, text out.

Our own few lines rather than prometheus_client's registry: the numbers
already exist (gathered by the daemon, :class:`~llamad.front.wire.MetricsSnapshot`),
so all that is left is writing them, and a registry would only be a second
copy of them with a process-global state. The output is what
``prometheus_client.generate_latest`` writes for the same families (a
counter's ``# TYPE`` line names it with its ``_total``; floats as Go prints
them, ``+Inf`` for the last bucket), and the tests parse it back with
``prometheus_client.parser``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

__all__ = [
    "CONTENT_TYPE",
    "Family",
    "Sample",
    "format_value",
    "histogram_samples",
    "render",
]

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"
"""The ``Content-Type`` of :func:`render`'s text over HTTP."""

MetricType = Literal["counter", "gauge", "histogram"]

_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_SUFFIXES: Final[dict[str, tuple[str, ...]]] = {
    "counter": ("",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One line: the family's name plus ``suffix`` (a histogram's ``_bucket``,
    ``_sum``, ``_count``), its labels in order, its value."""

    labels: Labels
    value: float
    suffix: str = ""


@dataclass(frozen=True, slots=True)
class Family:
    """One metric: ``name`` as its ``# TYPE`` line names it (a counter's ends in
    ``_total``), its type, its help text and its samples."""

    name: str
    type: MetricType
    help: str
    samples: list[Sample] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not a metric name")
        if self.type == "counter" and not self.name.endswith("_total"):
            raise ValueError(f"counter {self.name!r} must end in _total")
        allowed = _SUFFIXES[self.type]
        for s in self.samples:
            if s.suffix not in allowed:
                raise ValueError(f"{self.type} {self.name!r} has no {s.suffix!r} samples")
            for label, _ in s.labels:
                if not _LABEL.match(label) or label.startswith("__"):
                    raise ValueError(f"{label!r} is not a label name")


def labels_of(labels: Mapping[str, str] | Labels) -> Labels:
    return tuple(labels.items()) if isinstance(labels, Mapping) else labels


def histogram_samples(
    labels: Mapping[str, str] | Labels,
    bounds: Sequence[float],
    counts: Sequence[int],
    total: float,
) -> list[Sample]:
    """A histogram's lines from counts per bucket (``counts[i]``: above
    ``bounds[i-1]``, at most ``bounds[i]``; one more for above every bound):
    cumulative ``_bucket`` lines with ``le`` (the last ``+Inf``), ``_sum``,
    ``_count``."""
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} counts for {len(bounds)} bounds")
    base = labels_of(labels)
    out = []
    running = 0
    for bound, n in zip((*bounds, math.inf), counts, strict=True):
        running += n
        out.append(Sample((*base, ("le", format_value(float(bound)))), running, "_bucket"))
    out.append(Sample(base, total, "_sum"))
    out.append(Sample(base, running, "_count"))
    return out


def format_value(value: float) -> str:
    """A sample value as Prometheus's Go client (and prometheus_client) prints it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(float(value))
    dot = text.find(".")
    if value > 0 and dot > 6:
        # Go writes large floats with an exponent (1e+06); le values must match.
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return text


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(value: str) -> str:
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def _line(name: str, sample: Sample) -> str:
    if sample.labels:
        inner = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sample.labels)
        return f"{name}{sample.suffix}{{{inner}}} {format_value(sample.value)}\n"
    return f"{name}{sample.suffix} {format_value(sample.value)}\n"


def render(families: Iterable[Family]) -> str:
    """The exposition text of ``families``, in order (each name once)."""
    seen: set[str] = set()
    parts: list[str] = []
    for family in families:
        if family.name in seen:
            raise ValueError(f"metric {family.name!r} twice")
        seen.add(family.name)
        parts.append(f"# HELP {family.name} {_escape_help(family.help)}\n")
        parts.append(f"# TYPE {family.name} {family.type}\n")
        # A counter's samples carry the name with its _total, like its TYPE line.
        parts.extend(_line(family.name, s) for s in family.samples)
    return "".join(parts)
