"""A GGUF file's header and tensor table read in Python, as ggml's reader reads them.

The root and the front check every model file a config names or a load
request brings (:func:`llamad.llama_ffi.gguf_check.check_gguf`) and never
load a model; reading the header through ggml (``gguf_init_from_file``) would
map libllama and libggml into each of them for good, several MB resident
(SPEC P9). This module reads the same bytes with the same rules as the pinned
``ggml/src/gguf.cpp`` (``gguf_init_from_reader`` with ``no_alloc`` and no
``ggml_context``): a file ggml accepts is accepted here with the same data
offset and tensor extents, and a file ggml refuses is refused
(tests/unit/llama_ffi/test_gguf_reader.py holds the two equal, file by file,
and every ggml type's size with ``ggml_type_size``/``ggml_blck_size``).

Format, little-endian throughout: ``GGUF``, version (u32), tensor count and
key/value count (i64 each); each key/value a string key (u64 length + bytes),
a type (i32) and its value (an array: element type i32, count u64, elements);
each tensor a string name, its dimension count (u32), dimensions (i64 each),
its ggml type (i32) and its offset in the data section (u64); then padding to
``general.alignment`` (default 32) and the data section.

Hostile files: nothing is allocated or looped over on a count or length the
file says without first checking that the bytes it implies are there (what a
count of N entries needs at the least is checked before the first entry is
read), so a corrupt header costs at most a read of the file's own bytes. The
file is read with ``pread`` through a small window, never mapped: a file cut
short while it is read is a refusal, not a SIGBUS.
"""

from __future__ import annotations

import enum
import os
import struct
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Final

Scalar = int | float | bool | str

__all__ = [
    "DEFAULT_ALIGNMENT",
    "GGML_TYPE_COUNT",
    "GGML_TYPE_TRAITS",
    "GGUF_MAGIC",
    "MAX_KEY_LENGTH",
    "GGUFCorrupt",
    "GGUFLayout",
    "GGUFType",
    "Scalar",
    "TensorInfo",
    "read_gguf",
]

GGUF_MAGIC: Final = b"GGUF"
GGUF_VERSION: Final = 3
"""The newest version the pinned ggml reads (``GGUF_VERSION``); 2 is read too."""
DEFAULT_ALIGNMENT: Final = 32
"""``GGUF_DEFAULT_ALIGNMENT``: the data section's alignment without ``general.alignment``."""
ALIGNMENT_KEY: Final = b"general.alignment"

# gguf.cpp's limits (GGUF_MAX_STRING_LENGTH, GGUF_MAX_ARRAY_ELEMENTS) and
# ggml.h's (GGML_MAX_DIMS, GGML_MAX_NAME).
MAX_STRING_LENGTH: Final = 1024 * 1024 * 1024
MAX_ARRAY_ELEMENTS: Final = 1024 * 1024 * 1024
MAX_DIMS: Final = 4
MAX_NAME: Final = 64
MAX_KEY_LENGTH: Final = 64 * 1024
"""Ours, stricter than ggml's 1 GiB: keys are held to find duplicates, and no
writer makes a key of more than a few dozen bytes."""

_INT64_MAX: Final = (1 << 63) - 1
_SIZE_MAX: Final = (1 << 64) - 1
# The fewest bytes an entry can take, so a count the rest of the file cannot
# hold is refused before a single entry is read. A key/value: key length (8),
# a non-empty key (1), type (4), the smallest value (1: u8, i8, bool). A
# tensor: name length (8), dimension count (4), type (4), offset (8).
_MIN_KV_BYTES: Final = 8 + 1 + 4 + 1
_MIN_TENSOR_BYTES: Final = 8 + 4 + 4 + 8
_WINDOW: Final = 256 * 1024


