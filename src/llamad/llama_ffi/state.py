"""Reusable, pre-faulted memory for packed KV states (SPEC L7, L12).

Copying a 2048-token state into freshly allocated memory spends most of its
time in page faults. A :class:`StateBuffer` maps its memory once, touches
every page up front, and is reused for every pack/unpack afterwards, so a
state copy costs only the copy. :func:`prefault` does the same for memory
someone else allocated (a shared-memory segment, an mmap of a file).

**Host buffers of a device.** A :class:`StateBuffer` made with a
:class:`HostBufferType` (:func:`host_buffer_type`) takes its memory from
ggml's host buffer type of the model's device instead: pinned memory on CUDA,
which a ``llama_state_seq_set_data`` into device KV copies from at full
speed (bench/results/gpu-restore-2026-11-28.md: 26-30 GB/s pinned against
5-7 GB/s pageable on an H200). The CPU device has no host buffer type
(``ggml_backend_dev_host_buffer_type`` is NULL), so on a CPU build
:func:`host_buffer_type` is ``None`` and every buffer is the anonymous,
pre-faulted mapping, exactly as before.
"""

from __future__ import annotations

import mmap
from typing import Any

from llamad.errors import BadRequest
from llamad.llama_ffi.errors import Closed
from llamad.llama_ffi.native import ffi, lib

__all__ = [
    "PAGE_SIZE",
    "HostBufferType",
    "StateBuffer",
    "host_buffer_type",
    "prefault",
    "readable_view",
    "writable_view",
]

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


class HostBufferType:
    """A device's host buffer type (``ggml_backend_buffer_type_t``): where
    :class:`StateBuffer` takes memory that device copies from fastest."""

    def __init__(self, handle: Any) -> None:
        if handle == ffi.NULL:
            raise BadRequest("no host buffer type")
        self.handle = handle

    @property
    def name(self) -> str:
        name: bytes = ffi.string(lib.ggml_backend_buft_name(self.handle))
        return name.decode("utf-8", "replace")


_OFFLOAD_DEVICES = frozenset(
    {int(lib.GGML_BACKEND_DEVICE_TYPE_GPU), int(lib.GGML_BACKEND_DEVICE_TYPE_IGPU)}
)


def host_buffer_type(*, offloaded: bool = True, main_gpu: int = 0) -> HostBufferType | None:
    """The host buffer type of the device a model's KV lives on, or ``None``
    for plain memory (a CPU build, a model kept on the CPU, a device without one).

    ``offloaded``: whether the model puts layers on a GPU (``n_gpu_layers``
    not 0); ``main_gpu``: which GPU, counted among the GPU devices in ggml's
    registry order (llama.cpp's ``main_gpu``).
    """
    if not offloaded:
        return None
    gpus = [
        dev
        for dev in (lib.ggml_backend_dev_get(i) for i in range(int(lib.ggml_backend_dev_count())))
        if int(lib.ggml_backend_dev_type(dev)) in _OFFLOAD_DEVICES
    ]
    if not gpus:
        return None
    buft = lib.ggml_backend_dev_host_buffer_type(gpus[min(main_gpu, len(gpus) - 1)])
    return None if buft == ffi.NULL else HostBufferType(buft)


class StateBuffer:
    """A pre-faulted buffer of at least ``capacity`` bytes: an anonymous
    mapping, or with ``host`` memory of that device's host buffer type
    (pinned on CUDA; see the module doc).

    Pass it (or :attr:`memory`) to ``Context.pack_seq`` / ``unpack_seq``.
    :meth:`ensure` grows it (new memory, pre-faulted again) only when a
    larger state arrives, so steady-state use never faults; :attr:`grows`
    counts those.
    """

    def __init__(self, capacity: int, *, host: HostBufferType | None = None) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise BadRequest(f"capacity must be a positive integer, not {capacity!r}")
        self._host = host
        self._map: mmap.mmap | None = None
        self._ggml: Any = None  # the ggml_backend_buffer_t of a host buffer
        self._size = 0
        self._view: memoryview | None = None
        self.grows = 0
        """Times :meth:`ensure` had to allocate larger memory."""
        self._allocate(capacity)

    @property
    def kind(self) -> str:
        """Where the memory comes from: ``"mmap"`` or the host buffer type's name."""
        return "mmap" if self._host is None else self._host.name

    def _allocate(self, capacity: int) -> None:
        size = _round_up(capacity)
        if self._host is not None:
            self._allocate_host(self._host, size)
            return
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0x20)
        # Not MAP_POPULATE: CPython makes that mmap call holding the GIL (~20
        # ms for 60 MB here), and the read buffer is prepared on a helper
        # thread beside the worker's loop. llamad_prefault faults every page
        # in writable (one madvise, then a write per page) with the GIL released.
        new = mmap.mmap(-1, size, flags=flags)
        lib.llamad_prefault(ffi.from_buffer("uint8_t[]", new), size, PAGE_SIZE)
        self.close()
        self._map = new
        self._size = size
        self._view = memoryview(new)

    def _allocate_host(self, host: HostBufferType, size: int) -> None:
        buf = lib.ggml_backend_buft_alloc_buffer(host.handle, size)
        if buf == ffi.NULL:
            raise MemoryError(f"{host.name} could not allocate {size} bytes")
        base = lib.ggml_backend_buffer_get_base(buf)
        got = int(lib.ggml_backend_buffer_get_size(buf))
        # Pinned memory is resident already; touching it is cheap and keeps
        # the promise that no use of the buffer faults.
        lib.llamad_prefault(ffi.cast("uint8_t *", base), got, PAGE_SIZE)
        self.close()
        self._ggml = buf
        self._size = got
        self._view = memoryview(ffi.buffer(ffi.cast("uint8_t *", base), got))

    @property
    def capacity(self) -> int:
        return 0 if self._view is None else self._size

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
            self.grows += 1

    def close(self) -> None:
        """Unmap (or free the host buffer); every view handed out must have
        been released first. A host buffer's memory is not refcounted by
        Python: its owner releases every slice before closing (the restore
        path does, in a ``finally``)."""
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
        if self._ggml is not None:
            lib.ggml_backend_buffer_free(self._ggml)
            self._ggml = None
        self._size = 0

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
