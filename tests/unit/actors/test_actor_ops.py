"""Op declarations are validated at construction, naming the field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from llamad.actors.errors import ActorConfigError
from llamad.actors.ops import OpKind, OpSpec
from llamad.actors.wire import Kind

pytestmark = pytest.mark.timeout(30)


class Body(msgspec.Struct, frozen=True):
    n: int


def test_valid_spec_compiles_its_body_decoder() -> None:
    spec = OpSpec("lookup", OpKind.CALL, body=Body, max_blobs=2)
    assert spec.decoder.decode(msgspec.msgpack.encode({"n": 3})) == Body(3)
    assert spec.kind.wire_kind is Kind.CALL


def test_kind_given_as_string_is_normalised() -> None:
    assert OpSpec("s", "stream").kind is OpKind.STREAM  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"name": ""}, "name"),
        ({"name": "9lives"}, "name"),
        ({"name": "has space"}, "name"),
        ({"name": "x" * 64}, "name"),
        ({"kind": "broadcast"}, "kind"),
        ({"max_blobs": -1}, "max_blobs"),
        ({"max_blobs": 2000}, "max_blobs"),
        ({"min_blobs": 2, "max_blobs": 1}, "min_blobs"),
        ({"body": object()}, "body"),
    ],
)
def test_invalid_spec_raises_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"name": "op", "kind": OpKind.CALL, **kwargs}
    with pytest.raises(ActorConfigError) as info:
        OpSpec(**args)
    assert info.value.field == field
    assert isinstance(info.value, ValueError)
