"""The ``remote`` tier's pure parts (issue 20, SPEC C12): config, names, manifest, chunks.

The remote tier is a Redis server several daemons share. Nothing here talks
to it (that is :mod:`llamad.cache.remote_store`, which alone imports the
``redis`` package): this module decides what a row looks like there, so unit
tests check it without a server.

**Names.** A row's bytes are stored under its cache key, the 32-byte
``sha256(namespace || tokens)`` of :mod:`llamad.cache.key`, whose namespace
folds the model's fingerprint, the tenant's ``cache_salt`` (SPEC M17) and the
libllama build (C12) in: another tenant's or another build's prompt has
another key, so it is another Redis key. A reader checks it again on the
bytes (the ``.kvc`` TLV recomputes the key, and the namespace must be the
reader's), as every local tier does.

- ``<prefix>:row:<key hex>``: the row's **manifest** (:class:`Manifest`, 76
  bytes): total size, chunk count, CRC32C of the whole ``.kvc`` file, the
  key again and a random write id.
- ``<prefix>:chunk:<key hex>:<write id hex>:<i>``: the ``.kvc`` file's bytes,
  cut at ``chunk_bytes`` (Redis refuses a bulk string over 512 MB; 64 MiB by
  default keeps every command small).
- ``<prefix>:ledger``, ``<prefix>:sizes``, ``<prefix>:bytes``: llamad's own
  byte accounting of the tier (a sorted set by last use, each row's size and
  chunk names, the total), shared by every daemon writing there.

A writer stores the chunks and then the manifest in one ``MULTI``, so a
reader that finds a manifest finds a complete row or (its chunks evicted
by Redis since) a counted miss, never half of one.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Final

import msgspec

from llamad.cache.checksum import crc32c
from llamad.cache.errors import InvalidCacheValue
from llamad.cache.key import KEY_LEN

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_REMOTE_QUOTA",
    "MAX_CHUNK_BYTES",
    "Manifest",
    "RemoteConfig",
    "RemoteDamaged",
    "assemble",
    "candidate_lengths",
    "chunk_name",
    "row_name",
    "split",
]

MIB: Final = 1 << 20
DEFAULT_CHUNK_BYTES: Final = 64 * MIB
MAX_CHUNK_BYTES: Final = 512 * MIB - 1
"""Redis's ``proto-max-bulk-len`` default is 512 MB: no value may be longer."""
DEFAULT_REMOTE_QUOTA: Final = 16 << 30

_PREFIX: Final = re.compile(r"[A-Za-z0-9_.:-]{1,64}")
_URL: Final = re.compile(r"(redis|rediss|unix)://\S+")


