"""The ``.kvc`` file format (SPEC C2): one saved KV state and what produced it.

Layout, little-endian throughout::

    [0, 72)                 fixed header (see HEADER below)
    [72, 72 + tlv_len)      TLV records: u8 tag, u32 length, value
    [.., payload_offset)    zero padding up to a 4096-byte boundary
    [payload_offset, end)   payload: the raw llama_state_seq bytes

Header fields: magic ``LLAMADKV``, u16 format version, u8 save reason, u8
reserved (0), u32 token count, u32 hit count, u32 context size, u64 created and
last-used times (unix ns), u64 payload offset and length, u32 TLV length, u32
CRC32C of ``[72, payload_offset)``, u32 CRC32C of the payload, and last a u32
CRC32C of the 68 header bytes before it.

Every byte is covered by a check: the header by its own CRC, the TLV region and
padding by the TLV CRC, the payload by the payload CRC, and the length by
``payload_offset + payload_len == file size``. So any single-bit flip or any
truncation is rejected, and the key is recomputed from the TLV (never trusted
from a file name). The hit count and last-used time live in the header only, so
cache-meta can persist them by rewriting 72 bytes (:func:`update_stats`).

TLV tags (each once, ascending): 1 fingerprint (32), 2 fingerprint mode (1: 0
safe, 1 gguf_chunked, 2 fast_unsafe), 3 quant byte (1), 4 ctx params hash (32),
5 hostname (UTF-8), 6 llamad version (UTF-8), 7 reason detail (UTF-8), 8 token
ids (u32 LE, token count of them), all required; then 9 logits (u32 position,
u32 count, ``count`` float32 LE), in version 2 files only and required there.

Versions. A version 1 file is the format as first written: tags 1-8 and
nothing after them. A file whose row keeps the logits of one of its positions
(:class:`KvcLogits`: a finish save keeps those of its prompt's last token, so
an exact repeat of the prompt samples its first token without decoding it
again) is version 2, and only such a file is. A row without logits is
therefore still written byte for byte as version 1, which an older llamad
reads; one with logits is refused by it as an unknown version (its TLV would
fail anyway), not misread. The logits lie in the TLV region, so the TLV CRC,
the prefix re-check of a kept ``ram`` mapping and a quota's file size cover
them like every other record; they are not part of the key.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
from array import array
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Final, Protocol

import structlog

from llamad._pins import LLAMAD_VERSION
from llamad.cache.checksum import HARDWARE_BASED, crc32c, crc32c_halves
from llamad.cache.errors import InvalidCacheValue, KvcCorrupt
from llamad.cache.key import (
    CTX_HASH_LEN,
    FINGERPRINT_LEN,
    TOKEN_BYTES,
    FingerprintMode,
    Namespace,
    tokens_to_bytes,
)

if TYPE_CHECKING:
    from typing_extensions import Buffer

if not HARDWARE_BASED:  # pragma: no cover - every CI host has SSE4.2 or ARMv8 CRC
    # Software CRC32C runs at a few hundred MB/s: every restore would pay for it.
    structlog.get_logger("llamad.cache.kvc").warning("cache.crc32c_software_fallback")

MAGIC: Final = b"LLAMADKV"
FORMAT_VERSION: Final = 2
"""The newest version this code writes (a row with logits); see the module doc."""
FORMAT_VERSION_NO_LOGITS: Final = 1
_VERSIONS: Final = frozenset({FORMAT_VERSION_NO_LOGITS, FORMAT_VERSION})
HEADER: Final = struct.Struct("<8sHBBIIIQQQQIIII")
HEADER_LEN: Final = HEADER.size
_HEADER_CRC_SPAN: Final = HEADER_LEN - 4
# Header bytes update_stats rewrites in a published file: the hit count, the
# last-used time and the header CRC over them. Everything else in the prefix
# never changes once a row is published.
_STATS_SPANS: Final = ((16, 20), (32, 40), (_HEADER_CRC_SPAN, HEADER_LEN))
PAYLOAD_ALIGN: Final = 4096
SUFFIX: Final = ".kvc"

MAX_TOKENS: Final = 1 << 24
MAX_HOSTNAME: Final = 255
MAX_VERSION: Final = 64
MAX_REASON_DETAIL: Final = 1024
MAX_PAYLOAD: Final = 1 << 40
MAX_LOGITS: Final = 1 << 20
"""Most logits a row keeps (a vocabulary of a million tokens, 4 MiB)."""
_TLV_RECORD: Final = struct.Struct("<BI")
_LOGITS_HEAD: Final = struct.Struct("<II")
MAX_TLV: Final = (
    9 * _TLV_RECORD.size
    + FINGERPRINT_LEN
    + CTX_HASH_LEN
    + 2
    + MAX_HOSTNAME
    + MAX_VERSION
    + MAX_REASON_DETAIL
    + MAX_TOKENS * TOKEN_BYTES
    + _LOGITS_HEAD.size
    + MAX_LOGITS * 4
)
# Bytes fed to CRC32C and to write(2) per step: small enough to stay in L2
# between the checksum and the copy, large enough that syscalls don't show.
IO_CHUNK: Final = 1 << 20


class SaveReason(IntEnum):
    """Why a row was saved (SPEC C10 counts saves per reason)."""

    COLD = 1
    CONTINUED = 2
    FINISH = 3
    EVICT = 4
    SHUTDOWN = 5


class _Tag(IntEnum):
    FINGERPRINT = 1
    MODE = 2
    QUANT = 3
    CTX_HASH = 4
    HOSTNAME = 5
    VERSION = 6
    REASON_DETAIL = 7
    TOKENS = 8
    LOGITS = 9


_REQUIRED_TAGS: Final = tuple(t for t in _Tag if t is not _Tag.LOGITS)

_MODE_BYTES: Final = {
    FingerprintMode.SAFE: 0,
    FingerprintMode.GGUF_CHUNKED: 1,
    FingerprintMode.FAST_UNSAFE: 2,
}
_MODES_BY_BYTE: Final = {v: k for k, v in _MODE_BYTES.items()}


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


def _align(n: int) -> int:
    return -(-n // PAYLOAD_ALIGN) * PAYLOAD_ALIGN


def _text(field_name: str, value: str, limit: int) -> bytes:
    if not isinstance(value, str):
        raise InvalidCacheValue(field_name, "expected a string")
    data = value.encode("utf-8")
    if len(data) > limit:
        raise InvalidCacheValue(field_name, f"{len(data)} bytes of UTF-8, limit {limit}")
    return data


def _uint(field_name: str, value: int, bits: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << bits:
        raise InvalidCacheValue(field_name, f"{value!r} is not a u{bits}")


def _float32_le(values: Buffer) -> bytes:
    """``values`` as float32 little-endian bytes (a float32 buffer in this host's
    order, or raw bytes already in the file's order)."""
    if isinstance(values, bytes):
        data = values
    else:
        try:
            view = memoryview(values)
        except TypeError:
            raise InvalidCacheValue("logits", "expected a float32 buffer") from None
        with view:
            if not view.contiguous or view.format not in ("f", "=f", "<f", "B", "b", "c"):
                raise InvalidCacheValue("logits", f"expected float32 values, not {view.format!r}")
            data = view.tobytes()
            if view.format in ("f", "=f") and sys.byteorder == "big":
                swapped = array("f", data)
                swapped.byteswap()
                data = swapped.tobytes()
    if len(data) % 4:
        raise InvalidCacheValue("logits", f"{len(data)} bytes, not whole float32s")
    return data


@dataclass(frozen=True, slots=True)
class KvcLogits:
    """The logits a row keeps for one of its positions (the LOGITS record).

    ``position`` is the token position whose decode produced them: the row's
    tokens ``0..position`` determine them, so they are the logits after that
    prefix whatever the row holds beyond it. ``values`` is ``count`` float32
    values, little-endian (a float32 buffer in this host's order, or the
    file's bytes, is accepted and stored as an immutable copy).
    """

    position: int
    values: bytes = field(repr=False)

    def __post_init__(self) -> None:
        _uint("logits.position", self.position, 32)
        data = _float32_le(self.values)
        if not 1 <= len(data) // 4 <= MAX_LOGITS:
            raise InvalidCacheValue("logits", f"{len(data) // 4} values, expected 1..{MAX_LOGITS}")
        object.__setattr__(self, "values", data)

    @property
    def count(self) -> int:
        return len(self.values) // 4

    def floats(self) -> array[float]:
        """The values as this host's float32s (an aligned copy, for C code to read)."""
        out = array("f")
        out.frombytes(self.values)
        if sys.byteorder == "big":
            out.byteswap()
        return out

    def record(self) -> bytes:
        """The LOGITS record's value: position, count, the values."""
        return _LOGITS_HEAD.pack(self.position, self.count) + self.values


@dataclass(frozen=True, slots=True)
class KvcSpec:
    """Everything a writer knows about a row before it writes the payload."""

    namespace: Namespace
    tokens: bytes
    mode: FingerprintMode
    reason: SaveReason
    reason_detail: str = ""
    context_size: int = 0
    hit_count: int = 0
    created_ns: int = field(default_factory=time.time_ns)
    last_used_ns: int = 0
    hostname: str = field(default_factory=socket.gethostname)
    llamad_version: str = LLAMAD_VERSION
    logits: KvcLogits | None = None
    """Logits the row keeps (a finish save's: its prompt's last position); version 2."""
    _tlv: bytes = field(init=False, repr=False, compare=False, default=b"")

    def __post_init__(self) -> None:
        if not isinstance(self.namespace, Namespace):
            raise InvalidCacheValue("namespace", "expected a Namespace")
        tokens = tokens_to_bytes(self.tokens)
        n_tokens = len(tokens) // TOKEN_BYTES
        if not 1 <= n_tokens <= MAX_TOKENS:
            raise InvalidCacheValue("tokens", f"{n_tokens} tokens, expected 1..{MAX_TOKENS}")
        object.__setattr__(self, "tokens", tokens)
        try:
            object.__setattr__(self, "mode", FingerprintMode(self.mode))
        except ValueError:
            raise InvalidCacheValue("mode", f"unknown fingerprint mode {self.mode!r}") from None
        try:
            object.__setattr__(self, "reason", SaveReason(self.reason))
        except ValueError:
            raise InvalidCacheValue("reason", f"unknown save reason {self.reason!r}") from None
        _uint("context_size", self.context_size, 32)
        _uint("hit_count", self.hit_count, 32)
        _uint("created_ns", self.created_ns, 64)
        _uint("last_used_ns", self.last_used_ns, 64)
        if self.last_used_ns == 0:
            object.__setattr__(self, "last_used_ns", self.created_ns)
        _text("hostname", self.hostname, MAX_HOSTNAME)
        _text("llamad_version", self.llamad_version, MAX_VERSION)
        _text("reason_detail", self.reason_detail, MAX_REASON_DETAIL)
        if self.logits is not None:
            if not isinstance(self.logits, KvcLogits):
                raise InvalidCacheValue("logits", "expected KvcLogits")
            if self.logits.position >= n_tokens:
                raise InvalidCacheValue(
                    "logits",
                    f"position {self.logits.position} is not one of the row's {n_tokens} tokens",
                )
        # Built once: the writer asks for the offset, the size and the bytes,
        # and a row's logits make the TLV a few hundred KiB.
        object.__setattr__(self, "_tlv", self._encode_tlv())

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // TOKEN_BYTES

    @property
    def version(self) -> int:
        """The format version this row is written as (2 exactly when it keeps logits)."""
        return FORMAT_VERSION_NO_LOGITS if self.logits is None else FORMAT_VERSION

    @property
    def key(self) -> bytes:
        """The row's 32-byte key."""
        return self.namespace.key(self.tokens)

    def tlv(self) -> bytes:
        """The TLV records, in the canonical order :func:`parse` requires."""
        return self._tlv

    def _encode_tlv(self) -> bytes:
        ns = self.namespace
        values: list[tuple[_Tag, bytes]] = [
            (_Tag.FINGERPRINT, ns.fingerprint),
            (_Tag.MODE, bytes((_MODE_BYTES[self.mode],))),
            (_Tag.QUANT, bytes((ns.quant,))),
            (_Tag.CTX_HASH, ns.ctx_hash),
            (_Tag.HOSTNAME, self.hostname.encode()),
            (_Tag.VERSION, self.llamad_version.encode()),
            (_Tag.REASON_DETAIL, self.reason_detail.encode()),
            (_Tag.TOKENS, self.tokens),
        ]
        if self.logits is not None:
            values.append((_Tag.LOGITS, self.logits.record()))
        return b"".join(_TLV_RECORD.pack(tag, len(value)) + value for tag, value in values)

    def payload_offset(self) -> int:
        return _align(HEADER_LEN + len(self.tlv()))

    def file_size(self, payload_len: int) -> int:
        """Size of the file this spec produces with a payload of ``payload_len`` bytes."""
        return self.payload_offset() + payload_len


@dataclass(frozen=True, slots=True)
class KvcMeta:
    """A validated row as read back from a file: header plus TLV."""

    key: bytes
    namespace: Namespace
    mode: FingerprintMode
    reason: SaveReason
    reason_detail: str
    tokens: bytes
    n_tokens: int
    hit_count: int
    context_size: int
    created_ns: int
    last_used_ns: int
    payload_offset: int
    payload_len: int
    payload_crc32c: int
    file_size: int
    hostname: str
    llamad_version: str
    # The bytes [0, payload_offset) these fields were decoded from: a file
    # kept mapped is re-checked against them on every load
    # (:func:`check_prefix_unchanged`).
    prefix: bytes = field(repr=False)
    logits: KvcLogits | None = None
    """The logits the row keeps (version 2 files), validated like every other record."""


def encode_prefix(spec: KvcSpec, payload_len: int, payload_crc: int) -> bytes:
    """Header, TLV and padding: the bytes that precede a payload in the file."""
    _uint("payload_len", payload_len, 64)
    if payload_len > MAX_PAYLOAD:
        raise InvalidCacheValue("payload_len", f"{payload_len} exceeds {MAX_PAYLOAD}")
    tlv = spec.tlv()
    offset = _align(HEADER_LEN + len(tlv))
    region = tlv + bytes(offset - HEADER_LEN - len(tlv))
    head = HEADER.pack(
        MAGIC,
        spec.version,
        spec.reason,
        0,
        spec.n_tokens,
        spec.hit_count,
        spec.context_size,
        spec.created_ns,
        spec.last_used_ns,
        offset,
        payload_len,
        len(tlv),
        crc32c(region),
        payload_crc,
        0,
    )
    return _seal_header(head) + region


def _seal_header(head: bytes | bytearray) -> bytes:
    crc = crc32c(memoryview(head)[:_HEADER_CRC_SPAN])
    return bytes(head[:_HEADER_CRC_SPAN]) + struct.pack("<I", crc)


def _payload_view(payload: Buffer) -> memoryview:
    view = memoryview(payload)
    if not view.contiguous:
        raise InvalidCacheValue("payload", "payload must be a contiguous buffer")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def encode_kvc(spec: KvcSpec, payload: Buffer) -> bytes:
    """A whole file in memory (tests and small payloads; writers use :func:`write_kvc`)."""
    view = _payload_view(payload)
    return encode_prefix(spec, len(view), crc32c(view)) + bytes(view)


def _fd_of(target: int | _HasFileno) -> int:
    return target if isinstance(target, int) else target.fileno()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


def write_kvc(target: int | _HasFileno, spec: KvcSpec, payload: Buffer) -> int:
    """Write a complete file at offset 0 of ``target``; returns its size in bytes.

    The payload goes from the caller's buffer to the file in chunks, each one
    checksummed just before it is written (so it is read from memory once and
    never concatenated into a new buffer); the header, which carries that
    checksum, is written last. The caller owns durability (fdatasync).
    """
    fd = _fd_of(target)
    view = _payload_view(payload)
    offset = spec.payload_offset()
    crc = 0
    for start in range(0, len(view), IO_CHUNK):
        chunk = view[start : start + IO_CHUNK]
        crc = crc32c(chunk, crc)
        _pwrite_all(fd, chunk, offset + start)
    prefix = encode_prefix(spec, len(view), crc)
    if len(prefix) != offset:  # pragma: no cover - encode_prefix and payload_offset agree
        raise AssertionError("prefix length differs from payload offset")
    _pwrite_all(fd, memoryview(prefix), 0)
    return offset + len(view)


# -- parsing ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Header:
    version: int
    reason: SaveReason
    n_tokens: int
    hit_count: int
    context_size: int
    created_ns: int
    last_used_ns: int
    payload_offset: int
    payload_len: int
    tlv_len: int
    tlv_crc: int
    payload_crc: int

    @property
    def file_size(self) -> int:
        return self.payload_offset + self.payload_len


def _decode_header(head: bytes | bytearray | memoryview) -> _Header:
    if len(head) < HEADER_LEN:
        raise KvcCorrupt("truncated", f"{len(head)} bytes, shorter than the header")
    fields = HEADER.unpack_from(head)
    magic, version, reason, reserved = fields[:4]
    if magic != MAGIC:
        raise KvcCorrupt("magic", "not a .kvc file")
    if version not in _VERSIONS:
        raise KvcCorrupt(
            "version", f"format version {version}, expected one of {sorted(_VERSIONS)}"
        )
    if crc32c(memoryview(head)[:_HEADER_CRC_SPAN]) != fields[-1]:
        raise KvcCorrupt("header_crc", "header checksum mismatch")
    # Past the checksum these can only fail for a file we did not write.
    if reserved != 0 or reason not in SaveReason._value2member_map_:
        raise KvcCorrupt("field", "bad reason or reserved byte")
    # Fields 4..13 are _Header's in order; the last one is the header CRC.
    hdr = _Header(version, SaveReason(reason), *fields[4:-1])
    if not 1 <= hdr.n_tokens <= MAX_TOKENS or hdr.tlv_len > MAX_TLV:
        raise KvcCorrupt("field", "token count or TLV length out of range")
    if hdr.payload_len > MAX_PAYLOAD:
        raise KvcCorrupt("field", "payload length out of range")
    if hdr.payload_offset != _align(HEADER_LEN + hdr.tlv_len):
        raise KvcCorrupt("field", "payload offset does not follow the TLV")
    return hdr


def _utf8(tag: _Tag, value: bytes, limit: int) -> str:
    if len(value) > limit:
        raise KvcCorrupt("tlv", f"{tag.name.lower()} is {len(value)} bytes, limit {limit}")
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise KvcCorrupt("tlv", f"{tag.name.lower()} is not UTF-8") from None


def _decode_meta(
    hdr: _Header,
    head: bytes | memoryview,
    region: bytes | memoryview,
    file_size: int,
    expected_key: bytes | None,
) -> KvcMeta:
    """Validate the TLV region (``[72, payload_offset)``) and build the meta."""
    if file_size != hdr.file_size:
        kind = "truncated" if file_size < hdr.file_size else "length"
        raise KvcCorrupt(kind, f"file is {file_size} bytes, header says {hdr.file_size}")
    if len(region) != hdr.payload_offset - HEADER_LEN:
        raise KvcCorrupt("truncated", "TLV region is short")
    if crc32c(region) != hdr.tlv_crc:
        raise KvcCorrupt("tlv_crc", "TLV checksum mismatch")
    view = memoryview(region)
    # Counted in C: any() over a memoryview walks the padding (up to 4 KiB)
    # one Python int at a time, ~30 us of every fresh read.
    padding = bytes(view[hdr.tlv_len :])
    if padding.count(0) != len(padding):
        raise KvcCorrupt("tlv", "non-zero padding before the payload")
    values: dict[_Tag, bytes] = {}
    pos = 0
    # A version 2 file carries the logits record after the required ones.
    tags = _REQUIRED_TAGS if hdr.version == FORMAT_VERSION_NO_LOGITS else tuple(_Tag)
    for tag in tags:
        if pos + _TLV_RECORD.size > hdr.tlv_len:
            raise KvcCorrupt("tlv", f"missing {tag.name.lower()}")
        got, length = _TLV_RECORD.unpack_from(view, pos)
        pos += _TLV_RECORD.size
        if got != tag:
            raise KvcCorrupt("tlv", f"tag {got} where {tag.name.lower()} was expected")
        if length > hdr.tlv_len - pos:
            raise KvcCorrupt("tlv", f"{tag.name.lower()} runs past the TLV region")
        values[tag] = bytes(view[pos : pos + length])
        pos += length
    if pos != hdr.tlv_len:
        raise KvcCorrupt("tlv", "trailing bytes after the last TLV record")
    mode_byte, quant = values[_Tag.MODE], values[_Tag.QUANT]
    if len(mode_byte) != 1 or mode_byte[0] not in _MODES_BY_BYTE or len(quant) != 1:
        raise KvcCorrupt("tlv", "bad fingerprint mode or quant byte")
    tokens = values[_Tag.TOKENS]
    if len(tokens) != hdr.n_tokens * TOKEN_BYTES:
        raise KvcCorrupt("tlv", "token ids disagree with the header's token count")
    try:
        namespace = Namespace(
            fingerprint=values[_Tag.FINGERPRINT], quant=quant[0], ctx_hash=values[_Tag.CTX_HASH]
        )
    except InvalidCacheValue as exc:
        raise KvcCorrupt("tlv", str(exc)) from None
    logits = _decode_logits(values.get(_Tag.LOGITS), hdr.n_tokens)
    key = namespace.key(tokens)
    if expected_key is not None and key != expected_key:
        raise KvcCorrupt("key_mismatch", "file holds a different key", key=key.hex())
    return KvcMeta(
        key=key,
        namespace=namespace,
        mode=_MODES_BY_BYTE[mode_byte[0]],
        reason=hdr.reason,
        reason_detail=_utf8(_Tag.REASON_DETAIL, values[_Tag.REASON_DETAIL], MAX_REASON_DETAIL),
        tokens=tokens,
        n_tokens=hdr.n_tokens,
        hit_count=hdr.hit_count,
        context_size=hdr.context_size,
        created_ns=hdr.created_ns,
        last_used_ns=hdr.last_used_ns,
        payload_offset=hdr.payload_offset,
        payload_len=hdr.payload_len,
        payload_crc32c=hdr.payload_crc,
        file_size=file_size,
        hostname=_utf8(_Tag.HOSTNAME, values[_Tag.HOSTNAME], MAX_HOSTNAME),
        llamad_version=_utf8(_Tag.VERSION, values[_Tag.VERSION], MAX_VERSION),
        prefix=bytes(head) + bytes(region),
        logits=logits,
    )


def _decode_logits(value: bytes | None, n_tokens: int) -> KvcLogits | None:
    if value is None:
        return None
    if len(value) < _LOGITS_HEAD.size:
        raise KvcCorrupt("tlv", "logits record is shorter than its position and count")
    position, count = _LOGITS_HEAD.unpack_from(value)
    if not 1 <= count <= MAX_LOGITS or len(value) != _LOGITS_HEAD.size + 4 * count:
        raise KvcCorrupt("tlv", "logits count disagrees with the record's length")
    if position >= n_tokens:
        raise KvcCorrupt("tlv", f"logits of position {position}, the row has {n_tokens} tokens")
    return KvcLogits(position, value[_LOGITS_HEAD.size :])


def _meta_from_buffer(data: Buffer, expected_key: bytes | None) -> tuple[KvcMeta, memoryview]:
    view = _payload_view(data)
    hdr = _decode_header(view[:HEADER_LEN])
    if len(view) < hdr.payload_offset:
        raise KvcCorrupt("truncated", f"{len(view)} bytes, shorter than header and TLV")
    meta = _decode_meta(
        hdr, view[:HEADER_LEN], view[HEADER_LEN : hdr.payload_offset], len(view), expected_key
    )
    return meta, view[hdr.payload_offset :]


def _pread_exact(fd: int, n: int, offset: int) -> bytes:
    data = os.pread(fd, n, offset)
    while len(data) < n:
        more = os.pread(fd, n - len(data), offset + len(data))
        if not more:
            break
        data += more
    return data


def read_meta(fd: int, *, expected_key: bytes | None = None) -> KvcMeta:
    """Validate header and TLV of an open file (no payload checksum)."""
    size = os.fstat(fd).st_size
    head = _pread_exact(fd, HEADER_LEN, 0)
    hdr = _decode_header(head)
    if size < hdr.payload_offset:
        raise KvcCorrupt("truncated", f"file is {size} bytes, shorter than header and TLV")
    region = _pread_exact(fd, hdr.payload_offset - HEADER_LEN, HEADER_LEN)
    return _decode_meta(hdr, head, region, size, expected_key)


def parse_meta(
    data_or_path: Buffer | str | os.PathLike[str], *, expected_key: bytes | None = None
) -> KvcMeta:
    """Validate everything except the payload checksum (the fast path for scans).

    Accepts a whole file's bytes or a path. Recomputes the key from the TLV and,
    when ``expected_key`` is given, requires it to match. Raises
    :class:`KvcCorrupt` for anything else.
    """
    if isinstance(data_or_path, str | os.PathLike):
        fd = os.open(data_or_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return read_meta(fd, expected_key=expected_key)
        finally:
            os.close(fd)
    return _meta_from_buffer(data_or_path, expected_key)[0]


def parse(data: Buffer, *, expected_key: bytes | None = None) -> tuple[KvcMeta, memoryview]:
    """Fully validate a file held in memory; returns the meta and a view of the payload."""
    meta, payload = _meta_from_buffer(data, expected_key)
    if crc32c(payload) != meta.payload_crc32c:
        raise KvcCorrupt("payload_crc", "payload checksum mismatch")
    return meta, payload


def read_payload_into(fd: int, meta: KvcMeta, buffer: Buffer) -> int:
    """Read the payload of a validated file into ``buffer`` and check its CRC.

    Plain ``preadv`` into the caller's memory (no mmap, so a file truncated
    underneath cannot fault the reader), checksumming each chunk while it is
    still in cache; a large payload is read in two halves at once, the second
    on a helper thread (:func:`~llamad.cache.checksum.crc32c_halves`: a 47 MB
    row from /dev/shm took ~9 ms on one thread, the copy alone ~7). Returns
    the payload length; raises :class:`KvcCorrupt` on a short read or checksum
    mismatch, after zeroing what it had copied.
    """
    view = _payload_view(buffer)
    n = meta.payload_len
    if len(view) < n:
        raise InvalidCacheValue("buffer", f"{len(view)} bytes, payload needs {n}")

    def read_part(part: memoryview, start: int) -> int:
        crc = 0
        done = 0
        while done < len(part):
            chunk = part[done : done + IO_CHUNK]
            got = os.preadv(fd, [chunk], meta.payload_offset + start + done)
            if got <= 0:
                raise KvcCorrupt("truncated", f"payload ends after {start + done} bytes")
            crc = crc32c(chunk[:got], crc)
            done += got
        return crc

    with view[:n] as payload:
        try:
            crc = crc32c_halves(payload, read_part)
        except KvcCorrupt:
            _scrub(view, n)
            raise
    if crc != meta.payload_crc32c:
        _scrub(view, n)
        raise KvcCorrupt("payload_crc", "payload checksum mismatch")
    return n


def _scrub(view: memoryview, n: int) -> None:
    # A caller that ignores the exception must still not find a corrupt
    # state in its buffer: zero whatever was copied in.
    view[:n] = bytes(n)


def check_prefix_unchanged(file_bytes: Buffer, meta: KvcMeta) -> None:
    """Re-check a whole file held in memory against ``meta``, which it was validated as.

    Everything a fresh :func:`parse_meta` checks, without parsing again: the
    size, the header on its own terms (magic, version, header CRC, ranges),
    and every byte of ``[0, payload_offset)`` equal to the validated
    :attr:`KvcMeta.prefix` except the hit count and last-used time (and the
    header CRC over them), which cache-meta rewrites in place. Equal bytes
    pass every TLV, padding and key check the validated ones passed, so this
    costs one header decode and one ``memcmp``. For a ``ram`` segment kept
    mapped between loads: damage to it shows through the mapping. The payload
    checksum is the caller's (it is computed while copying).
    """
    with _payload_view(file_bytes) as view:
        size = len(view)
        # A copy (a C memcpy) compares at memcmp speed; comparing the view
        # itself would go through the generic buffer comparison, ~30x slower.
        now = bytearray(view[: min(size, meta.payload_offset)])
    if size != meta.file_size:
        kind = "truncated" if size < meta.file_size else "length"
        raise KvcCorrupt(kind, f"{size} bytes, the validated file is {meta.file_size}")
    _decode_header(now)
    for start, stop in _STATS_SPANS:
        now[start:stop] = meta.prefix[start:stop]
    if now != meta.prefix:
        reason = "field" if now[:HEADER_LEN] != meta.prefix[:HEADER_LEN] else "tlv"
        raise KvcCorrupt(reason, "header, TLV or padding differ from the validated file")


def copy_payload_into(file_bytes: Buffer, meta: KvcMeta, buffer: Buffer) -> int:
    """Copy the payload out of a whole file held in memory, validating all of it.

    For a ``ram`` row mapped from shared memory, validated as ``meta`` when it
    was mapped: the prefix is re-checked first (:func:`check_prefix_unchanged`,
    so damage there is refused before a byte reaches ``buffer``), then each
    payload chunk is checksummed and copied while it is still in cache.
    Returns the payload length; raises :class:`KvcCorrupt` on any mismatch
    (after zeroing what it had copied, when the payload checksum is what failed).
    """
    src = _payload_view(file_bytes)
    dst = _payload_view(buffer)
    try:
        if len(dst) < meta.payload_len:
            raise InvalidCacheValue("buffer", f"{len(dst)} bytes, payload needs {meta.payload_len}")
        check_prefix_unchanged(src, meta)
        base = meta.payload_offset

        def copy_part(part: memoryview, start: int) -> int:
            crc = 0
            for at in range(0, len(part), IO_CHUNK):
                stop = min(len(part), at + IO_CHUNK)
                # Released at once: a view left alive (even in a traceback)
                # would keep the caller's mapping from being closed.
                with src[base + start + at : base + start + stop] as chunk:
                    crc = crc32c(chunk, crc)
                    part[at:stop] = chunk
            return crc

        # Two halves at once for a large row (crc32c_halves), as a file's read.
        with dst[: meta.payload_len] as payload:
            crc = crc32c_halves(payload, copy_part)
        if crc != meta.payload_crc32c:
            _scrub(dst, meta.payload_len)
            raise KvcCorrupt("payload_crc", "payload checksum mismatch")
        return meta.payload_len
    finally:
        src.release()


def update_stats(fd: int, *, hit_count: int, last_used_ns: int) -> None:
    """Persist a row's hit count and last-used time by rewriting its header.

    Only cache-meta calls this, and only on rows nobody has pinned, so no
    reader sees the 72-byte rewrite half done; the header sits in one sector,
    which storage writes atomically.
    """
    _uint("hit_count", hit_count, 32)
    _uint("last_used_ns", last_used_ns, 64)
    head = _pread_exact(fd, HEADER_LEN, 0)
    _decode_header(head)
    fields = list(HEADER.unpack(head))
    fields[5] = hit_count
    fields[8] = last_used_ns
    _pwrite_all(fd, memoryview(_seal_header(HEADER.pack(*fields))), 0)


def file_name(key: bytes) -> str:
    """``<64 hex digits>.kvc``: the published name of a key."""
    if len(key) != 32:
        raise InvalidCacheValue("key", f"expected 32 bytes, got {len(key)}")
    return key.hex() + SUFFIX
