"""The Python GGUF reader accepts and refuses the files ggml's reader does, with
the same layout (:mod:`llamad.llama_ffi.gguf_reader`).

Every case is read twice: by ``gguf_init_from_file`` (the pinned ggml, kept
bound for this test) and by :func:`read_gguf`; the outcomes must be equal:
both refuse, or both accept with the same version, counts, alignment, data
offset, tensor table (name, type, offset, size) and key types. The files are
the default model, a small file with every value type, that file cut short at
every offset, and that file with fields overwritten by hostile values
(counts, lengths, types, dimensions, alignment) at every field position.
"""

from __future__ import annotations

import os
import struct
import tracemalloc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llamad import paths
from llamad.llama_ffi import ModelFileError, TruncatedGGUF, check_gguf, native
from llamad.llama_ffi.gguf_reader import GGML_TYPE_TRAITS, GGUFCorrupt, GGUFType, read_gguf
from llamad.llama_ffi.native import ffi, lib

pytestmark = pytest.mark.timeout(120)

Outcome = tuple[Any, ...] | None


@pytest.fixture(autouse=True)
def _ggml_quiet() -> Iterator[None]:
    """ggml logs why it refuses each of thousands of files: not worth a log line each."""
    native.ensure_logs()
    chosen = native._chosen_level
    native.set_log_level("off")
    yield
    native._chosen_level = chosen
    lib.llamad_log_install(native._level_from_env() if chosen is None else chosen)


def ggml_outcome(path: Path) -> Outcome:
    """What ggml's reader makes of ``path`` (None: it refuses it)."""
    params = ffi.new("struct gguf_init_params *")
    params.no_alloc = True
    params.ctx = ffi.NULL
    ctx = lib.gguf_init_from_file(os.fsencode(path), params[0])
    if ctx == ffi.NULL:
        return None
    try:
        n_kv = int(lib.gguf_get_n_kv(ctx))
        keys = [ffi.string(lib.gguf_get_key(ctx, i)) for i in range(n_kv)]
        key_types = {
            key: int(lib.gguf_get_kv_type(ctx, lib.gguf_find_key(ctx, key))) for key in keys
        }
        key_types[b"no.such.key"] = int(lib.gguf_find_key(ctx, b"no.such.key"))
        tensors = tuple(
            (
                ffi.string(lib.gguf_get_tensor_name(ctx, i)),
                int(lib.gguf_get_tensor_type(ctx, i)),
                int(lib.gguf_get_tensor_offset(ctx, i)),
                int(lib.gguf_get_tensor_size(ctx, i)),
            )
            for i in range(int(lib.gguf_get_n_tensors(ctx)))
        )
        return (
            int(lib.gguf_get_version(ctx)),
            n_kv,
            int(lib.gguf_get_alignment(ctx)),
            int(lib.gguf_get_data_offset(ctx)),
            tensors,
            key_types,
        )
    finally:
        lib.gguf_free(ctx)


def python_outcome(path: Path, keys: Sequence[bytes]) -> Outcome:
    """What :func:`read_gguf` makes of ``path``, in :func:`ggml_outcome`'s shape."""
    with open(path, "rb") as fh:
        try:
            layout = read_gguf(
                fh.fileno(),
                os.fstat(fh.fileno()).st_size,
                keys=[*keys, b"no.such.key"],
                tensors=True,
            )
        except GGUFCorrupt:
            return None
    assert layout.tensors is not None
    return (
        layout.version,
        layout.n_kv,
        layout.alignment,
        layout.data_offset,
        tuple((t.name.split(b"\0")[0], t.ggml_type, t.offset, t.nbytes) for t in layout.tensors),
        dict(layout.key_types),
    )


def same_outcome(path: Path) -> tuple[Outcome, Outcome]:
    want = ggml_outcome(path)
    keys = list(want[5]) if want is not None else [b"general.alignment"]
    return want, python_outcome(path, [k for k in keys if k != b"no.such.key"])


# -- writing GGUF files field by field -------------------------------------------------------


def _str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


@dataclass
class KV:
    key: bytes
    kind: int
    payload: bytes  # the value's bytes as the file holds them (after the type)

    def encode(self) -> bytes:
        return _str(self.key) + struct.pack("<i", self.kind) + self.payload


def u32(key: str, v: int) -> KV:
    return KV(key.encode(), GGUFType.UINT32, struct.pack("<I", v))


