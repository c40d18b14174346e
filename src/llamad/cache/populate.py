"""Fault in a read-only mapping's pages without holding the GIL.

``mmap.mmap(..., MAP_POPULATE)`` builds the page tables of the whole mapping
inside the ``mmap`` call, and CPython makes that call holding the GIL: a
47 MB ``ram`` row took ~4 ms, and a probe thread mapping one stopped another
thread of its process for 6.7 ms. A model worker maps a row right after its
writer thread saved it (``Tier.warm``), so its loop could not run for those
milliseconds (``py-spy --gil`` found the writer holding the GIL there).
:func:`populate_read` maps nothing: given a mapping made without
``MAP_POPULATE``, it asks the kernel to fault its pages in
(``madvise(MADV_POPULATE_READ)``, Linux 5.14) through a cffi call, which
releases the GIL (the probe's stall: 0.2 ms). On an older kernel it reads the
whole mapping through the CRC32C C function, which releases the GIL too.
"""

from __future__ import annotations

import functools
import mmap
from typing import Any, Final

from llamad.cache.checksum import crc32c

__all__ = ["MADV_POPULATE_READ", "populate_read", "prepare_populate"]

MADV_POPULATE_READ: Final = 22
"""``<linux/mman.h>``; the :mod:`mmap` module of Python 3.11 has no name for it."""


@functools.cache
def _madvise() -> tuple[Any, Any] | None:
    """cffi's handle on the C library's ``madvise`` (imported here: only a
    process that maps rows loads cffi for it), None where there is none."""
    import cffi  # noqa: PLC0415

    ffi = cffi.FFI()
    ffi.cdef("int madvise(void *addr, size_t length, int advice);")
    try:
        return ffi, ffi.dlopen(None)
    except OSError:  # pragma: no cover - no C library to open
        return None


def prepare_populate() -> bool:
    """Build the ``madvise`` handle now (~11 ms: cffi parses its cdef with
    pycparser), not at the first :func:`populate_read`, which runs on a
    restore's path; whether there is one. A model worker calls it as it
    starts."""
    return _madvise() is not None


def populate_read(mapped: mmap.mmap) -> bool:
    """Fault in every page of ``mapped`` (a read-only mapping) with the GIL
    released. True when the kernel populated it (``MADV_POPULATE_READ``);
    False when it read the pages instead (an older kernel, or no libc
    ``madvise``)."""
    size = len(mapped)
    found = _madvise()
    if found is not None:
        ffi, libc = found
        addr = ffi.from_buffer(mapped)
        try:
            if libc.madvise(addr, size, MADV_POPULATE_READ) == 0:
                return True
        finally:
            ffi.release(addr)
    # Reading the pages faults them in; the checksum is thrown away.
    with memoryview(mapped) as view:
        crc32c(view)
    return False
