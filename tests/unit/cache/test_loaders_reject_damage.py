"""Every single-bit flip and every truncation is refused by the loaders production uses.

``parse()`` is held to this in ``test_kvc.py``; a restore never calls it. It
goes through one of three paths, each tested here against every bit of a
small but complete file (header, TLV, padding, payload):

- a ``ram_file`` or ``disk`` row: ``read_meta`` then ``read_payload_into`` on
  one descriptor;
- a ``ram`` row kept mapped: ``copy_payload_into`` with the meta validated
  when it was mapped, which must notice damage done since;
- the same through the tier (``Tier.read_into``, ``Tier.mapped_payload``) on
  a real shared-memory segment this process mapped before it was damaged.

A refused load leaves the caller's buffer exactly as it was when the damage
is before the payload; when it is in the payload, the copied span is zeroed
(the checksum is known only once the payload is copied) and nothing else
changes.

Every test runs on two files: a version 1 row, and a version 2 row that keeps
logits (its LOGITS record, between the token ids and the padding, is damaged
bit by bit like the rest), and each loader hands the logits back.

Which flips (:func:`flips`): every bit of the header, the TLV records and the
payload; every bit of the padding's first and last 16 bytes; and one bit of
every other padding byte (the bit turns with the offset, so each bit number
is flipped ~500 times). The zero padding, ~3,900 of each file's 4,608 bytes,
is checked as a whole: by the TLV checksum and a zero count on a fresh read,
by one compare with the validated prefix on a kept mapping. A byte the checks
skipped would be found by its one flip, a span they stopped short of or
started late at by the edges; all 8 bits of every padding byte (31,000 of the
37,000 flips of a file) took 55 of the module's 76 s, and made no other point.
"""

from __future__ import annotations

import os
import struct
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llamad.cache.errors import KvcCorrupt
from llamad.cache.key import FingerprintMode, Namespace, tokens_to_bytes
from llamad.cache.kvc import (
    HEADER_LEN,
    KvcLogits,
    KvcMeta,
    KvcSpec,
    SaveReason,
    copy_payload_into,
    encode_kvc,
    parse_meta,
    read_meta,
    read_payload_into,
)
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import SEGMENTS, SHM_ROOT, Tier, TierConfig, load_mapped_row, load_row

pytestmark = pytest.mark.timeout(300)

NS = Namespace(fingerprint=b"\x13" * 32, quant=7, ctx_hash=b"\x24" * 32)
PAYLOAD = bytes(range(256)) * 2
SENTINEL = bytes((i * 7 + 0xA5) % 255 + 1 for i in range(len(PAYLOAD) + 64))
# Few enough values that every bit of the file is still flipped in seconds.
LOGITS = KvcLogits(1, struct.pack("<6f", 0.5, -1.0, 2.0, -3.5, 4.0, 0.0))


@dataclass(frozen=True)
class Row:
    """One file under test: its spec, its bytes, the meta validated from them."""

    spec: KvcSpec
    data: bytes
    meta: KvcMeta

    @classmethod
    def of(cls, logits: KvcLogits | None) -> Row:
        spec = KvcSpec(
            NS,
            tokens_to_bytes([5, 6, 7]),
            FingerprintMode.GGUF_CHUNKED,
            SaveReason.CONTINUED,
            reason_detail="why",
            context_size=4096,
            hit_count=3,
            created_ns=1_700_000_000_000_000_000,
            hostname="h",
            llamad_version="0.1.0",
            logits=logits,
        )
        data = encode_kvc(spec, PAYLOAD)
        return cls(spec, data, parse_meta(data))

    @property
    def padding(self) -> range:
        """The zero bytes between the last TLV record and the payload."""
        return range(HEADER_LEN + len(self.spec.tlv()), self.meta.payload_offset)

    def expected_buffer(self, offset: int) -> bytes:
        """The buffer after a refused load of this file damaged at ``offset``."""
        if offset >= self.meta.payload_offset:
            return bytes(len(PAYLOAD)) + SENTINEL[len(PAYLOAD) :]
        return SENTINEL


ROWS = {"v1": Row.of(None), "logits": Row.of(LOGITS)}
assert ROWS["logits"].meta.logits == LOGITS

# Loader under test: (file bytes as they are now) -> payload length, or raises.
Loader = Callable[[bytearray], int]


@pytest.fixture(params=sorted(ROWS))
def row(request: pytest.FixtureRequest) -> Row:
    return ROWS[request.param]


