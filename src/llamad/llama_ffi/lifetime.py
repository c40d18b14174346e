"""Reference-counted ownership of one native pointer.

A :class:`NativeHandle` holds a pointer plus a count of users. The owner's own
reference is dropped by :meth:`NativeHandle.close`; every dependant (a context
of a model, a sampler that captured its vocabulary) and every in-flight call
takes a lease first. The pointer is freed exactly once, when the last lease is
returned after close — so closing a model that still has live contexts defers
the free to the last context, and a call racing a close either completes
against a live pointer or raises :class:`~llamad.llama_ffi.errors.Closed`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from llamad.llama_ffi.errors import Closed

__all__ = ["NativeHandle"]


class NativeHandle:
    """A native pointer freed by ``free`` once closed and no longer leased."""

    __slots__ = ("_closed", "_free", "_lock", "_ptr", "_refs", "what")

    def __init__(self, ptr: Any, free: Callable[[Any], None], what: str) -> None:
        self._ptr = ptr
        self._free = free
        self._refs = 1  # the owner's reference, returned by close()
        self._closed = False
        self._lock = threading.Lock()
        self.what = what

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called (the pointer may still be leased)."""
        return self._closed

    @property
    def ptr(self) -> Any:
        """The raw pointer, for a caller that already holds a lease or a lock
        that excludes close (None once freed)."""
        return self._ptr

    @property
    def freed(self) -> bool:
        return self._ptr is None

    @property
    def leases(self) -> int:
        """Outstanding leases, not counting the owner's own reference."""
        with self._lock:
            return self._refs - (0 if self._closed else 1)

    def acquire(self) -> Any:
        """Take a lease and return the pointer; raises :class:`Closed` after close."""
        with self._lock:
            if self._closed:
                raise Closed(f"{self.what} is closed")
            self._refs += 1
            return self._ptr

    def release(self) -> None:
        """Return a lease; frees the pointer if it was the last one after close."""
        with self._lock:
            self._refs -= 1
            if self._refs > 0:
                return
            ptr, self._ptr = self._ptr, None
        if ptr is not None:
            self._free(ptr)

    def close(self) -> bool:
        """Drop the owner's reference. Returns True if the pointer was freed now,
        False if the free is deferred to the last lease (or already happened)."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        self.release()
        return self._ptr is None

    @contextmanager
    def lease(self) -> Iterator[Any]:
        """``with handle.lease() as ptr:`` for the duration of one native call."""
        ptr = self.acquire()
        try:
            yield ptr
        finally:
            self.release()
