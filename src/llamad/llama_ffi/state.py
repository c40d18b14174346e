"""Reusable, pre-faulted memory for packed KV states (SPEC L7, L12).

Copying a 2048-token state into freshly allocated memory spends most of its
time in page faults. A :class:`StateBuffer` maps its memory once, touches
every page up front, and is reused for every pack/unpack afterwards, so a
state copy costs only the copy. :func:`prefault` does the same for memory
someone else allocated (a shared-memory segment, an mmap of a file).
"""

from __future__ import annotations

import mmap
from typing import Any

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import Closed
from llamad.llama_ffi.native import ffi, lib

__all__ = ["PAGE_SIZE", "StateBuffer", "prefault", "readable_view", "writable_view"]

PAGE_SIZE = mmap.PAGESIZE


def prefault(buf: Any) -> None:
    """Map every page of the writable buffer ``buf`` now (contents kept).

    Not for memory another process writes concurrently: each page is read and
    written back.
    """
    try:
        view = ffi.from_buffer("uint8_t[]", buf, require_writable=True)
    except (TypeError, BufferError) as exc:
        raise BadRequest(f"prefault needs a writable buffer: {exc}") from None
    lib.llamad_prefault(view, len(view), PAGE_SIZE)


def _round_up(n: int) -> int:
    return max(PAGE_SIZE, -(-n // PAGE_SIZE) * PAGE_SIZE)


class StateBuffer:
    """An anonymous, pre-faulted mapping of at least ``capacity`` bytes.

    Pass it (or :attr:`memory`) to ``Context.pack_seq`` / ``unpack_seq``.
    :meth:`ensure` grows it (a new mapping, pre-faulted again) only when a
    larger state arrives, so steady-state use never faults.
    """

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise BadRequest(f"capacity must be a positive integer, not {capacity!r}")
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        size = _round_up(capacity)
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
        populate = getattr(mmap, "MAP_POPULATE", 0)
        new = mmap.mmap(-1, size, flags=flags | populate)
        # MAP_POPULATE maps pages readable; writing one byte per page also
        # breaks the shared zero page so the first pack does not fault.
        lib.llamad_prefault(ffi.from_buffer("uint8_t[]", new), size, PAGE_SIZE)
        self.close()
        self._map = new
        self._view = memoryview(new)

    @property
    def capacity(self) -> int:
        return 0 if self._map is None else len(self._map)

    @property
    def memory(self) -> memoryview:
        """A writable view of the whole mapping."""
        if self._view is None:
            raise Closed("state buffer is closed")
        return self._view

    def view(self, nbytes: int) -> memoryview:
        """The first ``nbytes`` bytes (e.g. the part a pack filled)."""
        if not 0 <= nbytes <= self.capacity:
            raise BadRequest(f"{nbytes} bytes is outside [0, {self.capacity}]")
        return self.memory[:nbytes]

    def ensure(self, capacity: int) -> None:
        """Grow to hold ``capacity`` bytes (contents are not preserved)."""
        if capacity > self.capacity:
            self._allocate(max(capacity, self.capacity * 2))

    def close(self) -> None:
        """Unmap; every view handed out must have been released first."""
        try:
            if self._view is not None:
                self._view.release()
                self._view = None
            if self._map is not None:
                self._map.close()
                self._map = None
        except BufferError:
            raise BadRequest(
                "state buffer still has views in use; release them before closing or growing"
            ) from None

    def __enter__(self) -> StateBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def writable_view(buf: Any) -> Any:
    """A ``uint8_t[]`` over writable memory (any buffer or a StateBuffer), no copy."""
    if isinstance(buf, StateBuffer):
        buf = buf.memory
    try:
        return ffi.from_buffer("uint8_t[]", buf, require_writable=True)
    except (TypeError, BufferError) as exc:
        raise BadRequest(f"pack_seq needs a writable buffer: {exc}") from None


def readable_view(buf: Any) -> Any:
    """A ``uint8_t[]`` over any buffer (or a StateBuffer), read in place."""
    if isinstance(buf, StateBuffer):
        buf = buf.memory
    try:
        return ffi.from_buffer("uint8_t[]", buf)
    except (TypeError, BufferError) as exc:
        raise BadRequest(f"unpack_seq needs a buffer: {exc}") from None
