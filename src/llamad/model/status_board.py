"""A worker's status, readable without waiting on its loop (SPEC M10).

The loop is busy for a whole tick (one ``llama_decode`` of up to ``n_batch``
rows can take seconds on a CPU), and an actor op is answered only between
ticks. So the loop **publishes** a small msgspec-encoded
:class:`WorkerSnapshot` into a file beside its registry entry
(``<registry>/<actor>.status``), and anyone on the host **reads** it with
:func:`read_status`: a few ``pread`` calls, no message to the worker, no wait,
and it works even while the worker is stuck (the snapshot then shows since
when: ``busy_since``).

The loop publishes just before each decode, so a reader sees the batch
being decoded now (``phase``, ``pending_len``) rather than the state before
its requests were admitted (while generation steps over the same sequences
follow one another, only every ``PUBLISH_EVERY_S``: they differ in counts
alone, :mod:`llamad.model.worker_proc`), and after every tick that no decode
follows at once (a tick that decoded while more work waits leaves its snapshot to the
next tick's pre-decode one, or to the end of the next tick if that one does
not decode).

Layout (little-endian), a seqlock so a reader never takes a half-written
snapshot::

    0   u64  seq      odd while the writer is writing, even when stable
    8   u32  length   of the payload
    12  u32  crc32    of the payload
    16  ...  payload  msgpack WorkerSnapshot (at most SLOT_BYTES - 16)

The writer sets ``seq`` odd, writes the payload, then writes the header with
``seq`` even; the reader reads everything, checks ``seq`` even, the CRC, and
that ``seq`` has not moved since, else retries. A restarted worker creates a
fresh file and renames it over the old one, so a reader never sees the new
process's first write half done either.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
import zlib
from collections import deque
from pathlib import Path
from typing import Final

import msgspec

from llamad.model.wire import WorkerSnapshot

__all__ = [
    "SLOT_BYTES",
    "LoadProgressWriter",
    "LoadReport",
    "StatusBoard",
    "Throughput",
    "WorkerSnapshot",
    "load_progress_path",
    "read_load_progress",
    "read_status",
    "status_path",
]

SLOT_BYTES: Final = 8192
_HEAD: Final = struct.Struct("<QII")
_SEQ: Final = struct.Struct("<Q")
_READ_TRIES: Final = 64


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(WorkerSnapshot)


def status_path(registry_root: Path | str, actor_name: str) -> Path:
    """Where ``actor_name`` publishes its status in the registry at ``registry_root``."""
    return Path(registry_root) / f"{actor_name}.status"


class StatusBoard:
    """The writing end, owned by the worker's loop thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, SLOT_BYTES)
            os.replace(tmp, path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        self._fd: int | None = fd
        # Written through a shared mapping: three stores instead of three
        # pwrite calls on every publish (once per decode step); readers'
        # pread sees the same page-cache pages.
        try:
            self._map = mmap.mmap(fd, SLOT_BYTES)
        except BaseException:
            os.close(fd)
            raise
        self._seq = 0

    def publish(self, snapshot: WorkerSnapshot) -> None:
        fd = self._fd
        if fd is None:
            return
        payload = _ENCODER.encode(snapshot)
        if len(payload) > SLOT_BYTES - _HEAD.size:
            raise ValueError(f"status snapshot of {len(payload)} bytes does not fit the slot")
        view = self._map
        self._seq += 1
        _SEQ.pack_into(view, 0, self._seq)
        view[_HEAD.size : _HEAD.size + len(payload)] = payload
        self._seq += 1
        _HEAD.pack_into(view, 0, self._seq, len(payload), zlib.crc32(payload))

    def close(self, *, remove: bool = False) -> None:
        """Stop publishing; ``remove`` deletes the file (a clean stop)."""
        if self._fd is not None:
            self._map.close()
            os.close(self._fd)
            self._fd = None
            if remove:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()


def read_status(path: Path | str) -> WorkerSnapshot | None:
    """The last snapshot published at ``path``; ``None`` if there is none yet.

    Never waits on the worker: a write in progress is retried (a write is a
    few microseconds), and a file that never settles reads as ``None``.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        for _ in range(_READ_TRIES):
            block = os.pread(fd, SLOT_BYTES, 0)
            if len(block) < _HEAD.size:
                return None
            seq, length, crc = _HEAD.unpack_from(block)
            if seq == 0:
                return None  # created, nothing published yet
            payload = block[_HEAD.size : _HEAD.size + length]
            if (
                seq % 2 == 0
                and len(payload) == length
                and zlib.crc32(payload) == crc
                and _SEQ.unpack(os.pread(fd, _SEQ.size, 0))[0] == seq
            ):
                try:
                    return _DECODER.decode(payload)
                except msgspec.DecodeError:
                    pass
            time.sleep(0)
        return None
    finally:
        os.close(fd)


class Throughput:
    """Tokens per second over a sliding window of wall time, fed once per tick.

    Each tick is recorded with the time it *started*, so one tick of ``n``
    tokens that took ``d`` seconds reads as ``n / d``; idle time between
    ticks lowers the rate, and a worker idle for a whole window reads 0.
    """

    def __init__(self, window_s: float = 5.0) -> None:
        self.window_s = window_s
        self._ticks: deque[tuple[float, int, int]] = deque()
        self._generated = 0
        self._decoded = 0

    def add(self, started: float, generated: int, decoded: int) -> None:
        self._ticks.append((started, generated, decoded))
        self._generated += generated
        self._decoded += decoded

    def _expire(self, now: float) -> None:
        while self._ticks and now - self._ticks[0][0] > self.window_s:
            _, g, p = self._ticks.popleft()
            self._generated -= g
            self._decoded -= p

    def rates(self, now: float) -> tuple[float, float]:
        """``(generated, decoded)`` tokens per second over the window ending ``now``."""
        self._expire(now)
        if not self._ticks:
            return 0.0, 0.0
        span = max(now - self._ticks[0][0], 1e-3)
        return self._generated / span, self._decoded / span


# -- while loading: the model-load progress ------------------------------------------


class LoadReport(msgspec.Struct, frozen=True):
    """How far a worker's model load has got (``fraction`` in [0, 1]), as it
    writes it to disk (the front streams it on as
    :class:`llamad.front.wire.LoadProgress`)."""

    pid: int
    fraction: float


_PROGRESS_DECODER: Final = msgspec.msgpack.Decoder(LoadReport)
_PROGRESS_STEP: Final = 0.01


def load_progress_path(registry_root: Path | str, actor_name: str) -> Path:
    """Where ``actor_name``'s worker reports its model load in the registry at ``registry_root``."""
    return Path(registry_root) / f"{actor_name}.load"


class LoadProgressWriter:
    """The model-load progress callback of a worker that is loading.

    The worker has no loop (and no status board) until its model is loaded,
    so the load reports here: each step of at least 1 % replaces a tiny file
    (written aside, then renamed over: a reader never sees half of one). The
    daemon's front reads it while the worker starts and streams the
    fractions to ``load_model``'s caller. :meth:`close` removes the file
    (after a failed load; a complete one leaves its last report, which the
    front removes before it starts the model again). A failed write never
    fails the load.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last = -1.0
        self._pid = os.getpid()

    def __call__(self, fraction: float) -> bool:
        if fraction - self._last >= _PROGRESS_STEP or (fraction >= 1.0 > self._last):
            self._last = fraction
            tmp = self.path.with_name(f".{self.path.name}.{self._pid}.tmp")
            try:
                # 0600 like the status board beside it (the runtime dir is private).
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as fh:
                    fh.write(_ENCODER.encode(LoadReport(self._pid, fraction)))
                os.replace(tmp, self.path)
            except OSError:
                with contextlib.suppress(OSError):
                    tmp.unlink()
        return True

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def read_load_progress(path: Path | str) -> LoadReport | None:
    """The last progress a loading worker reported at ``path``, if any."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return _PROGRESS_DECODER.decode(data)
    except msgspec.DecodeError:
        return None
