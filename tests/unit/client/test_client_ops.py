"""Request bodies built by the client: the wire's own validation, before sending."""

from __future__ import annotations

import sys
import typing

import msgspec
import pytest

import llamad
from llamad.client import bodies as ops
from llamad.errors import BadRequest
from llamad.front.wire import EVICT_ALL
from llamad.model.adapters import AdapterSet
from llamad.model.requests import RequestParams
from llamad.model.wire import AdapterInfo, InferBody

pytestmark = pytest.mark.timeout(30)


def _infer(prompt: object = "hi", **options: object) -> InferBody:
    return ops.infer_body(
        prompt,  # type: ignore[arg-type]
        messages=None,
        request_id="r-1",
        add_special=True,
        chat=None,
        options=options,
    )


def test_options_split_into_request_parameters_and_chat_options() -> None:
    body = _infer(max_tokens=3, stop=["x", "y"], session_id="s", enable_thinking=False)
    assert body.params.max_tokens == 3
    assert body.params.stop == ("x", "y")
    assert body.params.session_id == "s"
    assert body.chat.enable_thinking is False
    assert body.request_id == "r-1"


def test_one_stop_string_is_one_stop_sequence() -> None:
    assert _infer(stop="END").params.stop == ("END",)


def test_continue_is_accepted_under_both_spellings() -> None:
    assert _infer(session_id="s", continue_=True).params.continue_ is True
    assert _infer(session_id="s", **{"continue": True}).params.continue_ is True


def test_token_prompts_travel_as_a_list_of_ints() -> None:
    assert _infer((1, 2, 3)).prompt == [1, 2, 3]
    with pytest.raises(BadRequest) as info:
        _infer([1, "2"])
    assert info.value.details["field"] == "prompt"


@pytest.mark.parametrize("bad", [True, 2.0, None, "2"])
def test_a_token_prompt_names_the_id_that_is_no_int(bad: object) -> None:
    with pytest.raises(BadRequest) as info:
        _infer([1, 2, bad, 4])
    assert info.value.details["field"] == "prompt"
    assert info.value.message.startswith("prompt[2]: a token id must be an int")


def test_int_subclasses_other_than_bool_are_token_ids() -> None:
    import enum  # noqa: PLC0415

    class Tok(enum.IntEnum):
        A = 7

    assert _infer([1, Tok.A]).prompt == [1, 7]


@pytest.mark.parametrize("prompt", [b"caf\xc3\xa9", bytearray(b"hi"), memoryview(b"hi")])
def test_a_bytes_prompt_is_refused_not_read_as_token_ids(prompt: object) -> None:
    # b"hi" is a sequence of ints (104, 105): it used to go out as two token ids.
    with pytest.raises(BadRequest) as info:
        _infer(prompt)
    assert info.value.details["field"] == "prompt"
    assert "decode them to a str" in info.value.message


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"max_tokens": 1 << 40}, "max_tokens"),
        ({"temperature": "hot"}, "params.temperature"),
        ({"parent_key": b"short"}, "parent_key"),
        ({"expect_committed": 3}, "expect_committed"),
    ],
)
def test_a_bad_option_is_refused_naming_its_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(BadRequest) as info:
        _infer(**options)
    assert info.value.details["field"] == field


def test_an_unknown_option_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="bogus"):
        _infer(bogus=1)


def test_prompt_and_messages_are_exclusive() -> None:
    with pytest.raises(BadRequest):
        _infer(None)


def test_bodies_encode_as_the_worker_decodes_them() -> None:
    body = _infer("hello", max_tokens=2, parent_key=bytes(32), temperature=0.0)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(body), type=InferBody) == body
    assert isinstance(body.params, RequestParams)


def test_model_ids_follow_the_front_contract() -> None:
    assert ops.model_ref("smol-2.q4").model_id == "smol-2.q4"
    with pytest.raises(BadRequest):
        ops.model_ref("bad id")
    with pytest.raises(BadRequest):
        ops.model_ref("x" * 59)


def test_request_ids_are_unique() -> None:
    assert len({ops.new_request_id() for _ in range(1000)}) == 1000


def test_adapter_info_is_the_workers_own_class() -> None:
    # One definition, in the worker's wire module: the class the worker's
    # AdapterSet answers with is the one a client decodes into.
    for method in (AdapterSet.load, AdapterSet.set_scale):
        assert typing.get_type_hints(method)["return"] is AdapterInfo
    assert typing.get_type_hints(AdapterSet.list_adapters)["return"] == list[AdapterInfo]
    assert ops.AdapterInfo is AdapterInfo
    assert llamad.AdapterInfo is AdapterInfo


@pytest.mark.parametrize("n", [2**62 + 1, sys.maxsize, 2**64, 10**40])
def test_evict_bytes_takes_any_count_clamped_to_everything(n: int) -> None:
    assert ops.evict_body(n, None).n == EVICT_ALL
    assert ops.evict_body(12345, ["ram"]).n == 12345


@pytest.mark.parametrize("n", [-1, True, 1.5, "1GiB", None])
def test_evict_bytes_refuses_what_is_not_a_count(n: object) -> None:
    with pytest.raises(BadRequest) as exc:
        ops.evict_body(n, None)  # type: ignore[arg-type]
    assert exc.value.details["field"] == "n"