def text(key: str, v: str) -> KV:
    return KV(key.encode(), GGUFType.STRING, _str(v.encode()))


def array(key: str, item: int, count: int, items: bytes) -> KV:
    return KV(key.encode(), GGUFType.ARRAY, struct.pack("<iQ", item, count) + items)


@dataclass
class Tensor:
    name: bytes
    dims: tuple[int, ...]
    ggml_type: int
    offset: int

    def encode(self) -> bytes:
        return (
            _str(self.name)
            + struct.pack("<I", len(self.dims))
            + b"".join(struct.pack("<q", d) for d in self.dims)
            + struct.pack("<iQ", self.ggml_type, self.offset)
        )


def gguf_bytes(
    kvs: Sequence[KV],
    tensors: Sequence[Tensor],
    *,
    version: int = 3,
    alignment: int = 32,
    data: int | None = None,
    counts: tuple[int, int] | None = None,
) -> bytes:
    """A GGUF file: header, key/values, tensor table, padding to ``alignment``
    and ``data`` bytes of tensor data (default: what the table says)."""
    n_tensors, n_kv = counts if counts is not None else (len(tensors), len(kvs))
    head = b"GGUF" + struct.pack("<Iqq", version, n_tensors, n_kv)
    body = head + b"".join(kv.encode() for kv in kvs) + b"".join(t.encode() for t in tensors)
    if tensors:
        body += b"\0" * (-len(body) % alignment)
    return body + b"\x5a" * (data if data is not None else _data_size(tensors, alignment))


