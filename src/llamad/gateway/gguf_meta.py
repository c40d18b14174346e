"""A GGUF file's metadata read in Python, for Ollama's ``/api/show`` (no I/O but the read).

The gateway never loads libllama (its imports are a client's and the HTTP
stack's), so this reads the header itself: the key/value section (scalars
kept, arrays skipped) and the tensor table, whose element counts sum to the
model's parameter count, as llama.cpp's ``llama_model_n_params`` does. The
file is mapped, not read: only the header's pages are touched (a few MB for
a vocabulary of tens of thousands of tokens), and unmapped at once.

Format: ``GGUF``, version (u32, 2 or 3), tensor count (u64), key/value count
(u64); each key/value a string key (u64 length + UTF-8), a type (u32) and its
value; each tensor a string name, its dimension count (u32) and dimensions
(u64 each), its type (u32) and offset (u64). Little-endian throughout.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Final

__all__ = ["FTYPE_NAMES", "GGUFMeta", "human_number", "read_gguf_meta"]

Scalar = int | float | bool | str

_SCALARS: Final[dict[int, struct.Struct]] = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_STRING: Final = 8
_ARRAY: Final = 9
_U32: Final = struct.Struct("<I")
_U64: Final = struct.Struct("<Q")
_HEAD: Final = struct.Struct("<4sIQQ")

FTYPE_NAMES: Final[dict[int, str]] = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    19: "IQ2_XXS",
    20: "IQ2_XS",
    21: "Q2_K_S",
    22: "IQ3_XS",
    23: "IQ3_XXS",
    24: "IQ1_S",
    25: "IQ4_NL",
    26: "IQ3_S",
    27: "IQ3_M",
    28: "IQ2_S",
    29: "IQ2_M",
    30: "IQ4_XS",
    31: "IQ1_M",
    32: "BF16",
    36: "TQ1_0",
    37: "TQ2_0",
    38: "MXFP4_MOE",
    39: "NVFP4",
    40: "Q1_0",
    41: "Q2_0",
}
"""``general.file_type`` (llama.cpp's ``llama_ftype``) as Ollama's ``quantization_level``."""


@dataclass(frozen=True)
class GGUFMeta:
    """``values``: the header's scalar keys (arrays, such as the vocabulary,
    left out); ``parameter_count``: the tensors' elements summed."""

    values: dict[str, Scalar]
    parameter_count: int

    @property
    def family(self) -> str:
        """``general.architecture`` (``llama``, ``qwen2``, ...), Ollama's ``family``."""
        arch = self.values.get("general.architecture")
        return arch if isinstance(arch, str) else ""

    @property
    def parameter_size(self) -> str:
        """The parameter count as Ollama shows it (``135M``, ``1.7B``)."""
        return human_number(self.parameter_count) if self.parameter_count else ""

    @property
    def quantization_level(self) -> str:
        ftype = self.values.get("general.file_type")
        if isinstance(ftype, int) and not isinstance(ftype, bool):
            return FTYPE_NAMES.get(ftype, f"ftype {ftype}")
        return ""


def human_number(n: int) -> str:
    """``n`` as Ollama's ``format.HumanNumber``: ``8B``, ``1.7B``, ``134.52M``, ``12K``."""
    for scale, suffix, decimals in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            number = n / scale
            return (
                f"{number:.0f}{suffix}"
                if number == math.floor(number)
                else (f"{number:.{decimals}f}{suffix}")
            )
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


class _Reader:
    def __init__(self, view: mmap.mmap) -> None:
        self.view = view
        self.at = 0

    def unpack(self, form: struct.Struct) -> tuple[object, ...]:
        out = form.unpack_from(self.view, self.at)
        self.at += form.size
        return out

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.view, self.at)
        self.at += 4
        return int(value)

    def u64(self) -> int:
        (value,) = _U64.unpack_from(self.view, self.at)
        self.at += 8
        return int(value)

    def string(self) -> str:
        n = self.u64()
        if self.at + n > len(self.view):
            raise ValueError("truncated string")
        raw = self.view[self.at : self.at + n]
        self.at += n
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        n = self.u64()  # (not `self.at += self.u64()`: that adds to the old offset)
        self.at += n

    def value(self, kind: int) -> Scalar | None:
        """A value of ``kind`` (None: an array, skipped)."""
        form = _SCALARS.get(kind)
        if form is not None:
            (value,) = self.unpack(form)
            return value  # type: ignore[return-value]
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, n = self.u32(), self.u64()
            if item == _STRING:
                for _ in range(n):
                    self.skip_string()
            elif item in _SCALARS:
                self.at += _SCALARS[item].size * n
            else:  # arrays of arrays: none in llama.cpp's files, read them all the same
                for _ in range(n):
                    self.value(item)
            return None
        raise ValueError(f"unknown GGUF value type {kind}")


def read_gguf_meta(path: str | os.PathLike[str]) -> GGUFMeta:
    """The metadata of the GGUF file at ``path`` (``ValueError``: not a GGUF
    file, or its header is cut short; ``OSError``: not readable)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
        try:
            return _read(_Reader(view))
        except struct.error as exc:
            raise ValueError(f"{path}: the GGUF header is cut short") from exc


def _read(r: _Reader) -> GGUFMeta:
    magic, version, n_tensors, n_kv = r.unpack(_HEAD)
    if magic != b"GGUF" or version not in (2, 3):
        raise ValueError("not a GGUF file (of version 2 or 3)")
    values: dict[str, Scalar] = {}
    for _ in range(int(n_kv)):  # type: ignore[call-overload]
        key = r.string()
        value = r.value(r.u32())
        if value is not None:
            values[key] = value
    count = 0
    for _ in range(int(n_tensors)):  # type: ignore[call-overload]
        r.skip_string()
        dims = [r.u64() for _ in range(r.u32())]
        r.at += 4 + 8  # its type and offset
        count += math.prod(dims)
    if r.at > len(r.view):  # (skipped bytes are not read: check they were there)
        raise ValueError("the GGUF header is cut short")
    return GGUFMeta(values, count)