class GGUFType(enum.IntEnum):
    """A metadata value's type (``gguf_type``)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


_VALUE_SIZE: Final[Mapping[int, int]] = {
    GGUFType.UINT8: 1,
    GGUFType.INT8: 1,
    GGUFType.UINT16: 2,
    GGUFType.INT16: 2,
    GGUFType.UINT32: 4,
    GGUFType.INT32: 4,
    GGUFType.FLOAT32: 4,
    GGUFType.BOOL: 1,
    GGUFType.UINT64: 8,
    GGUFType.INT64: 8,
    GGUFType.FLOAT64: 8,
}

GGML_TYPE_COUNT: Final = 43
"""``GGML_TYPE_COUNT`` at the pinned commit: a tensor type at or past it is refused."""

GGML_TYPE_TRAITS: Final[tuple[tuple[int, int], ...]] = (
    (1, 4),  # 0 F32
    (1, 2),  # 1 F16
    (32, 18),  # 2 Q4_0
    (32, 20),  # 3 Q4_1
    (0, 0),  # 4 (Q4_2, removed)
    (0, 0),  # 5 (Q4_3, removed)
    (32, 22),  # 6 Q5_0
    (32, 24),  # 7 Q5_1
    (32, 34),  # 8 Q8_0
    (32, 36),  # 9 Q8_1
    (256, 84),  # 10 Q2_K
    (256, 110),  # 11 Q3_K
    (256, 144),  # 12 Q4_K
    (256, 176),  # 13 Q5_K
    (256, 210),  # 14 Q6_K
    (256, 292),  # 15 Q8_K
    (256, 66),  # 16 IQ2_XXS
    (256, 74),  # 17 IQ2_XS
    (256, 98),  # 18 IQ3_XXS
    (256, 50),  # 19 IQ1_S
    (32, 18),  # 20 IQ4_NL
    (256, 110),  # 21 IQ3_S
    (256, 82),  # 22 IQ2_S
    (256, 136),  # 23 IQ4_XS
    (1, 1),  # 24 I8
    (1, 2),  # 25 I16
    (1, 4),  # 26 I32
    (1, 8),  # 27 I64
    (1, 8),  # 28 F64
    (256, 56),  # 29 IQ1_M
    (1, 2),  # 30 BF16
    (0, 0),  # 31 (Q4_0_4_4, removed)
    (0, 0),  # 32 (Q4_0_4_8, removed)
    (0, 0),  # 33 (Q4_0_8_8, removed)
    (256, 54),  # 34 TQ1_0
    (256, 66),  # 35 TQ2_0
    (0, 0),  # 36 (IQ4_NL_4_4, removed)
    (0, 0),  # 37 (IQ4_NL_4_8, removed)
    (0, 0),  # 38 (IQ4_NL_8_8, removed)
    (32, 17),  # 39 MXFP4
    (64, 36),  # 40 NVFP4
    (128, 18),  # 41 Q1_0
    (64, 18),  # 42 Q2_0
)
"""``(ggml_blck_size, ggml_type_size)`` of each ``ggml_type``: elements per
block and bytes per block (0, 0 for a number whose type was removed)."""

_SCALAR_FORMS: Final[Mapping[int, struct.Struct]] = {
    GGUFType.UINT8: struct.Struct("<B"),
    GGUFType.INT8: struct.Struct("<b"),
    GGUFType.UINT16: struct.Struct("<H"),
    GGUFType.INT16: struct.Struct("<h"),
    GGUFType.UINT32: struct.Struct("<I"),
    GGUFType.INT32: struct.Struct("<i"),
    GGUFType.FLOAT32: struct.Struct("<f"),
    GGUFType.BOOL: struct.Struct("<?"),
    GGUFType.UINT64: struct.Struct("<Q"),
    GGUFType.INT64: struct.Struct("<q"),
    GGUFType.FLOAT64: struct.Struct("<d"),
}
_U32: Final = struct.Struct("<I")
_I32: Final = struct.Struct("<i")
_U64: Final = struct.Struct("<Q")
_I64: Final = struct.Struct("<q")


class GGUFCorrupt(Exception):
    """The file is not a GGUF file ggml would read: cut short, or a field out
    of range. The message says which."""


@dataclass(frozen=True)
class TensorInfo:
    """One entry of the tensor table. ``nbytes`` is ``ggml_nbytes`` (what
    ``gguf_get_tensor_size`` answers), ``offset`` is from the data section."""

    name: bytes
    dims: tuple[int, ...]
    ggml_type: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class GGUFLayout:
    """What :func:`read_gguf` found.

    ``key_types``: each key asked for, its ``gguf_type`` (``ARRAY`` for an
    array; -1 when absent), found as ``gguf_find_key`` finds it.
    ``data_end``: where the last tensor's bytes end (the data offset when
    there are none). ``tensors``: the table, when asked for. ``values``: every
    scalar key's value (arrays left out; keys and strings decoded as UTF-8,
    bad bytes replaced), when asked for.
    """

    version: int
    n_tensors: int
    n_kv: int
    alignment: int
    data_offset: int
    data_end: int
    key_types: Mapping[bytes, int]
    tensors: tuple[TensorInfo, ...] | None
    values: Mapping[str, Scalar] | None = None


class _Source:
    """A file's bytes read forward as ggml's reader does: ``size`` is fixed
    when the file is opened, and a read past it fails."""

    def __init__(self, fd: int, size: int, at: int) -> None:
        self._fd = fd
        self.size = size
        self.at = at
        self._window = b""
        self._window_at = at

    def remain(self) -> int:
        return max(0, self.size - self.at)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.at:
            raise GGUFCorrupt(
                f"{what} at offset {self.at} needs {n} bytes, the file has {self.remain()} left"
            )

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.at += n

    def _view(self, n: int, what: str) -> int:
        """Where ``n`` bytes at the cursor start in the window (read if needed)."""
        self.need(n, what)
        start = self.at - self._window_at
        if start < 0 or start + n > len(self._window):
            self._window = os.pread(self._fd, max(n, _WINDOW), self.at)
            self._window_at = self.at
            start = 0
            if len(self._window) < n:  # the file shrank since it was opened
                raise GGUFCorrupt(f"{what} at offset {self.at}: the file ends early")
        self.at += n
        return start

    def unpack(self, form: struct.Struct, what: str) -> int:
        return int(self.scalar(form, what))

    def scalar(self, form: struct.Struct, what: str) -> Scalar:
        start = self._view(form.size, what)
        (value,) = form.unpack_from(self._window, start)
        return value  # type: ignore[no-any-return]

    def take(self, n: int, what: str) -> bytes:
        start = self._view(n, what)
        return self._window[start : start + n]

    def string_length(self, what: str) -> int:
        n = self.unpack(_U64, what)
        if n > MAX_STRING_LENGTH:
            raise GGUFCorrupt(f"{what}: string length {n} exceeds {MAX_STRING_LENGTH}")
        self.need(n, what)
        return n

    def skip_strings(self, count: int, what: str) -> None:
        # A vocabulary is tens of thousands of strings: the loop works on the
        # window directly rather than through a method call per field.
        u64 = _U64.unpack_from
        for _ in range(count):
            start = self.at - self._window_at
            # (The window may hold bytes past `size` if the file grew: those
            # are not the file ggml would read.)
            if start < 0 or start + 8 > len(self._window) or self.at + 8 > self.size:
                n = self.string_length(what)
            else:
                (n,) = u64(self._window, start)
                self.at += 8
                if n > MAX_STRING_LENGTH:
                    raise GGUFCorrupt(f"{what}: string length {n} exceeds {MAX_STRING_LENGTH}")
            self.skip(n, what)


def _pad(x: int, n: int) -> int:
    return (x + n - 1) & ~(n - 1)


def _read_kv(
    src: _Source, n_kv: int, wanted: Collection[bytes], values: dict[str, Scalar] | None
) -> tuple[dict[bytes, int], int]:
    """The key/value section: the type of each wanted key, and the alignment;
    every scalar key's value into ``values`` when it is given."""
    seen: set[bytes] = set()
    found: dict[bytes, int] = {}
    alignment: tuple[int, int] | None = None  # (type, value) of the first general.alignment
    for i in range(n_kv):
        what = f"key {i}"
        length = src.string_length(what)
        if length == 0:
            raise GGUFCorrupt(f"{what} is empty")
        if length > MAX_KEY_LENGTH:
            raise GGUFCorrupt(f"{what} is {length} bytes long, more than {MAX_KEY_LENGTH}")
        key = src.take(length, what)
        if key in seen:
            raise GGUFCorrupt(f"duplicate key {key!r}")
        seen.add(key)
        kind = src.unpack(_I32, f"{what}'s type")
        is_array = kind == GGUFType.ARRAY
        count = 1
        if is_array:
            kind = src.unpack(_I32, f"{what}'s array type")
            count = src.unpack(_U64, f"{what}'s array length")
        what = f"the value of {key!r}"
        size = _VALUE_SIZE.get(kind)
        value: int | None = None
        if kind == GGUFType.STRING:
            if is_array:
                if count > MAX_ARRAY_ELEMENTS or count * 8 > src.remain():
                    raise GGUFCorrupt(f"{what}: {count} strings cannot fit")
                src.skip_strings(count, what)
            elif values is not None:
                text = src.take(src.string_length(what), what)
                values[key.decode("utf-8", "replace")] = text.decode("utf-8", "replace")
            else:
                src.skip(src.string_length(what), what)
        elif size is None:
            raise GGUFCorrupt(f"key {key!r} has invalid GGUF type {kind}")
        elif is_array:
            if count > MAX_ARRAY_ELEMENTS or count * size > src.remain():
                raise GGUFCorrupt(f"{what}: {count} elements cannot fit")
            src.skip(count * size, what)
        elif values is not None:
            scalar = src.scalar(_SCALAR_FORMS[kind], what)
            values[key.decode("utf-8", "replace")] = scalar
            if kind == GGUFType.UINT32:
                value = int(scalar)
        elif kind == GGUFType.UINT32:
            value = src.unpack(_U32, what)
        else:
            src.skip(size, what)
        # gguf_find_key compares C strings: a key is what precedes its first NUL,
        # and the first key that matches is the one found.
        name = key.split(b"\0", 1)[0]
        kv_type = int(GGUFType.ARRAY) if is_array else kind
        if name in wanted and name not in found:
            found[name] = kv_type
        if name == ALIGNMENT_KEY and alignment is None:
            alignment = (kv_type, value if value is not None else 0)
    align = DEFAULT_ALIGNMENT
    if alignment is not None:
        kv_type, value = alignment
        if kv_type != GGUFType.UINT32:
            raise GGUFCorrupt(f"general.alignment has GGUF type {kv_type}, not u32")
        align = value
    if align == 0 or align & (align - 1):
        raise GGUFCorrupt(f"alignment {align} is not a power of 2")
    return found, align