def _data_size(tensors: Sequence[Tensor], alignment: int) -> int:
    end = 0
    for t in tensors:
        blck, size = GGML_TYPE_TRAITS[t.ggml_type]
        n = 1
        for d in t.dims:
            n *= d
        end = max(end, t.offset + n // max(blck, 1) * size)
    return end


def _tensors_at(
    specs: Sequence[tuple[bytes, tuple[int, ...], int]], alignment: int = 32
) -> list[Tensor]:
    """Tensors laid out one after another, each at its padded offset."""
    out: list[Tensor] = []
    at = 0
    for name, dims, kind in specs:
        out.append(Tensor(name, dims, kind, at))
        blck, size = GGML_TYPE_TRAITS[kind]
        n = 1
        for d in dims:
            n *= d
        at += -(-(n // blck * size) // alignment) * alignment
    return out


EVERY_VALUE = [
    text("general.architecture", "llama"),
    u32("general.alignment", 64),
    KV(b"u8", GGUFType.UINT8, b"\x07"),
    KV(b"i8", GGUFType.INT8, b"\xf9"),
    KV(b"u16", GGUFType.UINT16, struct.pack("<H", 7)),
    KV(b"i16", GGUFType.INT16, struct.pack("<h", -7)),
    KV(b"i32", GGUFType.INT32, struct.pack("<i", -7)),
    KV(b"f32", GGUFType.FLOAT32, struct.pack("<f", 0.5)),
    KV(b"bool", GGUFType.BOOL, b"\x01"),
    KV(b"u64", GGUFType.UINT64, struct.pack("<Q", 7)),
    KV(b"i64", GGUFType.INT64, struct.pack("<q", -7)),
    KV(b"f64", GGUFType.FLOAT64, struct.pack("<d", 0.5)),
    array("tokens", GGUFType.STRING, 3, _str(b"a") + _str(b"") + _str(b"xyz")),
    array("scores", GGUFType.FLOAT32, 3, struct.pack("<3f", 1, 2, 3)),
    array("empty", GGUFType.INT64, 0, b""),
]
SMALL_TENSORS = _tensors_at(
    [
        (b"a", (256,), 0),
        (b"b", (64, 4), 1),
        (b"q", (64, 2), 8),
        (b"k", (256, 1, 2), 12),
        (b"s", (), 0),
    ],
    alignment=64,
)


@pytest.fixture(scope="module")
def small() -> bytes:
    return gguf_bytes(EVERY_VALUE, SMALL_TENSORS, alignment=64)


def _write(tmp_path: Path, data: bytes, name: str = "f.gguf") -> Path:
    """``data`` into ``tmp_path / name``, over what was there. Not
    ``write_bytes``: ext4 flushes a file truncated to 0 when it is closed
    (auto_da_alloc), ~3 ms a file, and these tests write thousands."""
    path = tmp_path / name
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    return path


# -- the cases -------------------------------------------------------------------------------


@pytest.mark.model
def test_the_default_model_reads_the_same() -> None:
    import gguf  # noqa: PLC0415

    path = paths.default_model_path()
    want, got = same_outcome(path)
    assert want is not None and got == want
    # ggml's API gives no dimensions without a ggml context: gguf-py's reader does.
    with open(path, "rb") as fh:
        layout = read_gguf(fh.fileno(), os.fstat(fh.fileno()).st_size, tensors=True)
    assert layout.tensors is not None
    other = gguf.GGUFReader(path)
    assert [(t.name.encode(), tuple(int(d) for d in t.shape)) for t in other.tensors] == [
        (t.name, t.dims) for t in layout.tensors
    ]
    assert check_gguf(path).data_end == layout.data_end <= path.stat().st_size


@pytest.mark.model
def test_the_default_model_cut_inside_its_header_reads_the_same(tmp_path: Path) -> None:
    path = paths.default_model_path()
    with open(path, "rb") as fh:
        layout = read_gguf(fh.fileno(), os.fstat(fh.fileno()).st_size)
        head = fh.read(layout.data_offset + 4096)
    cuts = sorted(
        {*range(0, 64), *range(64, layout.data_offset + 4096, 49999), layout.data_offset - 1}
    )
    for cut in cuts:
        piece = _write(tmp_path, head[:cut])
        want, got = same_outcome(piece)
        assert (cut, got) == (cut, want)
        if cut < layout.data_offset:
            assert want is None
        else:  # the table is whole: check_gguf sees the data is not
            with pytest.raises(TruncatedGGUF):
                check_gguf(piece)


def test_a_file_with_every_value_type_reads_the_same(tmp_path: Path, small: bytes) -> None:
    want, got = same_outcome(_write(tmp_path, small))
    assert want is not None and got == want
    assert want[2] == 64 and len(want[4]) == len(SMALL_TENSORS)


def test_a_file_cut_at_every_offset_reads_the_same(tmp_path: Path, small: bytes) -> None:
    for cut in range(len(small)):
        want, got = same_outcome(_write(tmp_path, small[:cut]))
        assert (cut, got) == (cut, want)


HOSTILE_U64 = [0, 1, 63, 64, 2**31, 2**32 - 1, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]
HOSTILE_U32 = [0, 1, 2, 4, 5, 9, 12, 13, 42, 43, 2**31 - 1, 2**31, 2**32 - 1]


def _overwritten(data: bytes) -> Iterator[tuple[str, bytes]]:
    """``data`` with a hostile value written at every offset of its header:
    each 8-byte value over every aligned-or-not position, each 4-byte value too."""
    header_end = len(data) - _data_size(SMALL_TENSORS, 64)
    for at in range(4, header_end - 3):
        for v in HOSTILE_U32:
            yield f"u32 {v} at {at}", data[:at] + struct.pack("<I", v) + data[at + 4 :]
        if at + 8 <= header_end:
            for v in HOSTILE_U64:
                yield f"u64 {v} at {at}", data[:at] + struct.pack("<Q", v) + data[at + 8 :]


def test_hostile_values_in_every_field_read_the_same(tmp_path: Path, small: bytes) -> None:
    seen = {True: 0, False: 0}
    for label, data in _overwritten(small):
        want, got = same_outcome(_write(tmp_path, data))
        assert (label, got) == (label, want)
        seen[want is None] += 1
    # Both kinds of outcome were met many times: the fields were hit.
    assert seen[True] > 1000 and seen[False] > 100, seen


def _case(tmp_path: Path, data: bytes) -> Outcome:
    want, got = same_outcome(_write(tmp_path, data))
    assert got == want
    return want


ONE = _tensors_at([(b"w", (64, 2), 0)])


@pytest.mark.parametrize(
    ("label", "data", "accepted"),
    [
        ("no tensors, no padding", gguf_bytes([text("k", "v")], []), True),
        ("no tensors, no keys", gguf_bytes([], []), True),
        ("version 2", gguf_bytes([], ONE, version=2), True),
        ("version 1", gguf_bytes([], ONE, version=1), False),
        ("version 4", gguf_bytes([], ONE, version=4), False),
        ("other byte order", gguf_bytes([], ONE, version=0x03000000), False),
        ("empty key", gguf_bytes([KV(b"", GGUFType.UINT8, b"\0")], ONE), False),
        ("duplicate key", gguf_bytes([text("k", "a"), text("k", "b")], ONE), False),
        (
            "keys equal up to a NUL",
            gguf_bytes([text("k", "a"), KV(b"k\0x", GGUFType.UINT8, b"\0")], ONE),
            True,
        ),
        ("unknown value type 13", gguf_bytes([KV(b"k", 13, b"\0" * 8)], ONE), False),
        ("negative value type", gguf_bytes([KV(b"k", -1, b"\0" * 8)], ONE), False),
        ("array of arrays", gguf_bytes([array("k", GGUFType.ARRAY, 0, b"")], ONE), False),
        ("alignment 64", gguf_bytes([u32("general.alignment", 64)], ONE, alignment=64), True),
        ("alignment 1", gguf_bytes([u32("general.alignment", 1)], ONE, alignment=1), True),
        ("alignment 0", gguf_bytes([u32("general.alignment", 0)], ONE), False),
        ("alignment 48", gguf_bytes([u32("general.alignment", 48)], ONE, alignment=48), False),
        (
            "alignment as u64",
            gguf_bytes([KV(b"general.alignment", GGUFType.UINT64, struct.pack("<Q", 32))], ONE),
            False,
        ),
        (
            "alignment as an array",
            gguf_bytes(
                [array("general.alignment", GGUFType.UINT32, 1, struct.pack("<I", 32))], ONE
            ),
            False,
        ),
        (
            "alignment behind a NUL",
            gguf_bytes(
                [KV(b"general.alignment\0x", GGUFType.UINT32, struct.pack("<I", 64))],
                ONE,
                alignment=64,
            ),
            True,
        ),
        ("tensor type 4 (removed)", gguf_bytes([], [Tensor(b"w", (64,), 4, 0)], data=64), False),
        ("tensor type 43", gguf_bytes([], [Tensor(b"w", (64,), 43, 0)], data=64), False),
        ("tensor type -1", gguf_bytes([], [Tensor(b"w", (64,), -1, 0)], data=64), False),
        ("row not a whole block", gguf_bytes([], [Tensor(b"w", (48,), 8, 0)], data=64), False),
        ("five dimensions", gguf_bytes([], [Tensor(b"w", (1, 1, 1, 1, 1), 0, 0)], data=64), False),
        ("negative dimension", gguf_bytes([], [Tensor(b"w", (-1,), 0, 0)], data=64), False),
        ("zero dimension", gguf_bytes([], [Tensor(b"w", (0, 4), 0, 0)], data=0), True),
        (
            "elements overflow int64",
            gguf_bytes([], [Tensor(b"w", (2**32, 2**32), 0, 0)], data=0),
            False,
        ),
        ("bytes overflow size_t", gguf_bytes([], [Tensor(b"w", (2**62,), 0, 0)], data=0), False),
        ("name of 63 bytes", gguf_bytes([], [Tensor(b"n" * 63, (8,), 0, 0)]), True),
        ("name of 64 bytes", gguf_bytes([], [Tensor(b"n" * 64, (8,), 0, 0)]), False),
        (
            "duplicate tensor",
            gguf_bytes([], [Tensor(b"w", (8,), 0, 0), Tensor(b"w", (8,), 0, 32)]),
            False,
        ),
        ("offset not where expected", gguf_bytes([], [Tensor(b"w", (8,), 0, 32)]), False),
        (
            "overlapping offsets",
            gguf_bytes([], [Tensor(b"a", (64,), 0, 0), Tensor(b"b", (8,), 0, 32)]),
            False,
        ),
        ("tensor count too large", gguf_bytes([], ONE, counts=(2**40, 0)), False),
        ("tensor count negative", gguf_bytes([], ONE, counts=(-1, 0)), False),
        ("key count too large", gguf_bytes([text("k", "v")], [], counts=(0, 2**62)), False),
        (
            "string longer than the file",
            gguf_bytes([KV(b"k", GGUFType.STRING, struct.pack("<Q", 2**40))], []),
            False,
        ),
        (
            "string of 2^63",
            gguf_bytes([KV(b"k", GGUFType.STRING, struct.pack("<Q", 2**63))], []),
            False,
        ),
        (
            "array longer than the file",
            gguf_bytes([array("k", GGUFType.UINT8, 2**40, b"")], []),
            False,
        ),
        (
            "string array longer than the file",
            gguf_bytes([array("k", GGUFType.STRING, 2**30, b"")], []),
            False,
        ),
        ("data cut short", gguf_bytes([], ONE, data=10), True),
    ],
)
def test_named_cases_read_the_same(tmp_path: Path, label: str, data: bytes, accepted: bool) -> None:
    assert (_case(tmp_path, data) is not None) == accepted, label


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("a string of 1 GiB + 1", KV(b"k", GGUFType.STRING, struct.pack("<Q", 2**30 + 1))),
        ("an array of 2^30 + 1 strings", array("k", GGUFType.STRING, 2**30 + 1, b"")),
        ("an array of 2^30 + 1 bytes", array("k", GGUFType.UINT8, 2**30 + 1, b"")),
    ],
)
def test_ggmls_length_limits_hold_where_the_file_is_long_enough(
    tmp_path: Path, label: str, value: KV
) -> None:
    # A sparse file of 9 GiB of zeros after the header: long enough for
    # each value, so only gguf.cpp's limits (GGUF_MAX_STRING_LENGTH,
    # GGUF_MAX_ARRAY_ELEMENTS) refuse it. Without them the reader would
    # accept the string, or walk a billion empty strings.
    path = _write(tmp_path, gguf_bytes([value], []), "sparse.gguf")
    os.truncate(path, 9 << 30)
    want, got = same_outcome(path)
    assert (label, want, got) == (label, None, None)


def test_check_gguf_refuses_what_ggml_refuses_as_truncated(tmp_path: Path) -> None:
    path = _write(tmp_path, gguf_bytes([], [Tensor(b"w", (64,), 43, 0)], data=64))
    with pytest.raises(TruncatedGGUF) as err:
        check_gguf(path)
    assert "invalid ggml type 43" in err.value.details["problem"]
    short = _write(tmp_path, gguf_bytes([], ONE, data=10), "short.gguf")
    with pytest.raises(TruncatedGGUF) as err:
        check_gguf(short)
    assert err.value.details["needed"] > err.value.details["size"]


def test_check_gguf_reports_key_types_as_ggml_finds_them(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        gguf_bytes(
            [
                text("general.type", "adapter"),
                KV(b"adapter.type\0x", GGUFType.UINT32, b"\0" * 4),
                array("adapter.type", GGUFType.UINT8, 0, b""),
                array("tokens", GGUFType.STRING, 0, b""),
            ],
            ONE,
        ),
    )
    info = check_gguf(path, keys=["general.type", "adapter.type", "tokens", "absent"])
    # adapter.type: the first key whose C string matches is the u32 one.
    assert dict(info.key_types) == {
        "general.type": GGUFType.STRING,
        "adapter.type": GGUFType.UINT32,
        "tokens": GGUFType.ARRAY,
        "absent": -1,
    }


def test_a_hostile_header_allocates_no_more_than_the_window(tmp_path: Path) -> None:
    # Lengths and counts the file cannot hold are refused before anything is
    # allocated for them; what is read goes through a 256 KiB window.
    cases = [
        gguf_bytes([KV(b"k", GGUFType.STRING, struct.pack("<Q", 2**40))], [], data=2**20),
        gguf_bytes([array("k", GGUFType.STRING, 2**30, b"")], [], data=2**20),
        gguf_bytes([], [], counts=(2**60, 2**60), data=2**20),
        # Ours, stricter than ggml (which reads keys up to 1 GiB): no key
        # over 64 KiB is held to look for its duplicate.
        gguf_bytes([KV(b"k" * 2**20, GGUFType.UINT8, b"\0")], []),
    ]
    for i, data in enumerate(cases):
        path = _write(tmp_path, data, f"{i}.gguf")
        with open(path, "rb") as fh:
            tracemalloc.start()
            try:
                with pytest.raises(GGUFCorrupt):
                    read_gguf(fh.fileno(), len(data))
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
        assert peak < 2**20, (i, peak)


def test_a_file_that_shrinks_while_read_is_refused_not_a_crash(
    tmp_path: Path, small: bytes
) -> None:
    path = _write(tmp_path, small)
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        os.truncate(path, 40)
        with pytest.raises(GGUFCorrupt, match="ends early"):
            read_gguf(fh.fileno(), size)


def test_an_unreadable_file_is_model_file_error(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError):
        check_gguf(tmp_path)
