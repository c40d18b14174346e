"""Check that a path is a complete GGUF file before llama.cpp opens it.

The 4-byte magic is read first, so a file of any other kind is refused
without a byte more of it parsed. The header and tensor table are then read
with ggml's rules (:mod:`llamad.llama_ffi.gguf_reader`, in Python: the root
and the front check files and must not load libllama, SPEC P9) and every
tensor's extent is compared with the file size, so a truncated download is
reported as :class:`TruncatedGGUF` instead of failing (or faulting on an
mmap) deep inside the loader.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import ModelFileError, NotGGUF, TruncatedGGUF
from llamad.llama_ffi.gguf_reader import GGUF_MAGIC, GGUFCorrupt, read_gguf
from llamad.llama_ffi.inputs import c_string, file_path

__all__ = ["GGUF_MAGIC", "GGUFInfo", "check_gguf"]


@dataclass(frozen=True)
class GGUFInfo:
    """What the header check learnt about a file."""

    path: Path
    size: int
    version: int
    n_tensors: int
    data_end: int
    file_identity: tuple[int, int, int, int]
    """``(st_dev, st_ino, st_size, st_mtime_ns)`` of the file that was checked."""
    key_types: Mapping[str, int] = field(default_factory=dict)
    """``gguf_type`` of each key asked for (-1 when absent)."""


def check_gguf(path: str | os.PathLike[str], *, keys: Iterable[str] = ()) -> GGUFInfo:
    """Validate ``path`` as a whole GGUF file; raise a typed error otherwise.

    ``keys`` names metadata keys whose value types the caller wants to know
    (llama.cpp asserts on the type of some keys instead of checking it).
    """
    p = file_path(path)
    wanted = {key: c_string(key, "keys", BadRequest) for key in keys}
    try:
        # One open file for the magic, the size and the header: what is
        # checked is one file even if the path is replaced meanwhile.
        with open(p, "rb") as fh:
            st = os.fstat(fh.fileno())
            magic = fh.read(4)
            if magic != GGUF_MAGIC:
                _refuse_magic(p, magic, st.st_size)
            layout = read_gguf(fh.fileno(), st.st_size, keys=wanted.values())
    except FileNotFoundError:
        raise ModelFileError(f"{p} does not exist", details={"path": str(p)}) from None
    except GGUFCorrupt as exc:
        # The magic matched, so a header that cannot be read is almost
        # always a file cut short inside its metadata.
        raise TruncatedGGUF(
            f"{p}: GGUF header or tensor table is incomplete or corrupt: {exc}",
            details={"path": str(p), "size": st.st_size, "problem": str(exc)},
        ) from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {p}: {exc.strerror}", details={"path": str(p)}) from None
    if layout.data_end > st.st_size:
        raise TruncatedGGUF(
            f"{p} is truncated: tensor data needs {layout.data_end} bytes, file has {st.st_size}",
            details={"path": str(p), "size": st.st_size, "needed": layout.data_end},
        )
    return GGUFInfo(
        path=p,
        size=st.st_size,
        version=layout.version,
        n_tensors=layout.n_tensors,
        data_end=layout.data_end,
        file_identity=(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns),
        key_types={key: layout.key_types[encoded] for key, encoded in wanted.items()},
    )


def _refuse_magic(p: Path, magic: bytes, size: int) -> NoReturn:
    if len(magic) < 4:
        raise TruncatedGGUF(
            f"{p} is {size} bytes, too short for a GGUF header",
            details={"path": str(p), "size": size},
        )
    raise NotGGUF(
        f"{p} is not a GGUF file (magic {magic!r})",
        details={"path": str(p), "magic": magic.hex()},
    )
