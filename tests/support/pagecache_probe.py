"""Which pages of a file are in the page cache (mincore(2)), and files whose pages are not."""

from __future__ import annotations

import ctypes
import mmap
import os
from pathlib import Path

import pytest

_libc = ctypes.CDLL(None, use_errno=True)
PAGE = mmap.PAGESIZE


def resident_pages(path: Path, start: int = 0, stop: int | None = None) -> tuple[int, int]:
    """(resident, total) pages of ``path`` in ``[start, stop)``."""
    size = path.stat().st_size
    with path.open("rb") as f:
        # A private writable mapping takes no page until written to, and
        # mincore reports the file's page cache for the pages it maps.
        m = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        anchor = ctypes.c_char.from_buffer(m)
        n = -(-size // PAGE)
        vec = (ctypes.c_ubyte * n)()
        failed = _libc.mincore(
            ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec
        )
        del anchor
        if failed:
            raise OSError(ctypes.get_errno(), "mincore")
    finally:
        m.close()
    first, last = start // PAGE, -(-(size if stop is None else stop) // PAGE)
    return sum(vec[i] & 1 for i in range(first, last)), last - first


def drop_pages(path: Path) -> Path:
    """Take ``path``'s (clean) pages out of the page cache; skip the test where
    its filesystem keeps them (tmpfs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if resident_pages(path)[0]:
        pytest.skip(f"{path.parent} keeps its pages resident (tmpfs?): nothing to prefetch")
    return path


def write_dropped(path: Path, data: bytes) -> Path:
    """``data`` written to a new file, made durable (dirty pages cannot be
    dropped), then dropped from the page cache."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    return drop_pages(path)
