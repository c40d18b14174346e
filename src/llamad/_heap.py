"""Give the C heap's free pages back to the system (SPEC P9).

glibc's ``free`` returns memory to the kernel only from the top of the heap;
what a model load or a request frees below a live allocation stays resident,
counted in the process's RSS, until ``malloc_trim`` hands those pages back
(it ``madvise``\\ s every free page, wherever it lies). A model worker calls
:func:`release_free_heap` once after its model is loaded and once each time it
has been idle a moment (``llamad.model.worker_proc``): a few ms of work, never
inside a request's tick.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Final

__all__ = ["release_free_heap"]


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        # The process's own symbols, the C library's among them (no search
        # for a file name, which would run ldconfig).
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS): nothing to trim
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


_TRIM: Final = _malloc_trim()


def release_free_heap() -> bool:
    """``malloc_trim(0)``: True when the C library has it (and ran it)."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
