"""The ``.kvc`` file format (SPEC C2): round trip and rejection of damage."""

from __future__ import annotations

import os
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamad.cache.checksum import SPLIT_MIN_BYTES
from llamad.cache.errors import InvalidCacheValue, KvcCorrupt
from llamad.cache.key import FingerprintMode, Namespace, ctx_params_hash, tokens_to_bytes
from llamad.cache.kvc import (
    HEADER_LEN,
    PAYLOAD_ALIGN,
    KvcSpec,
    SaveReason,
    copy_payload_into,
    encode_kvc,
    file_name,
    parse,
    parse_meta,
    read_meta,
    read_payload_into,
    update_stats,
    write_kvc,
)

pytestmark = pytest.mark.timeout(120)

NS = Namespace(fingerprint=b"\x11" * 32, quant=3, ctx_hash=ctx_params_hash(n_ctx=4096))


def small_spec(**overrides: object) -> KvcSpec:
    fields: dict[str, object] = {
        "namespace": NS,
        "tokens": tokens_to_bytes([1, 2, 3]),
        "mode": FingerprintMode.SAFE,
        "reason": SaveReason.FINISH,
        "reason_detail": "d",
        "context_size": 4096,
        "hit_count": 2,
        "created_ns": 1_700_000_000_000_000_000,
        "hostname": "h",
        "llamad_version": "0.1.0",
    }
    fields.update(overrides)
    return KvcSpec(**fields)  # type: ignore[arg-type]


text = st.text(max_size=40)
specs = st.builds(
    KvcSpec,
    namespace=st.builds(
        Namespace,
        fingerprint=st.binary(min_size=32, max_size=32),
        quant=st.integers(0, 255),
        ctx_hash=st.binary(min_size=32, max_size=32),
    ),
    tokens=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=300).map(tokens_to_bytes),
    mode=st.sampled_from(FingerprintMode),
    reason=st.sampled_from(SaveReason),
    reason_detail=text,
    context_size=st.integers(0, 2**32 - 1),
    hit_count=st.integers(0, 2**32 - 1),
    created_ns=st.integers(1, 2**64 - 1),
    last_used_ns=st.integers(0, 2**64 - 1),
    hostname=text,
    llamad_version=st.text(max_size=10),
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(specs, st.binary(max_size=5000))
def test_kvc_round_trip_preserves_every_field(spec: KvcSpec, payload: bytes) -> None:
    data = encode_kvc(spec, payload)
    meta, body = parse(data, expected_key=spec.key)
    assert bytes(body) == payload
    assert meta.key == spec.key
    assert meta.namespace == spec.namespace
    assert (meta.mode, meta.reason, meta.reason_detail) == (
        spec.mode,
        spec.reason,
        spec.reason_detail,
    )
    assert (meta.tokens, meta.n_tokens) == (spec.tokens, spec.n_tokens)
    assert (meta.hit_count, meta.context_size) == (spec.hit_count, spec.context_size)
    assert (meta.created_ns, meta.last_used_ns) == (spec.created_ns, spec.last_used_ns)
    assert (meta.hostname, meta.llamad_version) == (spec.hostname, spec.llamad_version)
    assert meta.file_size == len(data) == spec.file_size(len(payload))
    assert meta.payload_offset % PAYLOAD_ALIGN == 0
    assert meta.payload_len == len(payload)
    assert parse_meta(data) == meta


def test_every_single_bit_flip_is_rejected_by_parse() -> None:
    data = encode_kvc(small_spec(), bytes(range(256)) * 2)
    parse(data)
    flipped = bytearray(data)
    for i in range(len(data)):
        for bit in range(8):
            flipped[i] ^= 1 << bit
            with pytest.raises(KvcCorrupt):
                parse(flipped)
            flipped[i] ^= 1 << bit
    assert flipped == data


def test_every_truncation_is_rejected_by_parse_and_parse_meta() -> None:
    data = encode_kvc(small_spec(), b"payload" * 20)
    for cut in range(len(data)):
        with pytest.raises(KvcCorrupt):
            parse(data[:cut])
        with pytest.raises(KvcCorrupt):
            parse_meta(data[:cut])


def test_trailing_bytes_are_rejected() -> None:
    data = encode_kvc(small_spec(), b"payload")
    with pytest.raises(KvcCorrupt) as err:
        parse(data + b"\x00")
    assert err.value.reason == "length"


def test_parse_rejects_a_different_expected_key() -> None:
    data = encode_kvc(small_spec(), b"p")
    with pytest.raises(KvcCorrupt) as err:
        parse(data, expected_key=NS.key([1, 2]))
    assert err.value.reason == "key_mismatch"
    assert err.value.code == "kvc_corrupt"


def test_parse_meta_skips_the_payload_checksum_and_parse_does_not() -> None:
    data = bytearray(encode_kvc(small_spec(), b"abcdef"))
    data[-1] ^= 0xFF
    assert parse_meta(data).payload_len == 6
    with pytest.raises(KvcCorrupt) as err:
        parse(data)
    assert err.value.reason == "payload_crc"


def test_junk_is_not_a_kvc_file() -> None:
    with pytest.raises(KvcCorrupt) as err:
        parse(b"\x00" * 5000)
    assert err.value.reason == "magic"


def test_write_kvc_produces_the_encoded_bytes(tmp_path: Path) -> None:
    spec = small_spec()
    payload = bytearray(os.urandom(3 << 20 | 123))  # spans several IO chunks
    path = tmp_path / "x.kvc"
    with open(path, "wb") as f:
        size = write_kvc(f, spec, payload)
    assert size == path.stat().st_size == spec.file_size(len(payload))
    assert path.read_bytes() == encode_kvc(spec, payload)


