"""The worker's op schemas refuse malformed requests before any handler runs."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from llamad.actors.wire import decode_body
from llamad.errors import BadRequest
from llamad.model.wire import OPS, InferBody

pytestmark = pytest.mark.timeout(60)


def decode(op: str, body: Any) -> Any:
    return decode_body(msgspec.Raw(msgspec.msgpack.encode(body)), OPS[op].decoder)


def test_prompt_may_be_text_tokens_or_messages() -> None:
    assert decode("infer", {"prompt": "hi"}).prompt == "hi"
    assert decode("infer", {"prompt": [1, 2, 3]}).prompt == [1, 2, 3]
    body = decode("complete", {"messages": [{"role": "user", "content": "hi"}]})
    assert isinstance(body, InferBody) and body.prompt is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "prompt"),
        ({"prompt": "x", "messages": [{"role": "user", "content": "x"}]}, "prompt"),
        ({"prompt": "x", "params": {"max_tokens": 0}}, "max_tokens"),
        ({"prompt": "x", "params": {"max_tokens": 10**12}}, "max_tokens"),
        ({"prompt": "x", "params": {"temperature": -1}}, "temperature"),
        ({"prompt": "x", "params": {"continue": True}}, "continue"),
    ],
)
def test_invalid_request_is_refused_naming_the_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(BadRequest) as exc:
        decode("infer", body)
    assert exc.value.details.get("field") == field


@pytest.mark.parametrize(
    ("op", "body"),
    [
        ("infer", {"prompt": "x", "surprise": 1}),
        ("infer", {"prompt": ["not", "ids"]}),
        ("infer", {"prompt": 5}),
        ("infer", {"messages": []}),
        ("cancel", {}),
        ("end_session", {"session_id": ""}),
        ("fork_session", {"source_id": "a"}),
        ("embed", {"inputs": []}),
        ("tokenize", {"text": 3}),
    ],
)
def test_malformed_body_is_a_bad_request(op: str, body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        decode(op, body)


def test_every_op_but_infer_is_a_call() -> None:
    assert str(OPS["infer"].kind) == "stream"
    assert {str(s.kind) for n, s in OPS.items() if n != "infer"} == {"call"}