def _nbytes(ne: list[int], blck: int, type_size: int) -> int:
    """``ggml_nbytes`` of a contiguous tensor, in size_t arithmetic (wrapping
    as ggml's does, so a hostile shape gives the same answer)."""
    if any(n <= 0 for n in ne):
        return 0
    nb = [type_size, (type_size * (ne[0] // blck)) & _SIZE_MAX]
    nb.append((nb[1] * ne[1]) & _SIZE_MAX)
    nb.append((nb[2] * ne[2]) & _SIZE_MAX)
    if blck == 1:
        total = type_size
        for i in range(MAX_DIMS):
            total += (ne[i] - 1) * nb[i]
    else:
        total = ((ne[0] * nb[0]) & _SIZE_MAX) // blck
        for i in range(1, MAX_DIMS):
            total += (ne[i] - 1) * nb[i]
    return total & _SIZE_MAX


def _read_tensor(src: _Source, i: int, names: set[bytes]) -> TensorInfo:
    what = f"tensor {i}"
    length = src.string_length(f"{what}'s name")
    if length >= MAX_NAME:
        raise GGUFCorrupt(f"{what}'s name is {length} bytes long, at most {MAX_NAME - 1}")
    name = src.take(length, f"{what}'s name")
    if name in names:
        raise GGUFCorrupt(f"duplicate tensor name {name!r}")
    names.add(name)
    what = f"tensor {name!r}"
    n_dims = src.unpack(_U32, f"{what}'s dimension count")
    if n_dims > MAX_DIMS:
        raise GGUFCorrupt(f"{what} has {n_dims} dimensions, more than {MAX_DIMS}")
    ne = [src.unpack(_I64, f"{what}'s dimensions") for _ in range(n_dims)]
    ne += [1] * (MAX_DIMS - n_dims)
    if any(n < 0 for n in ne):
        raise GGUFCorrupt(f"{what} has a negative dimension: {ne}")
    elements = ne[0]
    for n in ne[1:]:
        if n > 1 and _INT64_MAX // n < elements:
            raise GGUFCorrupt(f"{what}'s shape {ne} has more than INT64_MAX elements")
        elements *= n
    ggml_type = src.unpack(_I32, f"{what}'s type")
    if not 0 <= ggml_type < GGML_TYPE_COUNT:
        raise GGUFCorrupt(f"{what} has invalid ggml type {ggml_type}")
    blck, type_size = GGML_TYPE_TRAITS[ggml_type]
    if blck == 0 or ne[0] % blck:
        raise GGUFCorrupt(
            f"{what} of type {ggml_type} has {ne[0]} elements per row, not a multiple of {blck}"
        )
    if elements // blck > _SIZE_MAX // type_size:
        raise GGUFCorrupt(f"{what}'s size in bytes overflows size_t")
    offset = src.unpack(_U64, f"{what}'s offset")
    return TensorInfo(name, tuple(ne[:n_dims]), ggml_type, offset, _nbytes(ne, blck, type_size))


def read_gguf(
    fd: int,
    size: int,
    *,
    keys: Collection[bytes] = (),
    tensors: bool = False,
    values: bool = False,
) -> GGUFLayout:
    """Read the GGUF header of the file open at ``fd`` (``size`` bytes long;
    its magic is checked here too); raise :class:`GGUFCorrupt` where ggml's
    reader would refuse it.

    ``keys``: metadata keys (no NUL) whose types to report. ``tensors``:
    keep the tensor table (a checker needs only its extent). ``values``:
    keep the scalar keys' values. ``OSError`` from reading the file is the
    caller's.
    """
    src = _Source(fd, size, 0)
    magic = src.take(4, "the magic")
    if magic != GGUF_MAGIC:
        raise GGUFCorrupt(f"magic {magic!r} is not {GGUF_MAGIC!r}")
    version = src.unpack(_U32, "the version")
    # ggml refuses 0, 1 (GGUFv1), a version whose low 16 bits are 0 (the
    # other byte order) and anything newer than it knows: 2 and 3 are left.
    if version not in (2, GGUF_VERSION):
        raise GGUFCorrupt(f"GGUF version {version} is not one this llama.cpp reads (2, 3)")
    n_tensors = src.unpack(_I64, "the tensor count")
    n_kv = src.unpack(_I64, "the key/value count")
    if n_tensors < 0 or n_kv < 0:
        raise GGUFCorrupt(f"negative counts: {n_tensors} tensors, {n_kv} key/values")
    least = n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES
    if least > src.remain():
        raise GGUFCorrupt(
            f"{n_kv} key/values and {n_tensors} tensors need at least {least} bytes, "
            f"the file has {src.remain()} left"
        )
    found: dict[str, Scalar] | None = {} if values else None
    key_types, alignment = _read_kv(src, n_kv, frozenset(keys), found)
    names: set[bytes] = set()
    table: list[TensorInfo] = []
    size_so_far = 0  # the data section's size, padded, as ggml sums it
    data_end_rel = 0
    for i in range(n_tensors):
        info = _read_tensor(src, i, names)
        if tensors:
            table.append(info)
        # ggml checks offsets and sizes once the whole table is read (and the
        # data offset before them); checking each entry as it comes refuses
        # the same files without holding the table. Only the message can
        # differ: it names the first problem met in this order.
        if info.offset != size_so_far:
            raise GGUFCorrupt(
                f"tensor {info.name!r} has offset {info.offset}, expected {size_so_far}"
            )
        if info.nbytes > _SIZE_MAX - (alignment - 1):
            raise GGUFCorrupt(f"tensor {info.name!r}'s size {info.nbytes} overflows when padded")
        padded = _pad(info.nbytes, alignment)
        if _SIZE_MAX - size_so_far < padded:
            raise GGUFCorrupt(f"the data section's size overflows at tensor {info.name!r}")
        size_so_far += padded
        data_end_rel = max(data_end_rel, info.offset + info.nbytes)
    data_offset = src.at
    if n_tensors > 0:
        data_offset = _pad(src.at, alignment)
        if data_offset > size:
            raise GGUFCorrupt(
                f"the data section would start at {data_offset}, past the end ({size})"
            )
    return GGUFLayout(
        version=version,
        n_tensors=n_tensors,
        n_kv=n_kv,
        alignment=alignment,
        data_offset=data_offset,
        data_end=data_offset + data_end_rel,
        key_types={key: key_types.get(key, -1) for key in keys},
        tensors=tuple(table) if tensors else None,
        values=found,
    )
