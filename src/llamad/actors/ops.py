"""Operation declarations: each op's name, interaction kind and body schema.

An actor serves a fixed table of ops. Declaring the schema with the op means
the runtime validates every request body before the handler runs, so handler
code only ever sees well-typed input::

    class Lookup(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
        keys: list[Annotated[bytes, msgspec.Meta(min_length=32, max_length=32)]]

    LOOKUP = OpSpec("lookup", OpKind.CALL, body=Lookup)

``body`` is any type msgspec can decode msgpack into (a ``msgspec.Struct``,
``dict[str, int]``, ``None``, ...); the default accepts any map with string
keys. Size limits belong in the schema (``msgspec.Meta(max_length=...)``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

import msgspec

from llamad.actors.errors import ActorConfigError
from llamad.actors.wire import OP_NAME, Kind

__all__ = ["NoArgs", "OpKind", "OpSpec"]


class NoArgs(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The body of an op that takes no arguments (``status``, ``gc``, ...):
    one type for every actor's wire, which each re-exports."""


class OpKind(StrEnum):
    """How a client interacts with an op."""

    CALL = "call"  # one request, one reply (or error)
    CAST = "cast"  # fire-and-forget, no reply
    STREAM = "stream"  # one request, many events, one terminal end (or error)

    @property
    def wire_kind(self) -> Kind:
        return _WIRE_KIND[self]


_WIRE_KIND: Final = {OpKind.CALL: Kind.CALL, OpKind.CAST: Kind.CAST, OpKind.STREAM: Kind.STREAM}


@dataclass(frozen=True, slots=True)
class OpSpec:
    """One op of an actor: name, kind, request body schema and blob count.

    ``min_blobs``/``max_blobs`` bound the binary frames the request may carry;
    a request outside the bounds is refused with ``bad_request``. Invalid
    declarations raise :class:`~llamad.actors.errors.ActorConfigError` naming
    the field.
    """

    name: str
    kind: OpKind
    body: Any = dict[str, Any]
    max_blobs: int = 0
    min_blobs: int = 0
    doc: str = ""
    _decoder: msgspec.msgpack.Decoder[Any] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not OP_NAME.match(self.name):
            raise ActorConfigError(
                "name", f"{self.name!r} is not an op name (a letter, then [A-Za-z0-9_.:-])"
            )
        if not isinstance(self.kind, OpKind):
            try:
                object.__setattr__(self, "kind", OpKind(self.kind))
            except ValueError:
                raise ActorConfigError(
                    "kind", f"{self.kind!r} is not one of call, cast, stream"
                ) from None
        for name in ("min_blobs", "max_blobs"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 1024:
                raise ActorConfigError(name, f"must be an int in 0..1024, got {value!r}")
        if self.min_blobs > self.max_blobs:
            raise ActorConfigError("min_blobs", "must not exceed max_blobs")
        try:
            decoder = msgspec.msgpack.Decoder(self.body)
        except TypeError as exc:
            raise ActorConfigError("body", f"not a msgspec-decodable type: {exc}") from None
        object.__setattr__(self, "_decoder", decoder)

    @property
    def decoder(self) -> msgspec.msgpack.Decoder[Any]:
        """The compiled decoder for this op's request body."""
        return self._decoder
