"""cache-meta's settings: :class:`CacheSettings`, validated when built, carried by msgspec.

The settings cross a process boundary as the keyword argument of cache-meta's
child spec (msgpack, in the child's boot record) and as a JSON file for a
standalone cache-meta. Their wire form is what msgspec makes of the struct
(:meth:`CacheSettings.to_wire`, :meth:`CacheSettings.from_wire`): paths as
strings, tiers and nested policies as mappings. Reading one back runs the
same checks as building one, and a refusal names the field.

The daemon builds its settings from the config
(:func:`llamad.config.convert.cache_settings`); :meth:`CacheSettings.defaults`
lays out the three tiers the same way for a cache run on its own
(``examples/cache_standalone.py``). A private cache for tests and benchmarks
is :func:`llamad.testing.scratch_settings` (and
:func:`llamad.testing.discard_scratch`), outside the daemon's code.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Final

import msgspec

from llamad.cache.errors import InvalidCacheValue
from llamad.cache.kv_publish import KvEventsSettings
from llamad.cache.lookup import LookupPolicy
from llamad.cache.meta_config import MetaConfig
from llamad.cache.meta_wire import ACTOR_NAME, LIVENESS_S
from llamad.cache.prefetch import DEFAULT_PREFETCH_BYTES, check_budget
from llamad.cache.pressure import PressureConfig
from llamad.cache.remote import RemoteConfig
from llamad.cache.tier_kind import TierKind
from llamad.cache.tiers import (
    DEFAULT_DISK_QUOTA,
    DEFAULT_RAM_FILE_QUOTA,
    DEFAULT_RAM_QUOTA,
    SHM_ROOT,
    TierConfig,
)
from llamad.cache.writer import MAX_PERMITS, PermitSet
from llamad.errors import LlamadError

__all__ = ["CacheSettings"]

# msgspec names where a value failed as " - at `$.field`"; only a top-level
# field is named as itself (anything deeper is a malformed settings mapping).
_TOP_LEVEL_FIELD: Final = re.compile(r" - at `\$\.(\w+)`$")


def _path(field: str, value: object) -> Path:
    # A NUL or a lone surrogate would otherwise fail, untyped, only when the
    # file is opened (or the settings are sent to cache-meta).
    if not isinstance(value, str | os.PathLike) or any(
        c == "\0" or "\ud800" <= c <= "\udfff" for c in str(value)
    ):
        raise InvalidCacheValue(field, f"{value!r} is not a usable path")
    return Path(value)


def _encode(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def _decode(kind: type, value: Any) -> Any:
    if kind is Path and isinstance(value, str):
        return Path(value)
    raise NotImplementedError(f"cannot decode {kind}")


class CacheSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything cache-meta needs to start; invalid values raise naming the field.

    ``counters_path`` is the shared counters file (on tmpfs, in the daemon's
    runtime directory). ``permits_path`` is the writer-permits file, the
    daemon-wide cap of ``save_permits`` concurrent saves (``None``: beside the
    counters file, ``<counters_path>.permits``; always a path once built).
    ``registry_root`` is the actor registry directory (``None``: the runtime
    default). ``stats_flush_s`` is how often hit counts are written back into
    file headers. ``liveness_timeout``: cache-meta's heartbeat window under a
    supervisor (:data:`~llamad.cache.meta_wire.LIVENESS_S` by default; ``None``:
    no heartbeats, never found hung).
    ``prefetch_bytes`` bounds the ``disk`` rows cache-meta reads into the page
    cache when it starts, newest first (0: none; see :mod:`llamad.cache.prefetch`).
    ``promote_hits``: a row read from a slower tier than the reader could read
    is copied up once its lifetime hit count reaches this (0: never).
    ``write_behind``: rows saved in ``ram`` or ``ram_file`` get a ``disk`` copy
    in the background. ``stop_moves_s``: how long a clean stop may spend
    demoting ``ram`` rows and finishing moves (cache-meta's shutdown timeout
    in the tree is this plus 5 s). ``remote``: the shared Redis tier the
    model workers read and write (:mod:`llamad.cache.remote`; ``None``: none).
    cache-meta never touches it.
    ``kv_events``: where cache-meta publishes its rows as vLLM's KV events
    (:mod:`llamad.cache.kv_publish`; ``None``: it does not).
    """

    tiers: tuple[TierConfig, ...]
    counters_path: Path
    reservation_ttl_s: float = 60.0
    max_wait_s: float = 60.0
    lookup: LookupPolicy = msgspec.field(default_factory=LookupPolicy)
    pressure: PressureConfig = msgspec.field(default_factory=PressureConfig)
    stats_flush_s: float = 10.0
    registry_root: Path | None = None
    actor_name: str = ACTOR_NAME
    liveness_timeout: float | None = LIVENESS_S
    permits_path: Path | None = None
    save_permits: int = 4
    prefetch_bytes: int = DEFAULT_PREFETCH_BYTES
    promote_hits: int = 2
    write_behind: bool = True
    stop_moves_s: float = 5.0
    remote: RemoteConfig | None = None
    kv_events: KvEventsSettings | None = None

    def __post_init__(self) -> None:
        set_ = msgspec.structs.force_setattr
        tiers = tuple(self.tiers)
        if not tiers or not all(isinstance(t, TierConfig) for t in tiers):
            raise InvalidCacheValue("tiers", "expected at least one TierConfig")
        names = [t.kind for t in tiers]
        if TierKind.REMOTE in names:
            raise InvalidCacheValue(
                "tiers", "the remote tier is no directory of cache-meta's: configure remote"
            )
        if len(set(names)) != len(names):
            raise InvalidCacheValue("tiers", f"a tier is configured twice: {names}")
        # Tiers tell their files apart by directory alone (a ram tier by its
        # instance prefix in /dev/shm): two tiers in one directory would each
        # index, evict and delete the other's rows, and share one lock file.
        roots = [t.root for t in tiers if t.kind is not TierKind.RAM]
        if len(set(roots)) != len(roots):
            raise InvalidCacheValue("tiers", f"two tiers share a directory: {roots}")
        set_(self, "tiers", tiers)
        set_(self, "counters_path", _path("counters_path", self.counters_path))
        permits = self.permits_path
        if permits is None:
            permits = self.counters_path.with_name(f"{self.counters_path.name}.permits")
        set_(self, "permits_path", _path("permits_path", permits))
        n = self.save_permits
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PERMITS:
            raise InvalidCacheValue("save_permits", f"{n!r} is not in [1, {MAX_PERMITS}]")
        if self.registry_root is not None:
            set_(self, "registry_root", _path("registry_root", self.registry_root))
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
        if self.remote is not None and not isinstance(self.remote, RemoteConfig):
            raise InvalidCacheValue("remote", "expected a RemoteConfig or None")
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

    def permits_file(self) -> Path:
        """The writer-permits file (``permits_path``, resolved when built)."""
        assert self.permits_path is not None  # resolved in __post_init__
        return self.permits_path

    def copies_file(self) -> Path:
        """cache-meta's copy-activity board (:mod:`llamad.cache.activity`),
        beside the writer permits: ``<permits>.copies``."""
        permits = self.permits_file()
        return permits.with_name(f"{permits.name}.copies")

    def create_permits(self) -> PermitSet:
        """Create the writer-permits file; cache-meta does this whenever it starts.

        Idempotent: a restarted cache-meta finds the file in place and the
        permits live writers hold stay held (they are locks on the file, not
        its contents).
        """
        return PermitSet.create(self.permits_file(), self.save_permits)

    def attach_permits(self) -> PermitSet:
        """The permits cache-meta created (what every writer pool shares)."""
        return PermitSet.attach(self.permits_file())

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

    # -- wire (Start kwargs must be msgpack-able) -----------------------------

    def to_wire(self) -> dict[str, Any]:
        """The settings as plain msgpack/JSON values (paths as strings)."""
        wire: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_encode)
        return wire

    @classmethod
    def from_wire(cls, data: object) -> CacheSettings:
        """Settings back from :meth:`to_wire`'s form, checked as when built.

        Absent keys take the defaults. A value that fails a check raises
        :class:`~llamad.cache.errors.InvalidCacheValue` naming its field (a
        nested tier's or policy's own field where that is what failed); a
        mapping of the wrong shape names ``settings``.
        """
        try:
            return msgspec.convert(data, cls, dec_hook=_decode)
        except msgspec.ValidationError as exc:
            # A __post_init__ (ours, a tier's, a policy's) that refused a
            # value already named its field.
            if isinstance(exc.__cause__, LlamadError):
                raise exc.__cause__ from None
            message = str(exc)
            named = _TOP_LEVEL_FIELD.search(message)
            field = named.group(1) if named else "settings"
            raise InvalidCacheValue(field, f"malformed cache settings: {message}") from None
