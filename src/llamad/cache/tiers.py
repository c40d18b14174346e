"""Where published rows live (SPEC C3): ``ram``, ``ram_file`` and ``disk`` tiers.

All three hold one ``.kvc`` file per row, named ``<key hex>.kvc``, and differ
in lifetime:

- ``ram``: POSIX shared-memory segments named ``/llamad-ram.<instance>.<key>.kvc``.
  On Linux a segment *is* a file under ``/dev/shm`` (``shm_open`` opens
  exactly that path), so the tier handles segments by path, which gives it
  the same ``link(2)`` publish as the other tiers. Segments belong to one
  daemon instance: they are purged when it stops and when the next one starts.
- ``ram_file``: files in a tmpfs directory (``/dev/shm/llamad/...`` or a
  configured root); they survive a daemon restart and are adopted by its scan.
- ``disk``: files in the state directory; they survive a reboot.

Quotas and LRU are cache-meta's (it owns the index); a tier knows its quota
so a save that could never fit is refused before a byte is written. Files are
read with plain ``pread`` into memory the caller owns, never ``mmap``: a file
truncated under a reader then yields a short read (a miss), not a SIGBUS.
``ram`` segments are the exception, mapped and copied (see
:class:`SegmentMaps` for why that is safe and needed).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, NamedTuple

import structlog

from llamad.cache.checksum import CrcBeside, crc32c_split
from llamad.cache.counters import CounterAdd
from llamad.cache.errors import CacheError, InvalidCacheValue, KvcCorrupt, TierError, TierFull
from llamad.cache.kvc import (
    SUFFIX,
    KvcMeta,
    check_prefix_unchanged,
    copy_payload_into,
    file_name,
    read_meta,
    read_payload_into,
    update_stats,
)
from llamad.cache.populate import populate_read
from llamad.cache.reservation import Adopted
from llamad.cache.tier_kind import TierKind, check_tier

if TYPE_CHECKING:
    from typing_extensions import Buffer

log = structlog.get_logger("llamad.cache.tiers")

SHM_ROOT: Final = Path("/dev/shm")

_GIB: Final = 1 << 30
DEFAULT_RAM_QUOTA: Final = 2 * _GIB
DEFAULT_RAM_FILE_QUOTA: Final = 4 * _GIB
DEFAULT_DISK_QUOTA: Final = 32 * _GIB
"""The quotas with no configuration. Sized for the smallest machine llamad
is built on (2 cores, 24 GiB of memory, ``/dev/shm`` at half of it, ~50 GB
of free disk): ``ram`` and ``ram_file`` share ``/dev/shm`` and take at most
6 GiB of its 12, leaving the rest of memory to the models' weights and KV;
``disk`` takes 32 GiB of the ~50 GB, room for ~700 full 2048-token rows of
the default model (47 MB each) with a margin left free. ``ram_file`` is
twice ``ram`` so that a clean stop can link every ``ram`` row into it."""

_KEY_HEX: Final = re.compile(r"[0-9a-f]{64}")
_INSTANCE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
_WRITER: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


# The lock file cache-meta holds in each tier root it owns (see
# llamad.cache.tier_lock); a ram tier's carries the instance prefix, since
# /dev/shm is shared by every instance on the host. Never a row's name.
_LOCK_NAME: Final = "cache-meta.lock"


class RowMissing(CacheError):
    """The row's file is not there (evicted or deleted underneath)."""

    code = "row_missing"


def checked_whole() -> None:
    """A row's ``check`` when it was checked whole before it was handed over:
    nothing is left to check."""


class LoadedRow(NamedTuple):
    """A validated row: its meta (``meta.logits``: the logits it keeps, if any)
    and its payload (in the caller's buffer, or in place in a mapping).

    ``check`` raises :class:`KvcCorrupt` unless the payload's checksum
    matches. It is a no-op, except for a row mapped with ``check_beside``
    (:meth:`Tier.mapped_row`), whose checksum runs while the caller uses the
    payload: the caller calls it before it relies on what it made of it.
    """

    meta: KvcMeta
    payload: memoryview
    check: Callable[[], None] = checked_whole


