"""Cache counters (SPEC C10), shared by every llamad process through one small file.

The file (on tmpfs, in the daemon's runtime directory) holds a table of
unsigned 64-bit slots: one row per process that bumps counters, a row of
gauges, and a baseline row. A process claims a free row with an OFD lock (see
:mod:`llamad.cache.oslocks`) and then adds to its own row without talking to
anyone, so a bump costs a lock-free-between-processes memory add. A reader sums
all rows. When a process dies the kernel frees its row's lock and the next
process to attach adopts the row *with its values*, so totals never go down.

``reset`` does not zero other processes' rows (a racing add would resurrect
the old value); it records the current sums as a baseline that snapshots
subtract. Gauges (``bytes_*``: the current size of each tier) have a single
shared slot each that their one writer, cache-meta, overwrites; reset leaves
them alone because they describe state, not history.
"""

from __future__ import annotations

import functools
import mmap
import os
import struct
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final, Protocol

from llamad.cache.errors import CacheError, InvalidCacheValue
from llamad.cache.key import sha256
from llamad.cache.oslocks import try_lock_range

COUNTERS: Final = (
    "hits_exact",
    "hits_resume",
    "hits_longest_prefix",
    "misses",
    "saves_cold",
    "saves_continued",
    "saves_finish",
    "saves_evict",
    "saves_shutdown",
    "saves_dropped",
    "evictions",
    # Moves between tiers (SPEC C12; llamad.cache.moves): copies demoted by
    # quota, promoted on hits, written behind to disk, made by a link(2)
    # instead of a copy, and failed.
    "demotions",
    "promotions",
    "write_behind_copies",
    "moves_linked",
    "moves_failed",
    "corrupt_files",
    "duplicate_dropped",
    "pack_total_ns",
    "load_total_ns",
    "longest_prefix_ns",
    "longest_prefix_probes",
    # Prompt tokens by where their KV came from, counted by the model workers
    # (SPEC M18, C12); hits_live: requests that reused another's live KV.
    "hits_live",
    "prompt_tokens_live",
    "prompt_tokens_ram",
    "prompt_tokens_ram_file",
    "prompt_tokens_disk",
    "prompt_tokens_remote",
    "prompt_tokens_computed",
    # The shared remote tier (issue 20; llamad.cache.remote_store), counted by
    # the model workers: lookups answered, missed, skipped while its breaker
    # was open; rows found evicted by Redis or damaged (both misses);
    # failures (and of them timeouts), reconnections; writes done, their
    # bytes, dropped (queue full, tier down, file gone), duplicates, failed,
    # and rows the ledger's quota evicted.
    "remote_hits",
    "remote_misses",
    "remote_skipped",
    "remote_evicted",
    "remote_damaged",
    "remote_errors",
    "remote_timeouts",
    "remote_reconnects",
    "remote_saves",
    "remote_bytes_written",
    "remote_saves_dropped",
    "remote_saves_duplicate",
    "remote_saves_failed",
    "remote_evictions",
)
"""Monotonic counters, summed over processes."""

GAUGES: Final = ("bytes_ram", "bytes_ram_file", "bytes_disk")
"""Current values with one writer (cache-meta)."""

NAMES: Final = COUNTERS + GAUGES

_MAGIC: Final = b"LLMDCNTR"
_VERSION: Final = 1
_HEADER: Final = struct.Struct("<8sIIII8s")  # magic, version, slots, rows, stride, names digest
_HEADER_SIZE: Final = 64
_LINE: Final = 64
DEFAULT_ROWS: Final = 256
_SLOT_OF: Final = {name: i for i, name in enumerate(COUNTERS)}
_GAUGE_OF: Final = {name: i for i, name in enumerate(GAUGES)}


@functools.cache
def _names_digest() -> bytes:
    """The layout check in the header: the first 8 bytes of sha256 of the names.

    Computed when a file is created or attached, not at import: the root
    imports this module without ever opening the file, and hashing loads
    OpenSSL's libcrypto (SPEC P9)."""
    return sha256("\n".join(NAMES).encode()).digest()[:8]


