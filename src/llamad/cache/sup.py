"""cache_sup: the cache's place in the supervision tree, and its settings.

``cache_sup`` is a ``rest_for_one`` supervisor whose first child is
cache-meta (:func:`llamad.cache.meta_proc.run_meta`); anything started after
it (a writer pool process, say) depends on it and restarts with it, while a
crash of a later child leaves cache-meta alone.

What runs where, and why (ARCHITECTURE asks for the choice to be written
down):

- **cache-meta** is its own OS process: it owns the index and every pin and
  reservation, and must survive any model worker's crash.
- **Tiers** are not processes. A tier is a directory (or a shared-memory
  namespace) plus stateless file operations any process may perform; the
  sole-writer rule is kept because only cache-meta decides what is indexed,
  evicted or adopted. A loader reads a pinned row's file directly.
- **The pressure scheduler** is a part of cache-meta's loop: its only action
  is an eviction, which must go through the sole writer anyway, and a
  cache-meta crash loses nothing of it (its state is a few numbers).
  Slow sources sample on a thread so the loop never waits on them.
- **Writers** run wherever the KV bytes are (the model worker) and talk to
  cache-meta through :class:`llamad.cache.client.CacheClient`; cache-meta
  watches their pids, so a dead writer's reservation is reaped at once. Their
  daemon-wide cap is the permits file (:class:`llamad.cache.writer.PermitSet`)
  that cache-meta creates when it starts, beside the counters file; a writer
  pool attaches to it (:meth:`llamad.cache.writer.WriterPool.from_settings`).
- **The mover** (demotions, promotions, write-behind copies to ``disk``) is
  two threads in cache-meta's process (:mod:`llamad.cache.mover`): cache-meta
  decides each move on its loop and alone changes the index; the threads do
  the file work off that loop (a link, or a tmp file written, fdatasync'ed
  and linked) and report back through an eventfd it polls. Not the writer
  pool: the cache must move rows with no model loaded, and a move's bytes
  are already in a file. A mover dies with cache-meta; the next scan deletes
  a move's ``*.tmp`` and adopts a linked destination as a copy.

The ``ram`` tier's segments belong to one daemon run: the daemon calls
:func:`purge_ram` when it starts and when it stops. A cache-meta restart in
between re-adopts them, so no published row of any tier is lost to a
cache-meta crash. A clean stop demotes them first (cache-meta, to
``ram_file`` by a link when both are on ``/dev/shm``), and the purge links
into ``ram_file`` any valid segment a crashed run left there, so no row is
lost to the purge either.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.lookup import LookupPolicy
from llamad.cache.meta import MetaConfig
from llamad.cache.meta_wire import ACTOR_NAME
from llamad.cache.mover import move_file
from llamad.cache.moves import MoveJob, MoveKind
from llamad.cache.prefetch import DEFAULT_PREFETCH_BYTES, check_budget
from llamad.cache.pressure import PressureConfig
from llamad.cache.tier_kind import TierKind, slower_tiers
from llamad.cache.tier_lock import TierLocks
from llamad.cache.tiers import (
    DEFAULT_DISK_QUOTA,
    DEFAULT_RAM_FILE_QUOTA,
    DEFAULT_RAM_QUOTA,
    SHM_ROOT,
    Tier,
    TierConfig,
)
from llamad.cache.writer import MAX_PERMITS, PermitSet
from llamad.supervisor.spec import ChildSpec, Start, Strategy, SupervisorSpec, SupFlags

__all__ = [
    "CacheSettings",
    "cache_sup_spec",
    "discard",
    "meta_child_spec",
    "purge_ram",
    "rescue_ram",
]

log = structlog.get_logger("llamad.cache.sup")

GIB = 1 << 30


def _path(field: str, value: object) -> Path:
    # A NUL or a lone surrogate would otherwise fail, untyped, only when the
    # file is opened (or the settings are sent to cache-meta).
    if not isinstance(value, str | os.PathLike) or any(
        c == "\0" or "\ud800" <= c <= "\udfff" for c in str(value)
    ):
        raise InvalidCacheValue(field, f"{value!r} is not a usable path")
    return Path(value)


@dataclass(frozen=True, slots=True)
class CacheSettings:
    """Everything cache-meta needs to start; invalid values raise naming the field.

    ``counters_path`` is the shared counters file (on tmpfs, in the daemon's
    runtime directory). ``permits_path`` is the writer-permits file, the
    daemon-wide cap of ``save_permits`` concurrent saves (``None``: beside the
    counters file, ``<counters_path>.permits``; always a path once built).
    ``registry_root`` is the actor registry directory (``None``: the runtime
    default). ``stats_flush_s`` is how often hit counts are written back into
    file headers. ``liveness_timeout`` enables heartbeats to the supervisor.
    ``prefetch_bytes`` bounds the ``disk`` rows cache-meta reads into the page
    cache when it starts, newest first (0: none; see :mod:`llamad.cache.prefetch`).
    ``promote_hits``: a row read from a slower tier than the reader could read
    is copied up once its lifetime hit count reaches this (0: never).
    ``write_behind``: rows saved in ``ram`` or ``ram_file`` get a ``disk`` copy
    in the background. ``stop_moves_s``: how long a clean stop may spend
    demoting ``ram`` rows and finishing moves (cache-meta's shutdown timeout
    in the tree is this plus 5 s).
    """

    tiers: tuple[TierConfig, ...]
    counters_path: Path
    reservation_ttl_s: float = 60.0
    max_wait_s: float = 60.0
    lookup: LookupPolicy = field(default_factory=LookupPolicy)
    pressure: PressureConfig = field(default_factory=PressureConfig)
    stats_flush_s: float = 10.0
    registry_root: Path | None = None
    actor_name: str = ACTOR_NAME
    liveness_timeout: float | None = None
    permits_path: Path | None = None
    save_permits: int = 4
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    promote_hits: int = 2
    write_behind: bool = True
    stop_moves_s: float = 5.0

    def __post_init__(self) -> None:
        tiers = tuple(self.tiers)
        if not tiers or not all(isinstance(t, TierConfig) for t in tiers):
            raise InvalidCacheValue("tiers", "expected at least one TierConfig")
        names = [t.kind for t in tiers]
        if len(set(names)) != len(names):
            raise InvalidCacheValue("tiers", f"a tier is configured twice: {names}")
        # Tiers tell their files apart by directory alone (a ram tier by its
        # instance prefix in /dev/shm): two tiers in one directory would each
        # index, evict and delete the other's rows, and share one lock file.
        roots = [t.root for t in tiers if t.kind is not TierKind.RAM]
        if len(set(roots)) != len(roots):
            raise InvalidCacheValue("tiers", f"two tiers share a directory: {roots}")
        object.__setattr__(self, "tiers", tiers)
        object.__setattr__(self, "counters_path", _path("counters_path", self.counters_path))
        permits = self.permits_path
        if permits is None:
            permits = self.counters_path.with_name(f"{self.counters_path.name}.permits")
        object.__setattr__(self, "permits_path", _path("permits_path", permits))
        n = self.save_permits
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PERMITS:
            raise InvalidCacheValue("save_permits", f"{n!r} is not in [1, {MAX_PERMITS}]")
        if self.registry_root is not None:
            object.__setattr__(self, "registry_root", _path("registry_root", self.registry_root))
        flush = self.stats_flush_s
        if isinstance(flush, bool) or not isinstance(flush, int | float) or flush <= 0:
            raise InvalidCacheValue(
                "stats_flush_s", f"{flush!r} is not a positive number of seconds"
            )
        check_budget(self.prefetch_bytes, "prefetch_bytes")
        stop = self.stop_moves_s
        if isinstance(stop, bool) or not isinstance(stop, int | float) or not 0 <= stop <= 600:
            raise InvalidCacheValue("stop_moves_s", f"{stop!r} is not in [0, 600] seconds")
        if self.liveness_timeout is not None and not self.liveness_timeout > 0:
            raise InvalidCacheValue("liveness_timeout", "must be > 0 seconds when set")
        if not isinstance(self.pressure, PressureConfig):
            raise InvalidCacheValue("pressure", "expected a PressureConfig")
        # Building the meta config validates ttl, waits and the lookup policy.
        self.meta_config()

    def meta_config(self) -> MetaConfig:
        return MetaConfig(
            quotas={t.kind: t.quota for t in self.tiers},
            reservation_ttl_s=self.reservation_ttl_s,
            max_wait_s=self.max_wait_s,
            lookup=self.lookup,
            promote_hits=self.promote_hits,
            write_behind=self.write_behind,
        )

    def tier(self, kind: TierKind) -> TierConfig | None:
        """The config of tier ``kind`` (a member or its value), if configured."""
        return next((t for t in self.tiers if t.kind == kind), None)

    def _permits_file(self) -> Path:
        assert self.permits_path is not None  # resolved in __post_init__
        return self.permits_path

    def create_permits(self) -> PermitSet:
        """Create the writer-permits file; cache-meta does this whenever it starts.

        Idempotent: a restarted cache-meta finds the file in place and the
        permits live writers hold stay held (they are locks on the file, not
        its contents).
        """
        return PermitSet.create(self._permits_file(), self.save_permits)

    def attach_permits(self) -> PermitSet:
        """The permits cache-meta created (what every writer pool shares)."""
        return PermitSet.attach(self._permits_file())

    @classmethod
    def defaults(
        cls,
        *,
        state_dir: Path,
        runtime_dir: Path,
        instance: str = "default",
        ram_quota: int = DEFAULT_RAM_QUOTA,
        ram_file_quota: int = DEFAULT_RAM_FILE_QUOTA,
        disk_quota: int = DEFAULT_DISK_QUOTA,
        ram_file_root: Path | None = None,
        **overrides: Any,
    ) -> CacheSettings:
        """All three tiers: ``ram`` in /dev/shm, ``ram_file`` under /dev/shm/llamad-<uid>,
        ``disk`` under ``state_dir/kvc``; counters and writer permits in ``runtime_dir``."""
        shm = SHM_ROOT
        tiers = (
            TierConfig(TierKind.RAM, shm, ram_quota, instance),
            TierConfig(
                TierKind.RAM_FILE,
                ram_file_root or shm / f"llamad-{os.getuid()}" / instance,
                ram_file_quota,
                instance,
            ),
            TierConfig(TierKind.DISK, Path(state_dir) / "kvc", disk_quota, instance),
        )
        fields: dict[str, Any] = {
            "counters_path": Path(runtime_dir) / "cache-counters",
            "permits_path": Path(runtime_dir) / "cache-permits",
            **overrides,
        }
        return cls(tiers=tiers, **fields)

    @classmethod
    def scratch(
        cls,
        *,
        prefix: str = "llamad-scratch",
        ram_quota: int = 64 << 20,
        ram_file_quota: int = 64 << 20,
        disk_quota: int = 256 << 20,
        **overrides: Any,
    ) -> CacheSettings:
        """A self-contained cache for tests, benchmarks and examples.

        ``ram`` segments under a unique instance, ``ram_file`` in a private
        /dev/shm directory, ``disk`` and the actor registry in a short /tmp
        directory (ipc paths must fit in 107 bytes). :func:`discard` removes
        all of it.
        """
        instance = f"{prefix}-{uuid.uuid4().hex[:12]}"
        base = Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp"))
        shm = SHM_ROOT
        tiers = (
            TierConfig(TierKind.RAM, shm, ram_quota, instance),
            TierConfig(TierKind.RAM_FILE, shm / instance, ram_file_quota, instance),
            TierConfig(TierKind.DISK, base / "disk", disk_quota, instance),
        )
        fields: dict[str, Any] = {
            "counters_path": shm / f"{instance}.counters",
            "permits_path": shm / f"{instance}.permits",
            "registry_root": base / "reg",
            **overrides,
        }
        return cls(tiers=tiers, **fields)

    # -- wire (Start kwargs must be msgpack-able) -----------------------------

    def to_wire(self) -> dict[str, Any]:
        p = self.pressure
        return {
            "tiers": [
                {
                    "kind": t.kind.value,
                    "root": str(t.root),
                    "quota": t.quota,
                    "instance": t.instance,
                }
                for t in self.tiers
            ],
            "counters_path": str(self.counters_path),
            "reservation_ttl_s": self.reservation_ttl_s,
            "max_wait_s": self.max_wait_s,
            "lookup": {
                "common_min_tokens": self.lookup.common_min_tokens,
                "restore_cost": self.lookup.restore_cost,
                "allow_common": self.lookup.allow_common,
            },
            "pressure": {
                "enabled": p.enabled,
                "source": p.source,
                "interval_s": p.interval_s,
                "high_watermark": p.high_watermark,
                "low_watermark": p.low_watermark,
                "min_evict_bytes": p.min_evict_bytes,
                "evict_tiers": list(p.evict_tiers),
            },
            "stats_flush_s": self.stats_flush_s,
            "registry_root": None if self.registry_root is None else str(self.registry_root),
            "actor_name": self.actor_name,
            "liveness_timeout": self.liveness_timeout,
            "permits_path": str(self._permits_file()),
            "save_permits": self.save_permits,
            "prefetch_bytes": self.prefetch_bytes,
            "promote_hits": self.promote_hits,
            "write_behind": self.write_behind,
            "stop_moves_s": self.stop_moves_s,
        }

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> CacheSettings:
        if not isinstance(data, Mapping):
            raise InvalidCacheValue("settings", "expected a mapping")
        try:
            tiers = tuple(
                TierConfig(
                    TierKind(t["kind"]), Path(t["root"]), int(t["quota"]), str(t["instance"])
                )
                for t in data["tiers"]
            )
            pressure = dict(data.get("pressure") or {})
            if "evict_tiers" in pressure:
                pressure["evict_tiers"] = tuple(pressure["evict_tiers"])
            lookup = data.get("lookup") or {}
            # Absent keys take the dataclass defaults (kept in one place).
            optional: dict[str, Any] = {
                name: None if data[name] is None and name in _WIRE_NULLABLE else convert(data[name])
                for name, convert in _WIRE_OPTIONAL.items()
                if name in data
            }
            return cls(
                tiers=tiers,
                counters_path=Path(data["counters_path"]),
                lookup=LookupPolicy(**lookup),
                pressure=PressureConfig(**pressure),
                **optional,
            )
        except InvalidCacheValue:
            raise  # already names its field
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidCacheValue("settings", f"malformed cache settings: {exc}") from None


def _as_is(value: Any) -> Any:
    # Validated by CacheSettings itself (a count must not be rounded into range).
    return value


# Optional settings on the wire and how each is read back.
_WIRE_OPTIONAL: Final[Mapping[str, Callable[[Any], Any]]] = {
    "reservation_ttl_s": float,
    "max_wait_s": float,
    "stats_flush_s": float,
    "registry_root": Path,
    "actor_name": str,
    "liveness_timeout": _as_is,
    "permits_path": Path,
    "save_permits": _as_is,
    "prefetch_bytes": _as_is,
    "promote_hits": _as_is,
    "write_behind": _as_is,
    "stop_moves_s": _as_is,
}
_WIRE_NULLABLE: Final = frozenset({"registry_root", "liveness_timeout", "permits_path"})


def meta_child_spec(settings: CacheSettings, *, child_id: str = "cache-meta") -> ChildSpec:
    """The child spec that runs cache-meta under a supervisor."""
    return ChildSpec(
        id=child_id,
        start=Start("llamad.cache.meta_proc:run_meta", (), {"settings": settings.to_wire()}),
        # A clean stop demotes ram rows and finishes moves for up to
        # stop_moves_s, then flushes hit counts.
        shutdown=settings.stop_moves_s + 5.0,
        liveness_timeout=settings.liveness_timeout,
        start_timeout=120.0,
    )


def cache_sup_spec(
    settings: CacheSettings,
    *,
    extra_children: Sequence[ChildSpec] = (),
    intensity: int = 5,
    period: float = 30.0,
) -> SupervisorSpec:
    """``cache_sup``: cache-meta first, then anything that depends on it (rest_for_one)."""
    return SupervisorSpec(
        "cache_sup",
        SupFlags(strategy=Strategy.REST_FOR_ONE, intensity=intensity, period=period),
        (meta_child_spec(settings), *extra_children),
    )


def discard(settings: CacheSettings) -> None:
    """Remove everything a :meth:`CacheSettings.scratch` cache created.

    Only for scratch caches: it deletes the tiers' directories, the registry,
    the counters file and the writer permits.
    """
    purge_ram(settings)
    dirs = [cfg.root for cfg in settings.tiers if cfg.kind is not TierKind.RAM]
    if settings.registry_root is not None:
        dirs.append(settings.registry_root)
    for path in dirs:
        shutil.rmtree(path, ignore_errors=True)
    settings.counters_path.unlink(missing_ok=True)
    settings._permits_file().unlink(missing_ok=True)
    for parent in {path.parent for path in dirs}:
        with contextlib.suppress(OSError):
            parent.rmdir()  # the scratch base, once empty; never a non-empty dir


def purge_ram(settings: CacheSettings) -> int:
    """Delete this daemon instance's ``ram`` segments (at daemon start and stop),
    after saving the rows they hold a tier down; returns the segments deleted.

    A clean stop has demoted its ``ram`` rows already; segments still here
    were left by a run that crashed (or ran out of its stop budget). Each
    one whose key has no file in a slower tier yet is first linked (one
    filesystem) or copied, crash-safely, into the fastest slower tier with a
    quota (:func:`rescue_ram`). Those files are judged by the next cache-meta
    start like any other: its scan validates them and its quota enforcement
    demotes what does not fit.

    Only while no cache-meta owns the tiers: with one running (this instance
    started twice), raises :class:`~llamad.cache.errors.TierLocked` and
    deletes nothing.
    """
    cfg = settings.tier(TierKind.RAM)
    if cfg is None:
        return 0
    ram = Tier(cfg)
    below = [
        Tier(c)
        for kind in slower_tiers(TierKind.RAM)
        if (c := settings.tier(kind)) is not None and c.quota > 0
    ]
    with TierLocks.take([ram, *below]):
        rescue_ram(ram, below)
        return ram.purge()


def rescue_ram(ram: Tier, below: Sequence[Tier]) -> Counter[str]:
    """Give every row segment of ``ram`` a file in the first of ``below`` (a link
    when possible), unless one of ``below`` has that key's file already.

    The caller holds the tiers' locks. Returns what happened, by outcome
    (``linked``, ``copied``, ``kept``: a file was there, ``failed``).
    """
    done: Counter[str] = Counter()
    if not below:
        return done
    target = below[0]
    for key in ram.row_keys():
        if any(t.path_for(key).exists() for t in below):
            done["kept"] += 1
            continue
        job = MoveJob(0, MoveKind.DEMOTE, key, ram.name, ram.location_for(key), target.name, 0)
        result = move_file(ram, target, job)
        if result.ok:
            done["linked" if result.linked else "copied"] += 1
        else:
            done["failed"] += 1
            log.warning("cache.ram_rescue_failed", key=key.hex(), error=result.error)
    if done:
        log.info("cache.ram_rescued", tier=target.name, **done)
    return done