PADDING_EDGE = 16
"""Bytes at each end of the padding whose 8 bits are all flipped."""


def flips(row: Row) -> Iterator[tuple[int, int]]:
    """``(offset, mask)`` of each single-bit flip tried on ``row`` (the module doc says which)."""
    padding = row.padding
    # The file has the padding the module doc describes.
    assert len(padding) > 2 * PADDING_EDGE and not any(row.data[padding.start : padding.stop])
    inner = range(padding.start + PADDING_EDGE, padding.stop - PADDING_EDGE)
    for offset in range(len(row.data)):
        if offset in inner:
            yield offset, 1 << (offset % 8)
        else:
            for bit in range(8):
                yield offset, 1 << bit


def n_flips(row: Row) -> int:
    """How many flips :func:`flips` makes: 8 a byte, 1 for the inner padding."""
    inner = len(row.padding) - 2 * PADDING_EDGE
    return 8 * (len(row.data) - inner) + inner


def every_flip_is_refused(row: Row, load: Callable[[int, int], int], buf: bytearray) -> int:
    """Make each of :func:`flips` in turn through ``load(offset, mask)``; returns flips tried."""
    tried = 0
    for offset, mask in flips(row):
        want = row.expected_buffer(offset)
        buf[:] = SENTINEL
        with pytest.raises(KvcCorrupt):
            load(offset, mask)
        if buf != want:
            pytest.fail(f"mask {mask:#x} of byte {offset}: the buffer holds the wrong bytes")
        tried += 1
    return tried


def every_truncation_is_refused(row: Row, load: Callable[[int], int], buf: bytearray) -> int:
    for cut in range(len(row.data)):
        buf[:] = SENTINEL
        with pytest.raises(KvcCorrupt):
            load(cut)
        if buf != SENTINEL:
            pytest.fail(f"cut at {cut}: a refused load wrote into the buffer")
    return len(row.data)


@pytest.fixture
def row_file(tmp_path: Path, row: Row) -> Iterator[int]:
    """A descriptor of a ``disk``-style file holding the row (restored between damages)."""
    path = tmp_path / "row.kvc"
    path.write_bytes(row.data)
    fd = os.open(path, os.O_RDWR)
    yield fd
    os.close(fd)


def _read_fd(row: Row, fd: int, buf: bytearray) -> int:
    # What Tier.read_into does for ram_file and disk rows.
    return read_payload_into(fd, read_meta(fd, expected_key=row.spec.key), buf)


def test_read_meta_and_read_payload_into_refuse_every_flip(row: Row, row_file: int) -> None:
    buf = bytearray(len(SENTINEL))
    assert _read_fd(row, row_file, buf) == len(PAYLOAD) and buf[: len(PAYLOAD)] == PAYLOAD

    def flipped(offset: int, mask: int) -> int:
        os.pwrite(row_file, bytes([row.data[offset] ^ mask]), offset)
        try:
            return _read_fd(row, row_file, buf)
        finally:
            os.pwrite(row_file, row.data[offset : offset + 1], offset)

    assert every_flip_is_refused(row, flipped, buf) == n_flips(row)


def test_read_meta_and_read_payload_into_refuse_every_truncation(row: Row, row_file: int) -> None:
    buf = bytearray(len(SENTINEL))

    def truncated(cut: int) -> int:
        os.ftruncate(row_file, cut)
        try:
            return _read_fd(row, row_file, buf)
        finally:
            os.pwrite(row_file, row.data[cut:], cut)

    assert every_truncation_is_refused(row, truncated, buf) == len(row.data)
    assert _read_fd(row, row_file, buf) == len(PAYLOAD)


def test_copy_payload_into_refuses_every_flip_after_validation(row: Row) -> None:
    # The meta is the one validated before the damage, as a kept mapping has.
    buf = bytearray(len(SENTINEL))
    data = bytearray(row.data)

    def flipped(offset: int, mask: int) -> int:
        data[offset] ^= mask
        try:
            return copy_payload_into(data, row.meta, buf)
        finally:
            data[offset] ^= mask

    assert every_flip_is_refused(row, flipped, buf) == n_flips(row)
    assert copy_payload_into(data, row.meta, buf) == len(PAYLOAD)


def test_copy_payload_into_refuses_every_truncation_after_validation(row: Row) -> None:
    buf = bytearray(len(SENTINEL))
    assert every_truncation_is_refused(
        row, lambda cut: copy_payload_into(row.data[:cut], row.meta, buf), buf
    )


