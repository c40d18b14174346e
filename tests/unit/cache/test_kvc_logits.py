"""The LOGITS record of a ``.kvc`` file (SPEC C2, M3): the logits a row keeps.

A row may keep the logits of one of its positions (a finish save keeps its
prompt's last), so that an exact repeat of the prompt samples its first token
without decoding that position again. The record is optional: a row without
it is still the version 1 file, byte for byte; a row with it is version 2,
and the record is validated like every other (the TLV CRC, the ranges, the
position inside the row).
"""

from __future__ import annotations

import hashlib
import math
import struct
import sys
from array import array

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llamad.cache.errors import InvalidCacheValue, KvcCorrupt
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import (
    FORMAT_VERSION,
    FORMAT_VERSION_NO_LOGITS,
    HEADER,
    HEADER_LEN,
    KvcLogits,
    KvcSpec,
    SaveReason,
    encode_kvc,
    parse,
    parse_meta,
)

pytestmark = pytest.mark.timeout(120)

NS = Namespace(fingerprint=b"\x11" * 32, quant=3, ctx_hash=b"\x22" * 32)
LOGITS = KvcLogits(2, struct.pack("<4f", 1.5, -2.0, 0.25, -math.inf))


def spec(logits: KvcLogits | None = None, tokens: list[int] | None = None) -> KvcSpec:
    return KvcSpec(
        NS,
        tokens_to_bytes(tokens if tokens is not None else [1, 2, 3]),
        FingerprintMode.SAFE,
        SaveReason.FINISH,
        reason_detail="d",
        context_size=4096,
        hit_count=2,
        created_ns=1_700_000_000_000_000_000,
        hostname="h",
        llamad_version="0.1.0",
        logits=logits,
    )


def version_of(data: bytes | bytearray) -> int:
    return int(HEADER.unpack_from(data)[1])


def reseal(data: bytearray) -> bytearray:
    """Recompute the TLV and header checksums after a deliberate edit, so only
    the edited field's own check can refuse the file."""
    fields = list(HEADER.unpack_from(data))
    offset, tlv_len = fields[9], fields[11]
    fields[12] = crc32c.crc32c(bytes(data[HEADER_LEN:offset]))
    head = bytearray(HEADER.pack(*fields))
    head[-4:] = struct.pack("<I", crc32c.crc32c(bytes(head[:-4])))
    data[:HEADER_LEN] = head
    assert tlv_len <= offset
    return data


def test_a_row_without_logits_is_the_version_1_file_byte_for_byte() -> None:
    # The digest of this row as the format's first writer (before rows kept
    # logits) encoded it: an older llamad still reads every row without logits.
    data = encode_kvc(spec(), bytes(range(256)))
    assert version_of(data) == FORMAT_VERSION_NO_LOGITS == 1
    assert hashlib.sha256(data).hexdigest() == (
        "f4c6145368f16cfde544a479f3b5300e45c31414fcd9e9ed08d02b27ff8c3791"
    )
    assert parse(data)[0].logits is None


