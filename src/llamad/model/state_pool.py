"""Pre-faulted buffers for packed KV states, leased and given back (SPEC L7, L12, M5).

A 2,048-token state of the default model is ~47 MB. Packing it into fresh
memory spends most of the time in page faults; a :class:`StatePool` keeps a
few :class:`~llamad.llama_ffi.StateBuffer` mappings (every page touched once)
and leases them out. A :class:`StateLease` is the
:class:`~llamad.model.backend.PackedState` the core hands to the cache: the
writer thread that owns it calls :meth:`StateLease.release` once the bytes
are on their tier, which returns the buffer to the pool. Release is
thread-safe and idempotent; after it the lease's bytes may be overwritten by
the next pack, so :meth:`StateLease.view` refuses.

The pool never blocks: with every buffer leased (a slow writer) it maps a new
one; it keeps at most ``max_idle`` idle buffers, and :meth:`StatePool.trim`
drops them all (an idle worker gives the memory back).

Sizes round up to a quarter power of two (``2**k * {1, 1.25, 1.5, 1.75}``),
so a state that grows by a few tokens reuses its buffer and no buffer wastes
more than a quarter of itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

import structlog

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import Closed
from llamad.llama_ffi.state import PAGE_SIZE, StateBuffer

__all__ = ["StateLease", "StatePool", "size_class"]

log = structlog.get_logger("llamad.model")

DEFAULT_MAX_IDLE: Final = 2


def size_class(nbytes: int) -> int:
    """The capacity a buffer for ``nbytes`` gets: the next ``2**k * (4 + i) / 4``
    (``i`` in 0..3) at or above ``nbytes``, at least one page."""
    if nbytes <= PAGE_SIZE:
        return PAGE_SIZE
    k = (nbytes - 1).bit_length() - 1  # 2**k < nbytes <= 2**(k+1)
    base = 1 << k
    step = max(base // 4, 1)
    return base + -(-(nbytes - base) // step) * step


class StateLease:
    """One leased buffer holding ``nbytes`` of packed state (a ``PackedState``)."""

    def __init__(self, pool: StatePool, buffer: StateBuffer) -> None:
        self._pool = pool
        self._buffer: StateBuffer | None = buffer
        self._nbytes = 0

    @property
    def capacity(self) -> int:
        return self._live().capacity

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def released(self) -> bool:
        return self._buffer is None

    def _live(self) -> StateBuffer:
        buffer = self._buffer
        if buffer is None:
            raise Closed("the state lease was released")
        return buffer

    def writable(self) -> memoryview:
        """The whole buffer, for whoever fills it (a pack, a read from a tier)."""
        return self._live().memory

    def set_nbytes(self, nbytes: int) -> None:
        """Record how many leading bytes the filler wrote."""
        buffer = self._live()
        if isinstance(nbytes, bool) or not isinstance(nbytes, int):
            raise BadRequest(f"nbytes must be an integer, not {nbytes!r}")
        if not 0 <= nbytes <= buffer.capacity:
            raise BadRequest(f"{nbytes} bytes is outside [0, {buffer.capacity}]")
        self._nbytes = nbytes

    def view(self) -> memoryview:
        """The filled bytes, valid until :meth:`release`."""
        return self._live().view(self._nbytes)

    def release(self) -> None:
        """Give the buffer back to the pool (any thread; a second call does nothing)."""
        self._pool._give_back(self)

    def _take_buffer(self) -> StateBuffer | None:
        buffer, self._buffer = self._buffer, None
        return buffer

    def __enter__(self) -> StateLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class StatePool:
    """Leases pre-faulted buffers of at least the size asked for."""

    def __init__(self, *, max_idle: int = DEFAULT_MAX_IDLE) -> None:
        if isinstance(max_idle, bool) or not isinstance(max_idle, int) or max_idle < 0:
            raise BadRequest(f"max_idle must be an integer >= 0, not {max_idle!r}")
        self.max_idle = max_idle
        self._lock = threading.Lock()
        self._idle: list[StateBuffer] = []  # ascending capacity
        self._leased = 0
        self._mapped = 0
        self._closed = False

    @property
    def leased(self) -> int:
        """Leases handed out and not yet released."""
        with self._lock:
            return self._leased

    @property
    def idle(self) -> int:
        with self._lock:
            return len(self._idle)

    @property
    def mapped(self) -> int:
        """Buffers mapped over the pool's life (a new one costs page faults)."""
        with self._lock:
            return self._mapped

    def lease(self, nbytes: int) -> StateLease:
        """A lease on a buffer of at least ``nbytes`` (its ``nbytes`` is 0 until set)."""
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
            raise BadRequest(f"a state buffer needs a positive size, not {nbytes!r}")
        with self._lock:
            if self._closed:
                raise Closed("the state pool is closed")
            for i, buffer in enumerate(self._idle):
                if buffer.capacity >= nbytes:
                    del self._idle[i]
                    self._leased += 1
                    return StateLease(self, buffer)
            self._leased += 1
            self._mapped += 1
        try:
            # Mapped outside the lock: pre-faulting tens of MB takes milliseconds
            # and a writer thread's release must not wait for it.
            buffer = StateBuffer(size_class(nbytes))
        except BaseException:
            with self._lock:
                self._leased -= 1
            raise
        log.debug("model.state_buffer_mapped", capacity=buffer.capacity)
        return StateLease(self, buffer)

    def fill(self, nbytes: int, writer: Callable[[memoryview], int]) -> StateLease:
        """Lease a buffer of ``nbytes``, let ``writer`` fill it (it answers the
        bytes written) and return the lease; released again if ``writer`` fails."""
        lease = self.lease(nbytes)
        try:
            lease.set_nbytes(writer(lease.writable()))
        except BaseException:
            lease.release()
            raise
        return lease

    def _give_back(self, lease: StateLease) -> None:
        with self._lock:
            buffer = lease._take_buffer()
            if buffer is None:
                return
            self._leased -= 1
            if self._closed:
                drop = [buffer]
            else:
                self._idle.append(buffer)
                self._idle.sort(key=lambda b: b.capacity)
                # Keep the largest: a smaller state fits a larger buffer.
                excess = len(self._idle) - self.max_idle
                drop = self._idle[:excess] if excess > 0 else []
                del self._idle[: max(excess, 0)]
        for old in drop:
            _unmap(old)

    def trim(self) -> int:
        """Unmap every idle buffer; returns how many."""
        with self._lock:
            drop, self._idle = self._idle, []
        for old in drop:
            _unmap(old)
        return len(drop)

    def close(self) -> None:
        """Unmap idle buffers; leased ones are unmapped as they come back."""
        with self._lock:
            self._closed = True
        self.trim()


def _unmap(buffer: StateBuffer) -> None:
    try:
        buffer.close()
    except BadRequest:
        # Someone still holds a view of it (a writer that kept a slice past its
        # release): the mapping goes when that view does.
        log.warning("model.state_buffer_view_kept", capacity=buffer.capacity)
