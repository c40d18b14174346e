"""Fault in a read-only mapping's pages without holding the GIL.

``mmap.mmap(..., MAP_POPULATE)`` builds the page tables of the whole mapping
inside the ``mmap`` call, and CPython makes that call holding the GIL: a
47 MB ``ram`` row took ~4 ms, and a probe thread mapping one stopped another
thread of its process for 6.7 ms. A model worker maps a row right after its
writer thread saved it (``Tier.warm``), so its loop could not run for those
milliseconds (``py-spy --gil`` found the writer holding the GIL there).
:func:`populate_read` maps nothing: given a mapping made without
``MAP_POPULATE``, it asks the kernel to fault its pages in
(``madvise(MADV_POPULATE_READ)``, Linux 5.14) through a ctypes call, which
releases the GIL (the probe's stall: 0.2 ms). On an older kernel it reads the
whole mapping through the CRC32C C function, which releases the GIL too.
"""

from __future__ import annotations

import functools
import mmap
from collections.abc import Callable
from typing import Any, Final

from llamad.cache.checksum import crc32c

__all__ = ["MADV_POPULATE_READ", "populate_read", "prepare_populate"]

MADV_POPULATE_READ: Final = 22
"""``<linux/mman.h>``; the :mod:`mmap` module of Python 3.11 has no name for it."""


@functools.cache
def _madvise() -> tuple[Any, Callable[[int, int, int], int]] | None:
    """libc's ``madvise`` through ctypes, whose foreign calls release the GIL,
    and a bare cffi backend ``FFI`` for a mapping's address (ctypes takes no
    address of a read-only buffer); None where there is no ``madvise``.

    Neither parses a C declaration: cffi's ABI mode, which this used before,
    loads pycparser to parse one, ~11 ms and 0.7 MB in the first process that
    mapped a row (a model worker's first restore after a start, SPEC P2)."""
    import ctypes  # noqa: PLC0415

    import _cffi_backend  # noqa: PLC0415

    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):  # pragma: no cover - no C library to open
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return _cffi_backend.FFI(), fn


def prepare_populate() -> bool:
    """Load what :func:`populate_read` calls now (ctypes' handle on libc,
    well under a millisecond), not on the first restore's path; whether
    there is a ``madvise``. A model worker's cache view calls it as it starts."""
    return _madvise() is not None


def populate_read(mapped: mmap.mmap) -> bool:
    """Fault in every page of ``mapped`` (a read-only mapping) with the GIL
    released. True when the kernel populated it (``MADV_POPULATE_READ``);
    False when it read the pages instead (an older kernel, or no libc
    ``madvise``)."""
    size = len(mapped)
    found = _madvise()
    if found is not None:
        ffi, madvise = found
        view = ffi.from_buffer(mapped)
        try:
            if madvise(int(ffi.cast("uintptr_t", view)), size, MADV_POPULATE_READ) == 0:
                return True
        finally:
            ffi.release(view)
    # Reading the pages faults them in; the checksum is thrown away.
    with memoryview(mapped) as view:
        crc32c(view)
    return False
