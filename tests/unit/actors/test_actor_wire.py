"""The envelope codec: round trips, and every malformed shape refused with its code."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.actors.errors import ActorConfigError
from llamad.actors.wire import (
    CLIENT_KINDS,
    MAX_CID,
    PROTOCOL_VERSION,
    SERVER_KINDS,
    Hello,
    Kind,
    Limits,
    Rejected,
    decode_body,
    decode_envelope,
    encode_envelope,
    error_body,
    oversized_blob,
)
from llamad.errors import BadRequest, LlamadError, StickyBusy, from_wire

pytestmark = pytest.mark.timeout(60)

ALL_KINDS = frozenset(Kind)
LIMIT = 1 << 20
ANY = msgspec.msgpack.Decoder()
pack = msgspec.msgpack.encode

msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)
op_names = st.from_regex(r"\A[A-Za-z][A-Za-z0-9_.:-]{0,20}\Z")


def rejected(header: bytes, accept: frozenset[Kind] = ALL_KINDS) -> Rejected:
    with pytest.raises(Rejected) as info:
        decode_envelope(header, LIMIT, accept)
    return info.value


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(list(Kind)),
    cid=st.integers(min_value=0, max_value=MAX_CID),
    op=op_names | st.just(""),
    body=msgpack_values,
)
def test_envelope_round_trips(kind: Kind, cid: int, op: str, body: Any) -> None:
    env = decode_envelope(encode_envelope(kind, cid, op, body), LIMIT, ALL_KINDS)
    assert (env.version, env.kind, env.cid, env.op) == (PROTOCOL_VERSION, kind, cid, op)
    assert ANY.decode(env.body) == body


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_escape_as_anything_but_rejected(data: bytes) -> None:
    try:
        env = decode_envelope(data, LIMIT, ALL_KINDS)
    except Rejected as rej:
        assert rej.error.code in {"bad_request", "version_mismatch", "too_large"}
        assert 0 <= rej.cid <= MAX_CID
    else:
        assert env.version == PROTOCOL_VERSION


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ({"version": 1}, "a map instead of an array"),
        ([1, 1, 5, "op"], "four elements"),
        ([1, 1, 5, "op", None, None], "six elements"),
        ([1, "call", 5, "op", None], "kind is a string"),
        ([1, 1, "5", "op", None], "cid is a string"),
        ([1, 1, -5, "op", None], "negative cid"),
        ([1, 1, 5.0, "op", None], "float cid"),
        ([1, 1, 5, 7, None], "op is an int"),
        ([1, 1, 5, "x" * 65, None], "op too long"),
        ([1, 1, 5, b"op", None], "op is bytes"),
        ("hello", "a string"),
        (None, "nil"),
    ],
)
def test_malformed_envelope_shape_is_bad_request(value: Any, why: str) -> None:
    rej = rejected(pack(value))
    assert isinstance(rej.error, BadRequest), why


def test_malformed_envelope_keeps_a_readable_cid_for_the_error_reply() -> None:
    assert rejected(pack([1, 1, 77, 7, None])).cid == 77
    assert rejected(pack([1, 1, 300, "op"])).cid == 300


def test_cid_beyond_u63_is_bad_request() -> None:
    rej = rejected(pack([1, 1, MAX_CID + 1, "op", None]))
    assert isinstance(rej.error, BadRequest)
    assert rej.cid == 0


def test_truncated_msgpack_is_bad_request() -> None:
    full = encode_envelope(Kind.CALL, 9, "op", {"a": [1, 2, 3]})
    for cut in range(len(full)):
        assert isinstance(rejected(full[:cut]).error, BadRequest)


def test_huge_declared_lengths_are_refused_without_allocating() -> None:
    for header in (
        b"\xdd\xff\xff\xff\xff",  # array32 of 4 G elements
        b"\x95\x01\x01\x05\xa2op\xdf\xff\xff\xff\xff",  # body: map32 of 4 G pairs
        b"\x95\x01\x01\x05\xa2op\xc6\xff\xff\xff\xff",  # body: bin32 of 4 GiB
        b"\x95\x01\x01\x05\xdb\xff\xff\xff\xffop",  # op: str32 of 4 GiB
    ):
        assert isinstance(rejected(header).error, BadRequest)


def test_deep_nesting_is_bad_request_not_a_crash() -> None:
    header = b"\x95\x01\x01\x05\xa2op" + b"\x91" * 200_000 + b"\xc0"
    assert isinstance(rejected(header).error, BadRequest)


def test_invalid_utf8_in_the_op_is_bad_request() -> None:
    header = b"\x95\x01\x01\x05\xa2\x96\xff\xc0"
    assert isinstance(rejected(header).error, BadRequest)


def test_invalid_utf8_in_the_body_is_bad_request() -> None:
    header = b"\x95\x01\x01\x05\xa2op\x81\xa1\xfe\x01"
    env = decode_envelope(header, LIMIT, ALL_KINDS)
    with pytest.raises(BadRequest):
        decode_body(env.body, msgspec.msgpack.Decoder(dict[str, Any]))


def test_other_protocol_version_is_version_mismatch() -> None:
    rej = rejected(pack([PROTOCOL_VERSION + 1, 1, 12, "op", None]))
    assert rej.error.code == "version_mismatch"
    assert rej.error.details == {"expected": PROTOCOL_VERSION, "got": PROTOCOL_VERSION + 1}
    assert rej.cid == 12


def test_other_version_with_another_envelope_shape_is_still_version_mismatch() -> None:
    rej = rejected(pack([PROTOCOL_VERSION + 1, {"kind": "call"}]))
    assert rej.error.code == "version_mismatch"


def test_oversized_header_is_too_large_with_salvaged_cid() -> None:
    header = encode_envelope(Kind.CALL, 4242, "op", {"pad": "x" * 5000})
    with pytest.raises(Rejected) as info:
        decode_envelope(header, 1000, ALL_KINDS)
    assert info.value.error.code == "too_large"
    assert info.value.cid == 4242
    assert info.value.kind == Kind.CALL


@pytest.mark.parametrize("kind", sorted(SERVER_KINDS))
def test_response_kinds_are_refused_by_a_server(kind: Kind) -> None:
    rej = rejected(encode_envelope(kind, 3, "", None), CLIENT_KINDS)
    assert isinstance(rej.error, BadRequest)
    assert rej.cid == 3


def test_unknown_kind_number_is_bad_request() -> None:
    assert isinstance(rejected(pack([1, 99, 3, "op", None])).error, BadRequest)


def test_body_schema_violation_is_bad_request_naming_the_path() -> None:
    env = decode_envelope(encode_envelope(Kind.HELLO, 1, "", {"pid": "x"}), LIMIT, ALL_KINDS)
    with pytest.raises(BadRequest, match=r"pid"):
        decode_body(env.body, msgspec.msgpack.Decoder(Hello))


def test_error_body_round_trips_to_the_same_class() -> None:
    err = StickyBusy("busy", details={"session": "s"})
    back = from_wire(ANY.decode(pack(error_body(err))))
    assert type(back) is StickyBusy
    assert (back.message, back.details) == ("busy", {"session": "s"})


def test_error_body_degrades_unencodable_details_to_strings() -> None:
    err = LlamadError("x", details={"obj": object()})
    payload = ANY.decode(pack(error_body(err)))
    assert payload["code"] == "internal"
    assert payload["details"]["obj"].startswith("<object object")


def test_oversized_blob_finds_the_first_big_frame() -> None:
    assert oversized_blob([b"a", b"bb"], 2) is None
    assert oversized_blob([b"a", b"bbb", b"cccc"], 2) == 1
    assert oversized_blob([memoryview(bytearray(10))], 9) == 0


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"max_frame_bytes": 0}, "max_frame_bytes"),
        ({"max_frame_bytes": 2**31}, "max_frame_bytes"),
        ({"max_header_bytes": -1}, "max_header_bytes"),
        ({"max_header_bytes": 10, "max_frame_bytes": 5}, "max_header_bytes"),
        ({"max_blobs": -1}, "max_blobs"),
        ({"max_blobs": True}, "max_blobs"),
        ({"sndhwm": 0}, "sndhwm"),
        ({"rcvhwm": "1"}, "rcvhwm"),
        ({"linger_s": -1}, "linger_s"),
    ],
)
def test_invalid_limits_raise_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ActorConfigError) as info:
        Limits(**kwargs)
    assert info.value.field == field


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": "caf\udce9 \udcff"},  # bytes that are not UTF-8, as argv and pipes give them
        {"messages": [{"role": "user", "content": "\ud800"}]},
        ["ok", {"nested": ("x", "\udfff")}],
    ],
)
def test_text_that_is_not_unicode_is_refused_typed(body: object) -> None:
    with pytest.raises(BadRequest) as info:
        encode_envelope(Kind.CALL, 7, "infer", body)
    assert info.value.code == "bad_request"
    assert "not valid Unicode" in info.value.message
    assert info.value.details["op"] == "infer"


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"n": 2**64}, "can't serialize ints"),
        ([-(2**63) - 1], "can't serialize ints"),
        ({"x": object()}, "unsupported"),
        ({"text": "caf\udce9"}, "not valid Unicode"),
    ],
)
def test_a_body_msgpack_cannot_carry_is_a_bad_request_naming_the_op(body: Any, said: str) -> None:
    with pytest.raises(BadRequest, match=said) as refused:
        encode_envelope(Kind.CALL, 1, "tokenize", body)
    assert refused.value.message.startswith("tokenize: ")
    assert refused.value.details["op"] == "tokenize"