class CounterAdd(Protocol):
    """What a loader or writer bumps (``load_total_ns``, ``corrupt_files``, ...)."""

    def add(self, name: str, n: int = 1) -> None: ...


class CounterSink(CounterAdd, Protocol):
    """What cache-meta bumps and sets (it alone writes the ``bytes_*`` gauges)."""

    def add_many(self, *counts: tuple[str, int]) -> None:
        """Add several counters at once (one lock round trip for a lookup's three)."""

    def set(self, name: str, value: int) -> None: ...


class DictCounters:
    """In-process counters: cache-meta's default, and what unit tests read."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        self.values[name] = self.values.get(name, 0) + n

    def add_many(self, *counts: tuple[str, int]) -> None:
        for name, n in counts:
            self.add(name, n)

    def set(self, name: str, value: int) -> None:
        self.values[name] = value

    def get(self, name: str) -> int:
        return self.values.get(name, 0)


class CountersUnavailable(CacheError):
    """The counters file is missing, of another layout, or has no free row."""

    code = "counters_unavailable"


class CountersFull(CountersUnavailable):
    """Every row of a valid counters file is held by a live process."""

    code = "counters_full"


def _stride() -> int:
    # Each row on its own cache lines so processes bumping their rows don't
    # bounce a shared line between cores.
    return -(-len(COUNTERS) * 8 // _LINE) * _LINE


class Counters:
    """A process's handle on the shared counters; thread-safe.

    Satisfies :class:`CounterSink` (``add`` / ``set``). Create the
    file once per daemon with :meth:`create`, then :meth:`attach` from every
    process that bumps or reads counters.
    """

    def __init__(self, path: Path, fd: int, mm: mmap.mmap, n_rows: int) -> None:
        self.path = path
        self._fd = fd
        self._mm = mm
        self._n_rows = n_rows
        self._stride = _stride()
        table = memoryview(mm)
        gauges_at = _HEADER_SIZE
        baseline_at = gauges_at + self._stride
        self._rows_at = baseline_at + self._stride
        self._gauges = table[gauges_at : gauges_at + len(GAUGES) * 8].cast("Q")
        self._baseline = table[baseline_at : baseline_at + len(COUNTERS) * 8].cast("Q")
        self._lock = threading.Lock()
        self._row = self._claim_row(table)

    # -- construction -------------------------------------------------------

    @classmethod
    def create(cls, path: str | os.PathLike[str], *, rows: int = DEFAULT_ROWS) -> Counters:
        """Create (or replace) the counters file and attach to it."""
        if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 65536:
            raise InvalidCacheValue("rows", f"{rows!r} is not in [1, 65536]")
        path = Path(path)
        size = _HEADER_SIZE + (2 + rows) * _stride()
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            header = _HEADER.pack(_MAGIC, _VERSION, len(NAMES), rows, _stride(), _names_digest())
            os.pwrite(fd, header, 0)
        finally:
            os.close(fd)
        # Readers attaching mid-create see either the old file or a complete new one.
        os.replace(tmp, path)
        return cls.attach(path)

    @classmethod
    def attach(cls, path: str | os.PathLike[str]) -> Counters:
        """Map an existing counters file and claim a row for this process."""
        path = Path(path)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise CountersUnavailable(f"no counters file at {path}") from None
        try:
            size = os.fstat(fd).st_size
            if size < _HEADER_SIZE:
                raise CountersUnavailable(f"{path} is not a counters file")
            magic, version, slots, rows, stride, digest = _HEADER.unpack(
                os.pread(fd, _HEADER.size, 0)
            )
            layout_ok = (magic, version, slots, stride, digest) == (
                _MAGIC,
                _VERSION,
                len(NAMES),
                _stride(),
                _names_digest(),
            )
            if not layout_ok or size != _HEADER_SIZE + (2 + rows) * stride:
                raise CountersUnavailable(f"{path} has another counters layout")
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        try:
            return cls(path, fd, mm, rows)
        except BaseException:
            # The mapping goes with the failed instance's views; it holds no
            # row lock (claiming one is what failed), so only the fd is ours.
            os.close(fd)
            raise

    @classmethod
    def open_or_create(cls, path: str | os.PathLike[str]) -> Counters:
        """Attach, creating the file only when it is missing or of another layout.

        A valid file whose rows are all held raises :class:`CountersFull`:
        replacing it would silently divert the live holders' counts.
        """
        try:
            return cls.attach(path)
        except CountersFull:
            raise
        except CountersUnavailable:
            return cls.create(path)

    def _claim_row(self, table: memoryview) -> memoryview:
        for i in range(self._n_rows):
            at = self._rows_at + i * self._stride
            if try_lock_range(self._fd, at, self._stride):
                return table[at : at + len(COUNTERS) * 8].cast("Q")
        raise CountersFull(f"all {self._n_rows} counter rows are held by live processes")

    # -- bumping ------------------------------------------------------------

    def add(self, name: str, n: int = 1) -> None:
        """Add ``n`` to a counter (this process's row; other processes are not touched)."""
        slot = _SLOT_OF.get(name)
        if slot is None:
            raise InvalidCacheValue("counter", f"{name!r} is not a counter")
        with self._lock:
            self._row[slot] += n

    def add_many(self, *counts: tuple[str, int]) -> None:
        """Add to several counters under one lock (all names are checked first)."""
        for name, _ in counts:
            if name not in _SLOT_OF:
                raise InvalidCacheValue("counter", f"{name!r} is not a counter")
        row = self._row
        with self._lock:
            for name, n in counts:
                row[_SLOT_OF[name]] += n

    def set(self, name: str, value: int) -> None:
        """Set a gauge (``bytes_ram``, ``bytes_ram_file``, ``bytes_disk``)."""
        slot = _GAUGE_OF.get(name)
        if slot is None:
            raise InvalidCacheValue("gauge", f"{name!r} is not a gauge")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
            raise InvalidCacheValue("gauge", f"{value!r} is not a u64")
        self._gauges[slot] = value

    # -- reading ------------------------------------------------------------

    def _sums(self) -> list[int]:
        words = self._stride // 8
        table = memoryview(self._mm)
        rows = table[self._rows_at : self._rows_at + self._n_rows * self._stride].cast("Q")
        try:
            return [sum(rows[slot::words]) for slot in range(len(COUNTERS))]
        finally:
            rows.release()
            table.release()

    def snapshot(self) -> dict[str, int]:
        """Every counter and gauge, summed over all processes, since the last reset."""
        sums = self._sums()
        out = {name: max(0, sums[i] - self._baseline[i]) for i, name in enumerate(COUNTERS)}
        out.update({name: self._gauges[i] for i, name in enumerate(GAUGES)})
        return out

    def get(self, name: str) -> int:
        """One value from :meth:`snapshot`."""
        if name not in _SLOT_OF and name not in _GAUGE_OF:
            raise InvalidCacheValue("counter", f"{name!r} is not a counter or gauge")
        return self.snapshot()[name]

    def reset(self) -> None:
        """Start every counter from zero again (gauges keep their values)."""
        for i, total in enumerate(self._sums()):
            self._baseline[i] = total

    def close(self) -> None:
        """Unmap and release this process's row (its values stay in the file)."""
        if self._fd < 0:
            return
        for view in (self._row, self._gauges, self._baseline):
            view.release()
        self._mm.close()
        os.close(self._fd)
        self._fd = -1


def snapshot_of(path: str | os.PathLike[str]) -> Mapping[str, int]:
    """Read the counters without keeping a handle (CLI, tests)."""
    c = Counters.attach(path)
    try:
        return c.snapshot()
    finally:
        c.close()