class _PayloadCheck:
    """A mapped payload's checksum run beside its use (``Tier.mapped_row``'s
    ``check_beside``): :meth:`check` gives the verdict, and leaving the block
    gives it if nobody asked, then stops the helper before the view goes."""

    def __init__(self, payload: memoryview, expected: int, path: Path) -> None:
        self._crc = CrcBeside(payload)
        self._expected = expected
        self._path = path
        self._checked = False

    def check(self) -> None:
        self._checked = True
        if self._crc.value() != self._expected:
            SEGMENTS.drop(self._path)
            raise KvcCorrupt("payload_crc", "payload checksum mismatch")

    def __enter__(self) -> _PayloadCheck:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        try:
            if not self._checked:
                # Whatever went wrong in the block, a damaged row is said to be.
                self.check()
        finally:
            self._crc.close()


@dataclass(frozen=True, slots=True)
class TierConfig:
    """One tier's place and budget; invalid values raise naming the field.

    ``root`` is the directory of ``ram_file`` / ``disk`` files; for ``ram`` it
    is the shared-memory filesystem (``/dev/shm``), and ``instance`` keeps two
    daemons on one host (or two tests) from purging each other's segments.
    """

    kind: TierKind
    root: Path
    quota: int
    instance: str = "default"

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", check_tier(self.kind, "kind"))
        if not isinstance(self.root, str | os.PathLike):
            raise InvalidCacheValue("root", "expected a path")
        root = Path(self.root)
        if any(c == "\0" or "\ud800" <= c <= "\udfff" for c in str(root)):
            raise InvalidCacheValue("root", f"{str(root)!r} holds a NUL or a lone surrogate")
        if not root.is_absolute():
            raise InvalidCacheValue("root", f"{root} is not an absolute path")
        object.__setattr__(self, "root", root)
        if isinstance(self.quota, bool) or not isinstance(self.quota, int) or self.quota < 0:
            raise InvalidCacheValue("quota", f"{self.quota!r} is not a byte count >= 0")
        if not isinstance(self.instance, str) or not _INSTANCE.fullmatch(self.instance):
            raise InvalidCacheValue("instance", f"{self.instance!r} is not [A-Za-z0-9_-]{{1,64}}")

    @property
    def name(self) -> TierKind:
        """The tier's kind (its value is the name the tier goes by)."""
        return self.kind


