"""CRC32C for ``.kvc`` rows: the ``crc32c`` package's C function, without its package face.

``import crc32c`` runs the package's ``__init__``, which reads its own
version through ``importlib.metadata``: that drags in ``email``, ``zipfile``,
``csv`` and ~50 more modules, 3.5 MB of RSS in every process that checks a
row (the root, the front, cache-meta, each worker; SPEC P9), for a string
nobody reads. This module loads the package's compiled ``_crc32c`` extension
by itself, under its own name, so a later ``import crc32c`` reuses it. If
the package's layout ever differs from what this expects, it falls back to
the plain import: slower to load, never wrong.

A restore checks its row's payload before any of it reaches the KV (SPEC
C2), and at 2,048 tokens of the default model that CRC (~48 MB, ~2.9 ms)
was over half of a warm restore. :func:`crc32c_split` checks a large buffer
on two threads: the package's C function releases the GIL, and two halves'
CRCs combine into the whole's with a few GF(2) products
(:func:`crc32c_combine`, zlib's ``crc32_combine`` for CRC32C's polynomial).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import queue
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Final, Protocol, cast

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "BESIDE_CHUNK",
    "HARDWARE_BASED",
    "SPLIT_MIN_BYTES",
    "CrcBeside",
    "PartCrc",
    "crc32c",
    "crc32c_combine",
    "crc32c_halves",
    "crc32c_split",
]

_EXTENSION: Final = "crc32c._crc32c"


def _extension() -> ModuleType:
    loaded = sys.modules.get(_EXTENSION)
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("crc32c")  # finds it, runs nothing
    roots = package.submodule_search_locations if package is not None else None
    for root in roots or ():
        finder = importlib.machinery.FileFinder(
            root,
            (
                importlib.machinery.ExtensionFileLoader,
                importlib.machinery.EXTENSION_SUFFIXES,
            ),
        )
        spec = finder.find_spec(_EXTENSION)
        if spec is None or spec.loader is None:
            continue
        module = importlib.util.module_from_spec(spec)
        sys.modules[_EXTENSION] = module
        spec.loader.exec_module(module)
        return module
    import crc32c as whole  # noqa: PLC0415  (the layout changed: the plain way)

    return whole


class _Crc32c(Protocol):
    def __call__(self, data: Buffer, value: int = 0, /) -> int: ...


_crc = _extension()

crc32c = cast("_Crc32c", _crc.crc32c)
"""``crc32c(data, value=0)``: the CRC32C of ``data``, continuing from ``value``."""

HARDWARE_BASED: Final[bool] = bool(_crc.hardware_based)
"""Whether the C code uses the CPU's CRC instructions (SSE4.2 or ARMv8)."""


# -- combining two CRCs, and checking a large buffer on two threads -------------------

_POLY: Final = 0x82F63B78
"""CRC32C's (Castagnoli's) polynomial, bit-reversed as the CRC runs."""


def _multmodp(a: int, b: int) -> int:
    """``a * b`` modulo the polynomial, both in the CRC's reflected order."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


def _powers() -> list[int]:
    """``x^(2^k)`` modulo the polynomial for k in 0..63."""
    table = [1 << 30]  # x^1
    for _ in range(63):
        table.append(_multmodp(table[-1], table[-1]))
    return table


_X2N: list[int] = []


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32C of ``A + B`` from ``crc1`` (of A), ``crc2`` (of B) and
    ``len(B)``: A's CRC carried over B's length in zero bits, then B's.
    ~30 us in Python, whatever the lengths."""
    if len2 < 0:
        raise ValueError(f"a length is >= 0, not {len2}")
    if not _X2N:
        _X2N.extend(_powers())
    p = 1 << 31  # x^0
    n, k = len2, 3  # x^(8 * len2): the bits of len2, from x^(2^3) up
    while n:
        if n & 1:
            p = _multmodp(_X2N[k], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


SPLIT_MIN_BYTES: Final = 4 << 20
"""Below this a buffer is checked on the calling thread alone: handing half
to the helper (a queue put and a wake-up, ~20-50 us) and combining (~30 us)
cost more than half of a 4 MB CRC (~0.25 ms) saves on a busy machine."""


PartCrc = Callable[[memoryview, int], int]
"""``crc_of(part, start)``: the CRC32C of ``part``, the bytes of a buffer
from ``start`` on, which the function may first fill (a file's read)."""


class _Half:
    """The second half of a split CRC: whoever takes it first computes it."""

    __slots__ = ("crc_of", "data", "done", "error", "lock", "start", "taken", "value")

    def __init__(self, crc_of: PartCrc, data: memoryview, start: int) -> None:
        self.crc_of = crc_of
        self.data = data
        self.start = start
        self.lock = threading.Lock()
        self.taken = False
        self.done = threading.Event()
        self.value = 0
        self.error: BaseException | None = None

    def take(self) -> bool:
        with self.lock:
            if self.taken:
                return False
            self.taken = True
            return True

    def run(self) -> None:
        try:
            self.value = self.crc_of(self.data, self.start)
        except BaseException as exc:  # handed to the caller, which raises it
            self.error = exc
        finally:
            self.done.set()


class _HelperJob(Protocol):
    def take(self) -> bool:
        """Whether the helper is to run it (no one else has taken it)."""
        ...

    def run(self) -> None: ...


_halves: queue.SimpleQueue[_HelperJob] = queue.SimpleQueue()
_helper_lock = threading.Lock()
_helper: threading.Thread | None = None


def _serve_halves() -> None:
    while True:
        half = _halves.get()
        if half.take():
            half.run()


def _forget_halves() -> None:
    # A child forked while a half was queued never sees that half's caller.
    global _halves, _helper_lock
    _halves = queue.SimpleQueue()
    _helper_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_halves)


