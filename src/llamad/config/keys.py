"""The keys of the schema: each struct field says what it is, beside its meaning.

Each schema field is ``Annotated[T, Key(doc, kind)]`` (a value; ``kind``
from :mod:`llamad.config.kinds`), ``Annotated[S, Section(doc)]`` (a nested
table of struct ``S``) or ``Annotated[dict[str, S], Tables(doc)]`` (a table
of tables keyed by a name, like ``[models.<id>]``). :func:`fields_of` lists
them for the reader, the reference and the example.
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from llamad.config.kinds import Kind

__all__ = ["FieldInfo", "Key", "Section", "Tables", "fields_of"]


@dataclass(frozen=True)
class Key:
    """A key holding a value: its meaning, its kind, and how the reference
    shows a default the schema cannot hold (``default_text``, for a default
    computed where the daemon runs; ``example`` is then the value the example
    shows). ``required``: the table must have it."""

    doc: str
    kind: Kind
    default_text: str | None = None
    example: Any = None
    required: bool = False


@dataclass(frozen=True)
class Section:
    """A nested table. ``optional``: absent unless written (its struct's
    required keys then apply); otherwise always present with its defaults."""

    doc: str
    optional: bool = False


@dataclass(frozen=True)
class Tables:
    """A table of tables, one per name (``[models.<id>]``). ``example_name``:
    the name the example config shows (default: the default model's id);
    ``optional``: the example shows the table commented out."""

    doc: str
    name_hint: str = "<id>"
    example_name: str | None = None
    optional: bool = False


Marker = Key | Section | Tables


@dataclass(frozen=True)
class FieldInfo:
    """One schema field: its name, its marker, the struct a section holds,
    and its default (``msgspec.NODEFAULT`` when it has none)."""

    name: str
    marker: Marker
    struct: type[msgspec.Struct] | None = None
    default: Any = msgspec.NODEFAULT
    default_factory: Any = field(default=msgspec.NODEFAULT, repr=False)

    def default_value(self) -> Any:
        if self.default_factory is not msgspec.NODEFAULT:
            return self.default_factory()
        return self.default

    @property
    def key(self) -> Key:
        assert isinstance(self.marker, Key), self.name
        return self.marker


def _struct_in(tp: Any) -> type[msgspec.Struct] | None:
    for arg in (tp, *typing.get_args(tp)):
        if isinstance(arg, type) and issubclass(arg, msgspec.Struct):
            return arg
    return None


@functools.cache
def fields_of(cls: type[msgspec.Struct]) -> Sequence[FieldInfo]:
    """The keys of a schema struct, in declaration order (fields without a
    marker are not keys: a struct may carry where it came from)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    out: list[FieldInfo] = []
    for f in msgspec.structs.fields(cls):
        hint = hints[f.name]
        if typing.get_origin(hint) is not typing.Annotated:
            continue
        base, *meta = typing.get_args(hint)
        marker = next((m for m in meta if isinstance(m, Key | Section | Tables)), None)
        if marker is None:
            continue
        struct: type[msgspec.Struct] | None = None
        if isinstance(marker, Section):
            struct = _struct_in(base)
        elif isinstance(marker, Tables):
            struct = _struct_in(typing.get_args(base)[1])
        if not isinstance(marker, Key) and struct is None:
            raise TypeError(f"{cls.__name__}.{f.name}: a section must hold a Struct")
        out.append(
            FieldInfo(
                f.name,
                marker,
                struct,
                f.default,
                f.default_factory,
            )
        )
    return tuple(out)