class Tier:
    """File operations of one tier. Stateless beyond its config: any process may hold one."""

    def __init__(self, config: TierConfig) -> None:
        self.config = config
        self.name: TierKind = config.kind
        self.kind: TierKind = config.kind
        self.root = config.root
        self.quota = config.quota
        # ram segments share /dev/shm with everything else on the host, so
        # their names carry a prefix that scopes them to this daemon instance.
        self.prefix = f"llamad-ram.{config.instance}." if config.kind is TierKind.RAM else ""
        suffix = re.escape(SUFFIX)
        self._final = re.compile(re.escape(self.prefix) + r"([0-9a-f]{64})" + suffix)
        self._tmp = re.compile(
            re.escape(self.prefix) + r"[0-9a-f]{64}" + suffix + r"\.[A-Za-z0-9_-]+\.tmp"
        )

    def __repr__(self) -> str:
        return f"Tier({self.name}, root={str(self.root)!r}, quota={self.quota})"

    # -- naming ---------------------------------------------------------------

    def path_for(self, key: bytes) -> Path:
        """The published path of ``key`` in this tier."""
        if not isinstance(key, bytes):
            raise InvalidCacheValue("key", "expected 32 bytes")
        return self.root / (self.prefix + file_name(key))

    def location_for(self, key: bytes) -> str:
        """The location string cache-meta records for ``key`` (its absolute path)."""
        return str(self.path_for(key))

    def segment_name(self, key: bytes) -> str:
        """The POSIX ``shm_open`` name of a ``ram`` row."""
        if self.kind is not TierKind.RAM:
            raise InvalidCacheValue("tier", f"{self.name} rows are files, not segments")
        return "/" + self.path_for(key).name

    @property
    def lock_path(self) -> Path:
        """The file whose lock says which cache-meta owns this tier (:mod:`.tier_lock`)."""
        return self.root / (self.prefix + _LOCK_NAME)

    def tmp_path_for(self, key: bytes, writer: str) -> Path:
        """``<key>.kvc.<writer>.tmp`` beside the final path (``link(2)`` stays in one dir)."""
        if not isinstance(writer, str) or not _WRITER.fullmatch(writer):
            raise InvalidCacheValue("writer", f"{writer!r} is not [A-Za-z0-9_-]{{1,64}}")
        final = self.path_for(key)
        return final.with_name(f"{final.name}.{writer}.tmp")

    def key_of(self, path: str | os.PathLike[str]) -> bytes | None:
        """The key a published file name stands for, or None if it is not one of ours."""
        p = Path(path)
        m = self._final.fullmatch(p.name)
        return bytes.fromhex(m.group(1)) if m and p.parent == self.root else None

    def _resolve(self, key_or_location: bytes | str | os.PathLike[str]) -> tuple[bytes, Path]:
        if isinstance(key_or_location, bytes):
            return key_or_location, self.path_for(key_or_location)
        key = self.key_of(key_or_location)
        if key is None:
            # Locations arrive in messages: never touch a path outside the tier.
            raise InvalidCacheValue("location", f"{key_or_location!s} is not a row of {self.name}")
        return key, Path(key_or_location)

    # -- lifecycle ------------------------------------------------------------

    def prepare(self) -> None:
        """Create the tier's directory (0700) if needed, and every missing
        parent 0700 too: ``mkdir(parents=True)`` makes parents with the umask
        (0755 in /dev/shm/llamad-<uid>), which lists the instances to anyone."""
        try:
            missing = [d for d in (self.root, *self.root.parents) if not d.exists()]
            for d in reversed(missing):
                d.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise TierError(f"cannot create {self.root}: {exc}") from exc

    def _entries(self) -> Iterator[os.DirEntry[str]]:
        try:
            with os.scandir(self.root) as it:
                yield from it
        except FileNotFoundError:
            return

    def scan(
        self, counters: CounterAdd | None = None, *, adopt_ram: bool = False
    ) -> Iterator[KvcMeta]:
        """Startup scan: yield valid rows; delete ``*.tmp`` leftovers and corrupt files.

        A ``ram`` tier yields nothing by default: at a daemon's start its
        segments died with the previous daemon by definition, so they are
        deleted like leftovers. A cache-meta restarted within the same daemon
        run passes ``adopt_ram=True`` to keep and index them like files. Files
        that are not named like ours are left alone, and so are files that
        cannot be read (logged, neither indexed nor deleted). Only header and
        TLV are checked here (fast); the payload checksum is checked on every
        load.
        """
        purge_ram = self.kind is TierKind.RAM and not adopt_ram
        for entry in self._entries():
            name = entry.name
            if self._tmp.fullmatch(name) or (purge_ram and self._final.fullmatch(name)):
                _unlink(Path(entry.path))
                continue
            m = self._final.fullmatch(name)
            if m is None:
                continue
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue
            except OSError as exc:
                # Unreadable (permissions, I/O error): not ours to judge or delete,
                # and one bad file must not stop the rebuild of all the others.
                log.warning("cache.scan_skipped", tier=self.name, path=entry.path, error=str(exc))
                continue
            try:
                meta = read_meta(fd, expected_key=bytes.fromhex(m.group(1)))
            except KvcCorrupt as exc:
                log.warning(
                    "cache.corrupt_file", tier=self.name, path=entry.path, reason=exc.reason
                )
                if _unlink(Path(entry.path)) and counters is not None:
                    # Only the one who removed a damaged file counts it: a
                    # loader may have found and removed it first.
                    counters.add("corrupt_files")
                continue
            except OSError as exc:
                log.warning("cache.scan_skipped", tier=self.name, path=entry.path, error=str(exc))
                continue
            finally:
                os.close(fd)
            yield meta

    def purge(self) -> int:
        """Delete every row and leftover of this tier (a ``ram`` tier at daemon stop)."""
        n = 0
        for entry in self._entries():
            if self._tmp.fullmatch(entry.name) or self._final.fullmatch(entry.name):
                n += _unlink(Path(entry.path))
        return n

    def row_keys(self) -> list[bytes]:
        """The keys of the published files in this tier now (not validated)."""
        keys = []
        for entry in self._entries():
            m = self._final.fullmatch(entry.name)
            if m is not None:
                keys.append(bytes.fromhex(m.group(1)))
        return keys

    def usage(self) -> int:
        """Bytes held by published rows on the filesystem (for checks, not accounting)."""
        total = 0
        for entry in self._entries():
            if self._final.fullmatch(entry.name):
                try:
                    total += entry.stat().st_size
                except FileNotFoundError:
                    continue
        return total

    # -- rows -----------------------------------------------------------------

    def exists(self, key_or_location: bytes | str | os.PathLike[str]) -> bool:
        return self._resolve(key_or_location)[1].exists()

    def delete(self, key_or_location: bytes | str | os.PathLike[str]) -> bool:
        """Unlink a row; returns whether it was there."""
        return bool(_unlink(self._resolve(key_or_location)[1]))

    def read_meta(self, key_or_location: bytes | str | os.PathLike[str]) -> KvcMeta:
        """Header and TLV of a row, validated against its key (no payload checksum)."""
        key, path = self._resolve(key_or_location)
        fd = self._open(path)
        try:
            return read_meta(fd, expected_key=key)
        finally:
            os.close(fd)

    def read_into(self, key_or_location: bytes | str | os.PathLike[str], buffer: Buffer) -> int:
        """:meth:`read_row_into`, answering the payload's length."""
        return self.read_row_into(key_or_location, buffer).payload_len

    def read_row_into(
        self, key_or_location: bytes | str | os.PathLike[str], buffer: Buffer
    ) -> KvcMeta:
        """Validate a row completely and read its payload into ``buffer``; returns
        the validated meta (its ``payload_len`` bytes are at the buffer's start,
        its ``logits`` are the row's).

        Raises :class:`RowMissing` when the file is gone and :class:`KvcCorrupt`
        when any check fails. Damage found before the payload is read leaves
        ``buffer`` untouched; a payload checksum mismatch is found only once
        the payload is in ``buffer`` (one pass over the bytes), and the bytes
        copied are zeroed. Either way nothing of the row is left in it.

        A ``ram`` row mapped by an earlier load is checked as fully as a
        fresh read: header, TLV and padding against the bytes validated when
        it was mapped (:func:`~llamad.cache.kvc.check_prefix_unchanged`),
        then the payload checksum.
        """
        key, path = self._resolve(key_or_location)
        if self.kind is TierKind.RAM:
            segment = SEGMENTS.get(path, key)
            try:
                copy_payload_into(segment.view, segment.meta, buffer)
            except KvcCorrupt:
                SEGMENTS.drop(path)
                raise
            return segment.meta
        fd = self._open(path)
        try:
            meta = read_meta(fd, expected_key=key)
            read_payload_into(fd, meta, buffer)
            return meta
        finally:
            os.close(fd)

    def warm(self, key_or_location: bytes | str | os.PathLike[str]) -> bool:
        """Map a ``ram`` row ahead of its first load (off the hot path; see SegmentMaps).

        Returns False for other tiers and for rows that are gone or damaged.
        """
        if self.kind is not TierKind.RAM:
            return False
        key, path = self._resolve(key_or_location)
        try:
            SEGMENTS.get(path, key)
        except (RowMissing, KvcCorrupt):
            return False
        return True

    @contextlib.contextmanager
    def mapped_payload(
        self, key_or_location: bytes | str | os.PathLike[str]
    ) -> Iterator[memoryview]:
        """:meth:`mapped_row`'s payload alone."""
        with self.mapped_row(key_or_location) as row:
            yield row.payload

    @contextlib.contextmanager
    def mapped_row(
        self, key_or_location: bytes | str | os.PathLike[str], *, check_beside: bool = False
    ) -> Iterator[LoadedRow]:
        """A ``ram`` row's payload in place, validated: restore with no copy at all.

        Inside the block the view can go straight to
        ``llama_state_seq_set_data``, which copies it into the KV cache; that
        saves the copy into an intermediate buffer that :meth:`read_into`
        makes. Do not keep the view (or anything made from it) past the
        block. Raises like :meth:`read_into`, after the same checks. The
        meta is the one validated when the segment was mapped, which the
        mapping was just found equal to (its logits are bytes of this
        process, valid after the block too).

        ``check_beside``: the payload's checksum is not awaited before the
        block but computed beside it (:class:`~llamad.cache.checksum.CrcBeside`),
        and the row's ``check()`` gives its verdict; the caller runs it after
        its use of the payload and before it relies on the result (a restore
        drops the cells it unpacked when it raises). A block left without
        calling it, normally or by an exception, runs it on the way out: a
        damaged row then raises :class:`KvcCorrupt` (chained to the block's
        own exception), so its damage is counted whatever the caller did.
        """
        if self.kind is not TierKind.RAM:
            raise InvalidCacheValue("tier", f"{self.name} rows are read with read_into, not mapped")
        key, path = self._resolve(key_or_location)
        segment = SEGMENTS.get(path, key)
        meta = segment.meta
        try:
            check_prefix_unchanged(segment.view, meta)
        except KvcCorrupt:
            SEGMENTS.drop(path)
            raise
        payload = segment.view[meta.payload_offset : meta.file_size]
        try:
            if not check_beside:
                # On two threads: it gates the restore (SPEC C2), and at 2,048
                # tokens it was over half of it (checksum.crc32c_split).
                if crc32c_split(payload) != meta.payload_crc32c:
                    SEGMENTS.drop(path)
                    raise KvcCorrupt("payload_crc", "payload checksum mismatch")
                yield LoadedRow(meta, payload)
            else:
                with _PayloadCheck(payload, meta.payload_crc32c, path) as verdict:
                    yield LoadedRow(meta, payload, verdict.check)
        finally:
            try:
                payload.release()
            except BufferError:
                # The caller kept an export of the view; the mapping then
                # lives until that export goes.
                log.warning("cache.mapping_kept_alive", tier=self.name, path=str(path))

    def persist_stats(
        self, key_or_location: bytes | str | os.PathLike[str], hits: int, last_used_ns: int
    ) -> None:
        """Write a row's hit count and last use into its header (cache-meta, unpinned rows)."""
        path = self._resolve(key_or_location)[1]
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RowMissing(f"{path} is gone") from None
        try:
            update_stats(fd, hit_count=min(hits, 2**32 - 1), last_used_ns=last_used_ns)
        finally:
            os.close(fd)

    def _open(self, path: Path) -> int:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RowMissing(f"{path} is gone") from None
        except OSError as exc:
            raise TierError(f"cannot open {path}: {exc}") from exc

    # -- the writer's side (see llamad.cache.publish) ---------------------------

    def create_tmp(self, key: bytes, writer: str, size: int) -> tuple[Path, int]:
        """Create ``<key>.kvc.<writer>.tmp`` exclusively and reserve ``size`` bytes in it.

        The allocation makes a full tmpfs or disk fail here, with a clean
        :class:`TierFull`, rather than halfway through the payload.
        """
        path = self.tmp_path_for(key, writer)
        if size > self.quota:
            # cache-meta refuses such a reservation already; this keeps a
            # writer that skipped it from filling the filesystem.
            raise TierFull(f"a {size}-byte row exceeds the {self.name} quota of {self.quota}")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileNotFoundError:
            raise TierError(f"tier directory {self.root} is missing") from None
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as exc:
            os.close(fd)
            _unlink(path)
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise TierFull(f"{self.name} has no room for {size} bytes") from exc
            raise TierError(f"cannot allocate {path}: {exc}") from exc
        return path, fd

    def sync_dir(self) -> None:
        """fsync the tier directory so a link or unlink in it is durable."""
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True, slots=True)
class _Segment:
    ino: int
    dev: int
    size: int
    meta: KvcMeta
    view: memoryview  # holds the mapping: unmapped when the last reference goes


