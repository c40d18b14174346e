"""Raw TOML tables into schema structs, one problem per bad key, never stopping early.

:func:`read_table` walks a table against a struct's declared keys
(:func:`llamad.config.kinds.fields_of`): an unknown key is refused by name
(with the nearest known key when there is one, so a typo never passes
silently), a value its kind refuses is reported with what was expected, a
missing required key is reported, and a nested table is read the same way.
A refused value is left at its default so the walk can go on and find the
next problem; the caller raises when anything was found.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, TypeVar

import msgspec

from llamad.config.keys import FieldInfo, Key, Section, Tables, fields_of
from llamad.config.kinds import toml_literal
from llamad.config.problems import KeyPath, Problems

__all__ = ["read_table"]

S = TypeVar("S", bound=msgspec.Struct)

_MAX_LISTED = 12


def _unknown(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    if close:
        return f"unknown key (did you mean {close[0]!r}?)"
    if len(known) <= _MAX_LISTED:
        return f"unknown key (known: {', '.join(known)})"
    return "unknown key (`llamad config example` lists every key)"


def _not_a_table(value: object) -> str:
    return f"expected a table, got {toml_literal(value)}"


def read_table(cls: type[S], raw: Mapping[str, Any], path: KeyPath, problems: Problems) -> S:
    """``raw`` as a ``cls``; every problem found is added to ``problems``."""
    fields = {f.name: f for f in fields_of(cls)}
    values: dict[str, Any] = {}
    for name, value in raw.items():
        where = (*path, name)
        info = fields.get(name)
        if info is None:
            problems.add(where, _unknown(name, list(fields)))
            continue
        read = _read_field(info, value, where, problems)
        if read is not _REFUSED:
            values[name] = read
    for info in fields.values():
        if isinstance(info.marker, Key) and info.marker.required and info.name not in raw:
            problems.add((*path, info.name), "missing (this key is required)")
    return cls(**values)


_REFUSED: Any = object()


def _read_field(info: FieldInfo, value: object, where: KeyPath, problems: Problems) -> Any:
    marker = info.marker
    if isinstance(marker, Key):
        try:
            return marker.kind.parse(value)
        except ValueError as exc:
            problems.add(where, str(exc))
            return _REFUSED
    assert info.struct is not None
    if not isinstance(value, dict):
        problems.add(where, _not_a_table(value))
        return _REFUSED
    if isinstance(marker, Section):
        return read_table(info.struct, value, where, problems)
    assert isinstance(marker, Tables)
    tables: dict[str, Any] = {}
    for name, table in value.items():
        if not isinstance(table, dict):
            problems.add((*where, name), _not_a_table(table))
            continue
        tables[name] = read_table(info.struct, table, (*where, name), problems)
    return tables