@pytest.fixture
def ram_row(row: Row) -> Iterator[tuple[Tier, Path]]:
    tier = Tier(TierConfig(TierKind.RAM, SHM_ROOT, 1 << 20, f"ld{uuid.uuid4().hex[:12]}"))
    path = tier.path_for(row.spec.key)
    path.write_bytes(row.data)
    yield tier, path
    SEGMENTS.drop(path)
    tier.purge()


def _mapped_copy(row: Row, tier: Tier, buf: bytearray) -> int:
    return tier.read_into(row.spec.key, buf)


def _mapped_in_place(row: Row, tier: Tier, buf: bytearray) -> int:
    # A restore with no copy: the view is what llama_state_seq_set_data reads.
    with tier.mapped_payload(row.spec.key) as view:
        n = len(view)
    return n


@pytest.mark.parametrize("read", [_mapped_copy, _mapped_in_place], ids=["copy", "in_place"])
def test_a_kept_ram_mapping_refuses_every_flip_made_after_it_was_mapped(
    row: Row, ram_row: tuple[Tier, Path], read: Callable[[Row, Tier, bytearray], int]
) -> None:
    tier, path = ram_row
    fd = os.open(path, os.O_RDWR)
    buf = bytearray(len(SENTINEL))
    in_place = read is _mapped_in_place

    def flipped(offset: int, mask: int) -> int:
        assert read(row, tier, buf) == len(PAYLOAD)  # mapped now (again), and valid
        assert path in SEGMENTS
        buf[:] = SENTINEL
        os.pwrite(fd, bytes([row.data[offset] ^ mask]), offset)
        try:
            return read(row, tier, buf)
        finally:
            os.pwrite(fd, row.data[offset : offset + 1], offset)

    try:
        if in_place:
            # Nothing is copied in place: the buffer only shows nothing was.
            tried = 0
            for offset, mask in flips(row):
                with pytest.raises(KvcCorrupt):
                    flipped(offset, mask)
                assert path not in SEGMENTS
                tried += 1
            assert tried == n_flips(row)
            assert buf == SENTINEL
        else:
            assert every_flip_is_refused(row, flipped, buf) == n_flips(row)
    finally:
        os.close(fd)


def test_a_kept_ram_mapping_refuses_every_truncation_made_after_it_was_mapped(
    row: Row, ram_row: tuple[Tier, Path]
) -> None:
    tier, path = ram_row
    fd = os.open(path, os.O_RDWR)
    buf = bytearray(len(SENTINEL))

    def truncated(cut: int) -> int:
        os.pwrite(fd, row.data, 0)
        assert tier.read_into(row.spec.key, buf) == len(PAYLOAD)
        buf[:] = SENTINEL
        os.ftruncate(fd, cut)
        return tier.read_into(row.spec.key, buf)

    try:
        assert every_truncation_is_refused(row, truncated, buf) == len(row.data)
    finally:
        os.close(fd)


def test_the_validated_meta_remembers_the_prefix_it_was_read_from(row: Row) -> None:
    # What the kept-mapping checks compare against.
    meta: KvcMeta = row.meta
    assert meta.prefix == row.data[: meta.payload_offset]


def test_every_loader_hands_back_the_logits_the_row_keeps(
    row: Row, row_file: int, ram_row: tuple[Tier, Path], tmp_path: Path
) -> None:
    tier, _ = ram_row
    buf = bytearray(len(SENTINEL))
    want = row.spec.logits
    assert read_meta(row_file, expected_key=row.spec.key).logits == want
    assert tier.read_row_into(row.spec.key, buf).logits == want
    with tier.mapped_row(row.spec.key) as loaded:
        assert loaded.meta.logits == want and bytes(loaded.payload) == PAYLOAD
    got = load_row(tier, row.spec.key, buf)
    assert got is not None and got.logits == want and got.payload_len == len(PAYLOAD)
    with load_mapped_row(tier, row.spec.key) as mapped:
        assert mapped is not None and mapped.meta.logits == want
    disk = Tier(TierConfig(TierKind.DISK, tmp_path / "disk", 1 << 20))
    disk.prepare()
    disk.path_for(row.spec.key).write_bytes(row.data)
    got = load_row(disk, row.spec.key, buf)
    assert got is not None and got.logits == want