class SegmentMaps:
    """This process's read-only mappings of ``ram`` segments, kept between loads.

    A ``ram`` row is read the way shared memory is meant to be read: mapped
    and copied. ``read(2)`` from tmpfs costs up to 3x a memcpy on some kernels
    (it does on the benchmark VM), and setting up the page tables of a fresh
    47 MB mapping costs about one memcpy on its own, so mappings are kept and
    reused: a repeated load is one checksummed copy. ``Tier.warm`` maps a row
    before its first load (the writer pool does it after a ``ram`` save, so
    the next turn's restore finds it mapped).

    Safety. The usual mmap hazard, SIGBUS when the file shrinks under the
    mapping, cannot come from llamad: a published segment is never truncated
    or rewritten in place except its 72-byte header, only unlinked, and an
    unlinked segment stays valid while mapped. Every use re-checks the path
    (same inode and size, else the mapping is dropped and the row re-read).
    Damage done to the segment after it was mapped shows through the mapping,
    so every load checks what a fresh read checks: the header on its own
    terms, header, TLV and padding byte for byte against what was validated
    at mapping time (only the hit count and last-used time may change), and
    the payload checksum. Files on disk and ``ram_file`` rows, which other
    tools may touch, are never mapped.

    Memory. A mapping of a segment cache-meta has since evicted keeps its
    pages alive, so the map is bounded (``max_bytes``, least recently used
    first out) and stale entries are swept whenever a segment is mapped.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._maps: OrderedDict[Path, _Segment] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._retired: deque[_Segment] = deque()
        self._wake = threading.Event()
        self._retirer: threading.Thread | None = None

    def __len__(self) -> int:
        return len(self._maps)

    def __contains__(self, path: object) -> bool:
        return path in self._maps

    def get(self, path: Path, key: bytes) -> _Segment:
        """The mapping of ``path``, validated (header, TLV, key) when it was mapped.

        A mapping found here may be older than damage done to the file since:
        loads re-check it (:func:`~llamad.cache.kvc.check_prefix_unchanged`
        and the payload CRC) before using a byte of it.
        """
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self.drop(path)
            raise RowMissing(f"{path} is gone") from None
        with self._lock:
            seg = self._maps.get(path)
            if seg is not None:
                if (seg.ino, seg.dev, seg.size) == (st.st_ino, st.st_dev, st.st_size):
                    self._maps.move_to_end(path)
                    return seg
                # The path names another file now, or this one changed size:
                # never read the old mapping again (a shrunk file faults).
                self._remove(path)
        seg = self._map(path, key)
        with self._lock:
            self._remove(path)
            self._maps[path] = seg
            self._bytes += seg.size
            self._trim()
        return seg

    def _map(self, path: Path, key: bytes) -> _Segment:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise RowMissing(f"{path} is gone") from None
        try:
            st = os.fstat(fd)
            meta = read_meta(fd, expected_key=key)
            # Not MAP_POPULATE: CPython makes that mmap call holding the GIL,
            # and the writer thread warming a saved row stalled the loop.
            mapped = mmap.mmap(fd, meta.file_size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            populate_read(mapped)
        finally:
            os.close(fd)
        return _Segment(st.st_ino, st.st_dev, meta.file_size, meta, memoryview(mapped))

    def _trim(self) -> None:
        for path in [p for p, seg in self._maps.items() if not _same_file(p, seg)]:
            self._remove(path)
        while self._bytes > self.max_bytes and len(self._maps) > 1:
            self._remove(next(iter(self._maps)))

    def _remove(self, path: Path) -> None:
        seg = self._maps.pop(path, None)
        if seg is None:
            return
        self._bytes -= seg.size
        # Unmapping the last mapping of an evicted segment frees its pages,
        # which costs about as much as the load itself: do it on the retirer
        # thread, not on the path of the load that noticed it.
        self._retired.append(seg)
        if self._retirer is None:
            self._retirer = threading.Thread(
                target=self._retire_loop, name="kvc-unmap", daemon=True
            )
            self._retirer.start()
        self._wake.set()

    def _retire_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._retired:
                # Dropping the last reference unmaps. No explicit close: a load
                # that fetched this segment just before it was retired may still
                # be copying from it, and then that load's reference is the last.
                seg = self._retired.popleft()
                del seg

    def drop(self, path: Path) -> None:
        """Forget the mapping of ``path`` (damaged, or known to be gone)."""
        with self._lock:
            self._remove(path)

    def clear(self) -> None:
        with self._lock:
            for path in list(self._maps):
                self._remove(path)


def _same_file(path: Path, seg: _Segment) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_ino, st.st_dev, st.st_size) == (seg.ino, seg.dev, seg.size)


SEGMENTS: Final = SegmentMaps()
"""The mappings of this process (one per process; tiers share it)."""


def _unlink(path: Path) -> int:
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    return 1


def build_tiers(configs: Mapping[TierKind, TierConfig] | list[TierConfig]) -> dict[TierKind, Tier]:
    """Tiers by kind; each kind at most once."""
    items = list(configs.values()) if isinstance(configs, Mapping) else list(configs)
    tiers: dict[TierKind, Tier] = {}
    for cfg in items:
        if cfg.kind in tiers:
            raise InvalidCacheValue("tiers", f"tier {cfg.kind.value!r} configured twice")
        tiers[cfg.kind] = Tier(cfg)
    return tiers


class TierStore:
    """The tiers as cache-meta's ``RowStore``: the file effects the sole writer asks for."""

    def __init__(self, tiers: Mapping[TierKind, Tier], counters: CounterAdd | None = None) -> None:
        self.tiers = dict(tiers)
        self.counters = counters

    def tier(self, kind: TierKind) -> Tier:
        try:
            return self.tiers[kind]
        except KeyError:
            raise InvalidCacheValue("tier", f"tier {kind!r} is not configured") from None

    def delete(self, tier: TierKind, key: bytes, location: str) -> None:
        """Remove a row's file (missing is fine)."""
        self.tier(tier).delete(location)

    def adopt(self, tier: TierKind, key: bytes, location: str | None) -> Adopted | None:
        """Validate the final file of an abandoned reservation; unlink it if it is junk."""
        t = self.tier(tier)
        where = location if location is not None else t.location_for(key)
        if t.key_of(where) != key:
            raise InvalidCacheValue("location", f"{where} is not the file of this key")
        try:
            meta = t.read_meta(where)
        except RowMissing:
            return None
        except KvcCorrupt as exc:
            log.warning("cache.orphan_corrupt", tier=tier, path=where, reason=exc.reason)
            discard_damaged(t, where, self.counters)
            return None
        return Adopted(meta=meta, location=where)

    def persist_stats(self, tier: TierKind, location: str, hits: int, last_used_ns: int) -> None:
        """Write a row's hit count and last use back into its header."""
        self.tier(tier).persist_stats(location, hits, last_used_ns)

    def exists(self, tier: TierKind, location: str) -> bool:
        return self.tier(tier).exists(location)