class RemoteConfig(msgspec.Struct, frozen=True, kw_only=True):
    """How a daemon uses the shared ``remote`` tier (``[cache.remote]``; off without ``url``).

    ``quota``: bytes llamad's own ledger lets every daemon writing under
    ``prefix`` keep there together (the Redis server's ``maxmemory`` with
    ``allkeys-lru`` is the operator's second bound). ``timeout_ms``: the
    most a lookup waits for Redis to say whether it holds a row;
    ``fetch_timeout_ms``: the most each read of a row it holds may take
    (a row of a 2,048-token prompt is ~47 MB). ``min_tokens``: only rows at
    least this long are written there (shorter ones are cheaper to prefill
    than to fetch over a network). ``retry_min_ms`` / ``retry_max_ms``: after
    a failure the tier is skipped for a backoff that doubles from the first
    to the second, then tried again by one operation.
    """

    url: str
    prefix: str = "llamad:kvc:v1"
    quota: int = DEFAULT_REMOTE_QUOTA
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    timeout_ms: int = 50
    fetch_timeout_ms: int = 1000
    min_tokens: int = 1024
    retry_min_ms: int = 250
    retry_max_ms: int = 10_000
    queue: int = 8

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not _URL.fullmatch(self.url):
            raise InvalidCacheValue("remote.url", f"{self.url!r} is not a redis:// URL")
        if not isinstance(self.prefix, str) or not _PREFIX.fullmatch(self.prefix):
            raise InvalidCacheValue("remote.prefix", f"{self.prefix!r}: [A-Za-z0-9_.:-]{{1,64}}")
        for name, lo, hi in (
            ("quota", 0, 1 << 62),
            ("chunk_bytes", 4096, MAX_CHUNK_BYTES),
            ("timeout_ms", 1, 60_000),
            ("fetch_timeout_ms", 1, 600_000),
            ("min_tokens", 1, 1 << 31),
            ("retry_min_ms", 1, 3_600_000),
            ("retry_max_ms", 1, 3_600_000),
            ("queue", 1, 1024),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise InvalidCacheValue(f"remote.{name}", f"{value!r} is not in [{lo}, {hi}]")
        if self.retry_max_ms < self.retry_min_ms:
            raise InvalidCacheValue("remote.retry_max_ms", "must be >= retry_min_ms")


class RemoteDamaged(Exception):
    """A row read from the remote tier is not what its manifest or key says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def row_name(prefix: str, key: bytes) -> bytes:
    """The Redis key of a row's manifest."""
    return f"{prefix}:row:{key.hex()}".encode()


def chunk_name(prefix: str, key: bytes, write_id: bytes, index: int) -> bytes:
    """The Redis key of one chunk of one write of a row."""
    return f"{prefix}:chunk:{key.hex()}:{write_id.hex()}:{index}".encode()


_MANIFEST: Final = struct.Struct("<8sHHQII32s16s")
_MAGIC: Final = b"LLKVMANI"
_VERSION: Final = 1
WRITE_ID_LEN: Final = 16


@dataclass(frozen=True, slots=True)
class Manifest:
    """What the row's Redis key holds: how to put its ``.kvc`` bytes back together."""

    size: int
    n_chunks: int
    crc: int
    key: bytes
    write_id: bytes

    def encode(self) -> bytes:
        return _MANIFEST.pack(
            _MAGIC, _VERSION, 0, self.size, self.n_chunks, self.crc, self.key, self.write_id
        )

    @classmethod
    def decode(cls, data: bytes, key: bytes) -> Manifest:
        """The manifest in ``data``, stored under ``key``'s name; else :class:`RemoteDamaged`."""
        if len(data) != _MANIFEST.size:
            raise RemoteDamaged("manifest_size")
        magic, version, _, size, n_chunks, crc, stored_key, write_id = _MANIFEST.unpack(data)
        if magic != _MAGIC or version != _VERSION:
            raise RemoteDamaged("manifest_magic")
        if stored_key != key:
            raise RemoteDamaged("manifest_key")
        if size <= 0 or n_chunks <= 0 or n_chunks > size:
            raise RemoteDamaged("manifest_range")
        return cls(size, n_chunks, crc, stored_key, write_id)

    def chunk_names(self, prefix: str) -> list[bytes]:
        return [chunk_name(prefix, self.key, self.write_id, i) for i in range(self.n_chunks)]


def split(
    data: bytes | memoryview, key: bytes, write_id: bytes, chunk_bytes: int
) -> tuple[Manifest, list[memoryview]]:
    """A row's ``.kvc`` bytes as a manifest and its chunks (views into ``data``)."""
    if len(key) != KEY_LEN or len(write_id) != WRITE_ID_LEN:
        raise InvalidCacheValue("key", "a row key is 32 bytes, a write id 16")
    if chunk_bytes < 1 or not data:
        raise InvalidCacheValue("chunk_bytes", "need a positive chunk size and some bytes")
    view = memoryview(data).cast("B")
    chunks = [view[i : i + chunk_bytes] for i in range(0, len(view), chunk_bytes)]
    return Manifest(len(view), len(chunks), crc32c(view), key, write_id), chunks


def assemble(manifest: Manifest, chunks: list[bytes | None]) -> bytes:
    """The row's bytes from its chunks as read back. A missing chunk (Redis
    evicted it) raises :class:`LookupError`; a wrong size or checksum,
    :class:`RemoteDamaged`."""
    if len(chunks) != manifest.n_chunks:
        raise RemoteDamaged("chunk_count")
    if any(c is None for c in chunks):
        raise LookupError("a chunk of the row is gone")
    data = b"".join(c for c in chunks if c is not None)
    if len(data) != manifest.size:
        raise RemoteDamaged("size")
    if crc32c(data) != manifest.crc:
        raise RemoteDamaged("crc")
    return data


def candidate_lengths(n_tokens: int, covered: int, align: int, *, at_least: int) -> list[int]:
    """Prompt lengths whose rows a remote lookup asks for, longest first.

    A remote lookup is by exact key, so it can only ask for prefixes whose
    length it can name: the whole prompt (a row saved by ``prefill_only``,
    an evict or a shutdown save of exactly it) and the cold-save boundaries
    below it (multiples of the policy's ``boundary_align_tokens``, where
    every cold save and most prefixes of a shared system prompt land). At
    most four boundaries, only longer than what the local tiers cover and
    at least ``at_least`` (shorter rows are never written there).
    """
    if align < 1:
        raise InvalidCacheValue("align", "must be >= 1")
    out = [n_tokens] if n_tokens > covered and n_tokens >= at_least else []
    top = (n_tokens - 1) // align * align
    for length in range(top, 0, -align):
        if length <= covered or length < at_least or len(out) >= 5:
            break
        out.append(length)
    return out