def test_read_payload_into_fills_the_buffer_and_checks_the_crc(tmp_path: Path) -> None:
    payload = os.urandom(2 << 20)
    path = tmp_path / "x.kvc"
    path.write_bytes(encode_kvc(small_spec(), payload))
    buf = bytearray(len(payload) + 100)
    fd = os.open(path, os.O_RDWR)
    try:
        meta = read_meta(fd, expected_key=small_spec().key)
        assert read_payload_into(fd, meta, buf) == len(payload)
        assert bytes(buf[: len(payload)]) == payload
        with pytest.raises(InvalidCacheValue):
            read_payload_into(fd, meta, bytearray(10))
        # Flipped, not overwritten: the random byte may already be 0xff.
        os.pwrite(fd, bytes([payload[12345] ^ 0xFF]), meta.payload_offset + 12345)
        with pytest.raises(KvcCorrupt) as err:
            read_payload_into(fd, meta, buf)
        assert err.value.reason == "payload_crc"
        os.ftruncate(fd, meta.file_size - 1)
        with pytest.raises(KvcCorrupt) as err:
            read_payload_into(fd, meta, buf)
        assert err.value.reason == "truncated"
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["first half", "second half"])
def test_a_payload_read_in_two_halves_finds_damage_in_either_and_leaves_nothing(
    tmp_path: Path, where: str
) -> None:
    # Above SPLIT_MIN_BYTES the two halves are read at once (crc32c_halves).
    payload = os.urandom(2 * SPLIT_MIN_BYTES + 12345)
    at = 1000 if where == "first half" else len(payload) - 1000
    path = tmp_path / "x.kvc"
    path.write_bytes(encode_kvc(small_spec(), payload))
    buf = bytearray(len(payload))
    fd = os.open(path, os.O_RDWR)
    try:
        meta = read_meta(fd, expected_key=small_spec().key)
        assert read_payload_into(fd, meta, buf) == len(payload)
        assert bytes(buf) == payload
        os.pwrite(fd, bytes([payload[at] ^ 0x40]), meta.payload_offset + at)
        with pytest.raises(KvcCorrupt) as err:
            read_payload_into(fd, meta, buf)
        assert err.value.reason == "payload_crc"
        assert buf == bytes(len(buf))  # zeroed: nothing of the row is left
        os.pwrite(fd, bytes([payload[at]]), meta.payload_offset + at)
        os.ftruncate(fd, meta.payload_offset + at)
        buf[:] = payload
        with pytest.raises(KvcCorrupt) as err:
            read_payload_into(fd, meta, buf)
        assert err.value.reason == "truncated"
        assert buf == bytes(len(buf))
    finally:
        os.close(fd)


@pytest.mark.parametrize("where", ["first half", "second half"])
def test_a_mapped_payload_copied_in_two_halves_finds_damage_in_either(where: str) -> None:
    payload = os.urandom(2 * SPLIT_MIN_BYTES + 777)
    data = bytearray(encode_kvc(small_spec(), payload))
    meta, _ = parse(bytes(data), expected_key=small_spec().key)
    buf = bytearray(len(payload))
    assert copy_payload_into(data, meta, buf) == len(payload)
    assert bytes(buf) == payload
    at = meta.payload_offset + (1000 if where == "first half" else len(payload) - 1000)
    data[at] ^= 0x08
    with pytest.raises(KvcCorrupt) as err:
        copy_payload_into(data, meta, buf)
    assert err.value.reason == "payload_crc"
    assert buf == bytes(len(buf))
    data.extend(b"x")  # no view of it outlived the copies (BufferError)


def test_update_stats_persists_hits_and_keeps_the_file_valid(tmp_path: Path) -> None:
    spec = small_spec()
    path = tmp_path / "x.kvc"
    path.write_bytes(encode_kvc(spec, b"abc"))
    fd = os.open(path, os.O_RDWR)
    try:
        update_stats(fd, hit_count=41, last_used_ns=99)
    finally:
        os.close(fd)
    meta, body = parse(path.read_bytes(), expected_key=spec.key)
    assert (meta.hit_count, meta.last_used_ns, bytes(body)) == (41, 99, b"abc")
    assert meta.created_ns == spec.created_ns


def test_update_stats_refuses_a_corrupt_header(tmp_path: Path) -> None:
    path = tmp_path / "x.kvc"
    data = bytearray(encode_kvc(small_spec(), b"abc"))
    data[HEADER_LEN - 10] ^= 1
    path.write_bytes(data)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(KvcCorrupt):
            update_stats(fd, hit_count=1, last_used_ns=1)
    finally:
        os.close(fd)
    assert path.read_bytes() == data


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tokens": b""}, "tokens"),
        ({"tokens": b"\x00\x00\x00"}, "tokens"),
        ({"mode": "sloppy"}, "mode"),
        ({"reason": 9}, "reason"),
        ({"hit_count": -1}, "hit_count"),
        ({"context_size": 2**32}, "context_size"),
        ({"hostname": "h" * 300}, "hostname"),
        ({"reason_detail": "x" * 2000}, "reason_detail"),
    ],
)
def test_kvc_spec_rejects_bad_fields_naming_them(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        small_spec(**overrides)
    assert err.value.field == field


def test_file_name_is_the_hex_key() -> None:
    key = small_spec().key
    assert file_name(key) == key.hex() + ".kvc"
    with pytest.raises(InvalidCacheValue):
        file_name(b"short")


def test_crc32c_is_the_hardware_accelerated_implementation() -> None:
    assert crc32c.hardware_based
    assert crc32c.crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