def test_a_row_with_logits_is_version_2_and_reads_them_back() -> None:
    data = encode_kvc(spec(LOGITS), b"payload")
    assert version_of(data) == FORMAT_VERSION == 2
    meta, body = parse(data, expected_key=spec().key)
    assert bytes(body) == b"payload"
    assert meta.logits == LOGITS and meta.logits is not None
    assert (meta.logits.position, meta.logits.count) == (2, 4)
    assert list(meta.logits.floats())[:3] == [1.5, -2.0, 0.25]
    assert parse_meta(data).logits == LOGITS
    # The key is the tokens' alone: a row with logits is the same row.
    assert meta.key == spec().key


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=50),
    st.data(),
    st.binary(min_size=4, max_size=400).map(lambda b: b[: len(b) // 4 * 4]),
    st.binary(max_size=3000),
)
def test_the_logits_round_trip_whatever_their_position_and_bytes(
    tokens: list[int], data: st.DataObject, values: bytes, payload: bytes
) -> None:
    position = data.draw(st.integers(0, len(tokens) - 1))
    logits = KvcLogits(position, values)
    s = spec(logits, tokens)
    encoded = encode_kvc(s, payload)
    meta, body = parse(encoded, expected_key=s.key)
    assert meta.logits == logits and bytes(body) == payload
    assert meta.file_size == len(encoded) == s.file_size(len(payload))


def test_the_logits_count_in_the_files_size() -> None:
    # What a reservation asks cache-meta's quota for is the whole file.
    values = bytes(4 * 49_152)  # the default model's vocabulary
    without, kept = spec(), spec(KvcLogits(2, values))
    assert kept.payload_offset() >= HEADER_LEN + len(without.tlv()) + 5 + 8 + len(values)
    assert kept.file_size(100) == kept.payload_offset() + 100 > without.file_size(100)
    assert kept.file_size(100) == len(encode_kvc(kept, bytes(100)))


def test_every_single_bit_flip_of_a_row_with_logits_is_rejected_by_parse() -> None:
    data = encode_kvc(spec(LOGITS), bytes(range(256)))
    parse(data)
    flipped = bytearray(data)
    for i in range(len(data)):
        for bit in range(8):
            flipped[i] ^= 1 << bit
            with pytest.raises(KvcCorrupt):
                parse(flipped)
            flipped[i] ^= 1 << bit
    assert flipped == data


def test_every_truncation_of_a_row_with_logits_is_rejected() -> None:
    data = encode_kvc(spec(LOGITS), b"payload" * 20)
    for cut in range(len(data)):
        with pytest.raises(KvcCorrupt):
            parse(data[:cut])
        with pytest.raises(KvcCorrupt):
            parse_meta(data[:cut])


def _with_version(data: bytes, version: int) -> bytearray:
    edited = bytearray(data)
    struct.pack_into("<H", edited, 8, version)
    return reseal(edited)


def test_a_version_1_header_over_a_logits_record_is_refused() -> None:
    edited = _with_version(encode_kvc(spec(LOGITS), b"p"), FORMAT_VERSION_NO_LOGITS)
    with pytest.raises(KvcCorrupt) as err:
        parse(edited)
    assert err.value.reason == "tlv"


def test_a_version_2_file_without_its_logits_record_is_refused() -> None:
    edited = _with_version(encode_kvc(spec(), b"p"), FORMAT_VERSION)
    with pytest.raises(KvcCorrupt) as err:
        parse(edited)
    assert err.value.reason == "tlv"


def test_an_unknown_version_is_refused_as_a_version() -> None:
    edited = _with_version(encode_kvc(spec(LOGITS), b"p"), 3)
    with pytest.raises(KvcCorrupt) as err:
        parse(edited)
    assert err.value.reason == "version"


def _logits_record_at(data: bytes) -> int:
    """Offset of the LOGITS record's value (position, count, values)."""
    head = struct.pack("<BI", 9, 8 + 4 * LOGITS.count)
    at = bytes(data).index(head + struct.pack("<II", LOGITS.position, LOGITS.count))
    return at + len(head)


@pytest.mark.parametrize(
    ("position", "count"),
    [(3, LOGITS.count), (2**32 - 1, LOGITS.count), (2, LOGITS.count + 1), (2, 0)],
    ids=["past_the_tokens", "huge_position", "count_too_big", "count_zero"],
)
def test_a_logits_record_that_disagrees_with_itself_or_the_row_is_refused(
    position: int, count: int
) -> None:
    # Sealed with valid checksums: only the record's own checks stand in the way.
    data = bytearray(encode_kvc(spec(LOGITS), b"p"))
    struct.pack_into("<II", data, _logits_record_at(data), position, count)
    with pytest.raises(KvcCorrupt) as err:
        parse(reseal(data))
    assert err.value.reason == "tlv"


@pytest.mark.parametrize(
    ("position", "values"),
    [
        (3, struct.pack("<f", 1.0)),  # the row has 3 tokens: positions 0..2
        (-1, struct.pack("<f", 1.0)),
        (0, b""),
        (0, b"\x00\x00\x00"),
        (0, array("d", [1.0])),
    ],
    ids=["past_the_tokens", "negative", "empty", "partial_float", "float64"],
)
def test_a_spec_refuses_logits_it_could_not_write(position: int, values: object) -> None:
    with pytest.raises(InvalidCacheValue) as err:
        spec(KvcLogits(position, values))  # type: ignore[arg-type]
    assert err.value.field in ("logits", "logits.position")


def test_host_float32s_are_kept_little_endian() -> None:
    native = array("f", [1.0, -0.5, 3.25])
    kept = KvcLogits(0, native)
    assert kept.values == struct.pack("<3f", 1.0, -0.5, 3.25)
    assert list(kept.floats()) == [1.0, -0.5, 3.25]
    assert kept.floats().itemsize == 4 and sys.byteorder in ("little", "big")