def discard_damaged(
    tier: Tier,
    key_or_location: bytes | str | os.PathLike[str],
    counters: CounterAdd | None = None,
) -> bool:
    """Unlink a row found damaged; count it (``corrupt_files``) if this call removed it.

    Counting only the removal counts a damaged row once however many readers
    find it: two processes loading it at once, or a loader and a later scan,
    all try to remove it and only one succeeds.
    """
    removed = tier.delete(key_or_location)
    if removed and counters is not None:
        counters.add("corrupt_files")
    return removed


def _damaged(
    tier: Tier,
    key_or_location: bytes | str | os.PathLike[str],
    exc: KvcCorrupt,
    counters: CounterAdd | None,
) -> None:
    log.warning("cache.corrupt_row", tier=tier.name, row=str(key_or_location), reason=exc.reason)
    discard_damaged(tier, key_or_location, counters)


def load(
    tier: Tier,
    key_or_location: bytes | str | os.PathLike[str],
    buffer: Buffer,
    counters: CounterAdd | None = None,
) -> int | None:
    """:func:`load_row`, answering the payload's length (or None for a miss)."""
    meta = load_row(tier, key_or_location, buffer, counters)
    return None if meta is None else meta.payload_len


def load_row(
    tier: Tier,
    key_or_location: bytes | str | os.PathLike[str],
    buffer: Buffer,
    counters: CounterAdd | None = None,
) -> KvcMeta | None:
    """A loader's read: the row's validated meta, its payload in ``buffer``
    (``meta.payload_len`` bytes), or None for a miss.

    A corrupt row (any record: the logits a row keeps included) is deleted
    and counted once (``corrupt_files``) and reads as a miss, so its bytes can
    never reach ``llama_state_seq_set_data``; the caller should also tell
    cache-meta to forget the row. ``load_total_ns`` accumulates the time of
    successful loads.
    """
    started = time.perf_counter_ns()
    try:
        meta = tier.read_row_into(key_or_location, buffer)
    except RowMissing:
        return None
    except KvcCorrupt as exc:
        _damaged(tier, key_or_location, exc, counters)
        return None
    if counters is not None:
        counters.add("load_total_ns", time.perf_counter_ns() - started)
    return meta


