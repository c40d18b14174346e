"""Model file digests behind the ``safe`` and ``gguf_chunked`` fingerprint modes.

The GGUF walk only locates regions (header + metadata + tensor table, then the
first tensor's bytes); it never interprets tensor data, and every length it
reads is checked against the file size so a damaged or hostile file raises
:class:`GgufMalformed` instead of allocating or looping without bound.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO, Final

from llamad.cache.errors import GgufMalformed, InvalidCacheValue

_GGUF_MAGIC: Final = b"GGUF"
_CHUNKED_DOMAIN: Final = b"llamad.gguf_chunked.v1\x00"
_DEFAULT_ALIGNMENT: Final = 32
_READ_CHUNK: Final = 8 << 20
# Fixed sizes of GGUF scalar value types, by type id.
_SCALAR_SIZES: Final = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_T_U32: Final = 4
_T_STRING: Final = 8
_T_ARRAY: Final = 9
_MAX_DIMS: Final = 8


def file_sha256(path: str | os.PathLike[str]) -> bytes:
    """sha256 of a whole file, streamed (the ``safe`` fingerprint)."""
    try:
        import hashlib  # noqa: PLC0415  (libcrypto only where a file is hashed: SPEC P9)

        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").digest()
    except OSError as exc:
        raise InvalidCacheValue("model_path", f"cannot read {os.fspath(path)}: {exc}") from exc


class _Reader:
    """Sequential reads that refuse to run past the end of the file."""

    def __init__(self, f: BinaryIO, size: int) -> None:
        self._f = f
        self.size = size
        self.pos = 0

    def take(self, n: int) -> bytes:
        if n < 0 or n > self.size - self.pos:
            raise GgufMalformed(f"GGUF field at {self.pos} runs past the end of the file")
        data = self._f.read(n)
        if len(data) != n:
            raise GgufMalformed("GGUF file shrank while being read")
        self.pos += n
        return data

    def skip(self, n: int) -> None:
        if n < 0 or n > self.size - self.pos:
            raise GgufMalformed(f"GGUF field at {self.pos} runs past the end of the file")
        self._f.seek(n, os.SEEK_CUR)
        self.pos += n

    def u32(self) -> int:
        value: int = struct.unpack("<I", self.take(4))[0]
        return value

    def u64(self) -> int:
        value: int = struct.unpack("<Q", self.take(8))[0]
        return value

    def string(self) -> bytes:
        return self.take(self.u64())

    def skip_string(self) -> None:
        self.skip(self.u64())


def _skip_value(r: _Reader, vtype: int, key: bytes) -> int | None:
    """Skip one metadata value; returns it when it is a u32 (for alignment)."""
    if vtype == _T_U32:
        return r.u32()
    if vtype in _SCALAR_SIZES:
        r.skip(_SCALAR_SIZES[vtype])
    elif vtype == _T_STRING:
        r.skip_string()
    elif vtype == _T_ARRAY:
        etype = r.u32()
        count = r.u64()
        if etype in _SCALAR_SIZES:
            r.skip(count * _SCALAR_SIZES[etype])
        elif etype == _T_STRING:
            # Each string needs at least its 8-byte length: bound the loop by
            # the bytes left so a huge count cannot spin.
            if count * 8 > r.size - r.pos:
                raise GgufMalformed(f"array {key!r} claims more strings than the file holds")
            for _ in range(count):
                r.skip_string()
        else:
            raise GgufMalformed(f"array {key!r} has unsupported element type {etype}")
    else:
        raise GgufMalformed(f"metadata {key!r} has unknown value type {vtype}")
    return None


def _locate(f: BinaryIO, size: int) -> tuple[int, int, int]:
    """(data section start, first tensor start, first tensor end) in file offsets."""
    r = _Reader(f, size)
    if r.take(4) != _GGUF_MAGIC:
        raise GgufMalformed("not a GGUF file (bad magic)")
    version = r.u32()
    if version not in (2, 3):
        raise GgufMalformed(f"unsupported GGUF version {version}")
    n_tensors = r.u64()
    n_kv = r.u64()
    if n_tensors == 0:
        raise GgufMalformed("GGUF file has no tensors")
    # Smallest possible records: a kv is 8+0+4+1 bytes, a tensor info 8+4+4+8.
    if n_kv * 13 + n_tensors * 24 > size:
        raise GgufMalformed("GGUF counts exceed the file size")
    alignment = _DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = r.string()
        value = _skip_value(r, r.u32(), key)
        if key == b"general.alignment" and value is not None:
            alignment = value
    if alignment <= 0 or alignment & (alignment - 1):
        raise GgufMalformed(f"general.alignment {alignment} is not a power of two")
    offsets: list[int] = []
    for _ in range(n_tensors):
        r.skip_string()
        n_dims = r.u32()
        if n_dims > _MAX_DIMS:
            raise GgufMalformed(f"tensor with {n_dims} dimensions")
        r.skip(8 * n_dims + 4)
        offsets.append(r.u64())
    data_start = -(-r.pos // alignment) * alignment
    ordered = sorted(set(offsets))
    first = data_start + ordered[0]
    end = data_start + ordered[1] if len(ordered) > 1 else size
    if not data_start <= first < end <= size:
        raise GgufMalformed("first tensor lies outside the file")
    return data_start, first, end


def gguf_chunked_sha256(path: str | os.PathLike[str]) -> bytes:
    """sha256 of the GGUF header, metadata and tensor table plus the first tensor.

    Reads a few MB instead of the whole file: it tells models and quantisations
    apart and catches a swapped or truncated file, but not deliberate tampering
    with later tensors.
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            data_start, first, end = _locate(f, size)
            import hashlib  # noqa: PLC0415  (libcrypto only where a file is hashed: SPEC P9)

            h = hashlib.sha256(_CHUNKED_DOMAIN)
            for start, stop in ((0, data_start), (first, end)):
                f.seek(start)
                left = stop - start
                while left:
                    chunk = f.read(min(left, _READ_CHUNK))
                    if not chunk:
                        raise GgufMalformed("GGUF file shrank while being read")
                    h.update(chunk)
                    left -= len(chunk)
            return h.digest()
    except OSError as exc:
        raise InvalidCacheValue("model_path", f"cannot read {os.fspath(path)}: {exc}") from exc
