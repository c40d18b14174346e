"""Check that a path is a complete GGUF file before llama.cpp opens it.

The 4-byte magic is read in Python, so a file of any other kind is refused
without llama.cpp parsing a byte of it. The header and tensor table are then
read by ggml's own GGUF reader (metadata only, no tensor data) and every
tensor's extent is compared with the file size, so a truncated download is
reported as :class:`TruncatedGGUF` instead of failing (or faulting on an
mmap) deep inside the loader.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import ModelFileError, NotGGUF, TruncatedGGUF
from llamad.llama_ffi.inputs import c_string, file_path
from llamad.llama_ffi.native import ensure_logs, ffi, lib

__all__ = ["GGUF_MAGIC", "GGUFInfo", "check_gguf"]

GGUF_MAGIC = b"GGUF"


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
        with open(p, "rb") as fh:
            st = os.fstat(fh.fileno())
            magic = fh.read(4)
    except FileNotFoundError:
        raise ModelFileError(f"{p} does not exist", details={"path": str(p)}) from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {p}: {exc.strerror}", details={"path": str(p)}) from None
    if magic != GGUF_MAGIC:
        if len(magic) < 4:
            raise TruncatedGGUF(
                f"{p} is {st.st_size} bytes, too short for a GGUF header",
                details={"path": str(p), "size": st.st_size},
            )
        raise NotGGUF(
            f"{p} is not a GGUF file (magic {magic!r})",
            details={"path": str(p), "magic": magic.hex()},
        )

    ensure_logs()  # ggml's reader needs no backend: only its log routed
    params = ffi.new("struct gguf_init_params *")
    params.no_alloc = True
    params.ctx = ffi.NULL
    gctx = lib.gguf_init_from_file(os.fsencode(p), params[0])
    if gctx == ffi.NULL:
        # The magic matched, so a header that cannot be read is almost always
        # a file cut short inside its metadata.
        raise TruncatedGGUF(
            f"{p}: GGUF header or tensor table is incomplete or corrupt",
            details={"path": str(p), "size": st.st_size},
        )
    try:
        data_offset = int(lib.gguf_get_data_offset(gctx))
        n_tensors = int(lib.gguf_get_n_tensors(gctx))
        data_end = data_offset
        for i in range(n_tensors):
            end = data_offset + int(lib.gguf_get_tensor_offset(gctx, i))
            end += int(lib.gguf_get_tensor_size(gctx, i))
            data_end = max(data_end, end)
        version = int(lib.gguf_get_version(gctx))
        key_types: dict[str, int] = {}
        for key, encoded in wanted.items():
            kid = int(lib.gguf_find_key(gctx, encoded))
            key_types[key] = -1 if kid < 0 else int(lib.gguf_get_kv_type(gctx, kid))
    finally:
        lib.gguf_free(gctx)
    if data_end > st.st_size:
        raise TruncatedGGUF(
            f"{p} is truncated: tensor data needs {data_end} bytes, file has {st.st_size}",
            details={"path": str(p), "size": st.st_size, "needed": data_end},
        )
    return GGUFInfo(
        path=p,
        size=st.st_size,
        version=version,
        n_tensors=n_tensors,
        data_end=data_end,
        file_identity=(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns),
        key_types=key_types,
    )