def _ensure_helper() -> None:
    global _helper  # one helper thread per process, started on first use
    with _helper_lock:
        if _helper is None or not _helper.is_alive():  # not alive: a child forked after it started
            _helper = threading.Thread(target=_serve_halves, name="crc32c-split", daemon=True)
            _helper.start()


def _whole(part: memoryview, start: int) -> int:
    return crc32c(part)


def crc32c_split(data: Buffer) -> int:
    """``crc32c(data)``, on two threads for a buffer of at least
    :data:`SPLIT_MIN_BYTES` (:func:`crc32c_halves`)."""
    with memoryview(data) as raw, raw.cast("B") as view:
        return crc32c_halves(view, _whole)


def crc32c_halves(view: memoryview, crc_of: PartCrc) -> int:
    """The CRC32C of ``view`` from ``crc_of`` (:data:`PartCrc`) run on its two
    halves, the second on a helper thread while this one runs the first
    (the work must release the GIL: the C CRC, ``preadv``), combined; one
    call on the whole below :data:`SPLIT_MIN_BYTES`.

    A helper that has not started its half by the time this thread is done
    with its own (a busy machine left it no core) loses it: this thread then
    runs it too, so a split never takes much longer than one pass on this
    thread alone. It returns, or raises what either half raised, only once
    neither half runs any more: nothing of ``view`` is used after it."""
    n = len(view)
    if n < SPLIT_MIN_BYTES:
        return crc_of(view, 0)
    _ensure_helper()
    cut = n - n // 2
    with view[:cut] as head, view[cut:] as tail:
        half = _Half(crc_of, tail, cut)
        _halves.put(half)
        try:
            try:
                first = crc_of(head, 0)
            except BaseException:
                if not half.take():  # the helper runs it: until it no longer reads the view
                    half.done.wait()
                raise
            if half.take():
                half.run()
            half.done.wait()
        finally:
            half.data = memoryview(b"")  # the queue's reference must not pin the buffer
        if half.error is not None:
            raise half.error
        return crc32c_combine(first, half.value, n - cut)


BESIDE_CHUNK: Final = 4 << 20
"""The helper's step in :class:`CrcBeside`: it looks for the caller's cut
between steps (~0.2-0.3 ms of CRC each), and a step costs ~2 us of Python."""


class CrcBeside:
    """The CRC32C of ``view``, begun on the helper thread at once and finished
    by :meth:`value` on the caller's, so that the caller can use the bytes in
    the meantime (a restore's ``llama_state_seq_set_data`` copies the row into
    the KV while its checksum runs beside it).

    The helper runs from the front in :data:`BESIDE_CHUNK` steps. When the
    caller asks for the value it takes the back half of what the helper has
    not reached (one CRC call), the helper stops at that cut, and the two
    parts combine (:func:`crc32c_combine`). A helper that never got a core
    before the caller asked leaves it all to the caller, so a busy machine
    costs one pass on the caller's thread, as a plain ``crc32c`` would.

    :meth:`value` (or :meth:`close`) returns only once the helper no longer
    reads ``view``: the caller may release it then. Call one of them before
    the view goes; :meth:`close` stops the helper at its next step.
    """

    __slots__ = (
        "_claimed",
        "_closed",
        "_cut",
        "_done",
        "_error",
        "_front",
        "_helped",
        "_lock",
        "_n",
        "_taken",
        "_value",
        "_view",
    )

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._n = len(view)
        self._lock = threading.Lock()
        self._taken = False  # by the helper, or by the caller that found it idle
        self._helped = False  # the helper took it: it sets _done when it stops
        self._claimed = 0  # the helper reads [0, _claimed) at most
        self._cut = self._n  # and stops there
        self._front = 0
        self._value: int | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._done = threading.Event()
        _ensure_helper()
        _halves.put(self)

    def take(self) -> bool:
        """The helper's claim (see :class:`_HelperJob`)."""
        with self._lock:
            if self._taken:
                return False
            self._taken = self._helped = True
            return True

    def run(self) -> None:
        """The helper's part: the front, step by step, up to the cut."""
        value = pos = 0
        try:
            while True:
                with self._lock:
                    end = min(pos + BESIDE_CHUNK, self._cut)
                    if end <= pos:
                        break
                    self._claimed = end
                with self._view[pos:end] as part:
                    value = crc32c(part, value)
                pos = end
            self._front = value
        except BaseException as exc:  # handed to the caller, which raises it
            self._error = exc
        finally:
            self._done.set()

    def value(self) -> int:
        """The CRC32C of the whole view (the caller's thread; not after :meth:`close`)."""
        if self._value is not None:
            return self._value
        with self._lock:
            if self._closed:
                raise RuntimeError("CrcBeside.value after close")
            helped = self._helped
            self._taken = True
            # The back half of what the helper has not claimed is ours.
            cut = self._claimed + (self._n - self._claimed) // 2 if helped else 0
            self._cut = cut
        try:
            with self._view[cut:] as part:
                back = crc32c(part)
        finally:
            if helped:
                self._done.wait()
        if self._error is not None:
            raise self._error
        self._value = crc32c_combine(self._front, back, self._n - cut) if helped else back
        return self._value

    def close(self) -> None:
        """Stop the helper at its next step and wait until it no longer reads
        the view. Idempotent; after :meth:`value` it only marks it closed."""
        with self._lock:
            self._closed = self._taken = True
            self._cut = min(self._cut, self._claimed)
            helped = self._helped
        if helped:
            self._done.wait()