@contextlib.contextmanager
def load_mapped(
    tier: Tier,
    key_or_location: bytes | str | os.PathLike[str],
    counters: CounterAdd | None = None,
) -> Iterator[memoryview | None]:
    """:func:`load_mapped_row`'s payload alone (or None for a miss)."""
    with load_mapped_row(tier, key_or_location, counters) as row:
        yield None if row is None else row.payload


@contextlib.contextmanager
def load_mapped_row(
    tier: Tier,
    key_or_location: bytes | str | os.PathLike[str],
    counters: CounterAdd | None = None,
    *,
    check_beside: bool = False,
) -> Iterator[LoadedRow | None]:
    """:func:`load_row` without the copy, for a ``ram`` row: its validated payload
    in place, with its meta.

    Yields the row (see :meth:`Tier.mapped_row` for how long its payload may
    be used, and for ``check_beside``), or None for a miss; a damaged row is
    deleted and counted once, as by :func:`load_row`, also when its
    checksum, run beside the block, fails there (the :class:`KvcCorrupt`
    then leaves the block).
    """
    started = time.perf_counter_ns()
    view: LoadedRow | None = None
    try:
        with contextlib.ExitStack() as stack:
            try:
                view = stack.enter_context(
                    tier.mapped_row(key_or_location, check_beside=check_beside)
                )
            except RowMissing:
                pass
            except KvcCorrupt as exc:
                _damaged(tier, key_or_location, exc, counters)
            else:
                if counters is not None:
                    counters.add("load_total_ns", time.perf_counter_ns() - started)
            yield view
    except KvcCorrupt as exc:
        # The checksum run beside the block failed (in the block's check()
        # or on its way out).
        if view is None or exc.reason != "payload_crc":
            raise
        _damaged(tier, key_or_location, exc, counters)
        raise
