"""The configuration's shape: ``[daemon]``, ``[cache]``, ``[security]``, ``[models.<id>]``.

Frozen msgspec Structs, one per table. Each key is declared once, with its
meaning and kind (:mod:`llamad.config.keys`, :mod:`llamad.config.kinds`); the reader
(:mod:`llamad.config.reader`), the reference in ``docs/internals/config.md``
and the example (:mod:`llamad.config.reference`) are all derived from these
declarations. A :class:`LlamadConfig` returned by
:func:`llamad.config.load_config` is validated as a whole and resolved (its
directories, endpoint, tier roots and model paths are concrete); build the
cache's and the workers' settings from it with its methods.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from llamad.cache.meta_wire import LIVENESS_S as META_LIVENESS_S
from llamad.cache.policy import CachePolicy
from llamad.cache.prefetch import DEFAULT_PREFETCH_BYTES
from llamad.cache.pressure import SOURCES
from llamad.cache.tiers import DEFAULT_DISK_QUOTA, DEFAULT_RAM_FILE_QUOTA, DEFAULT_RAM_QUOTA
from llamad.cache.writer import MAX_PERMITS
from llamad.config.keys import Key, Section, Tables
from llamad.config.kinds import (
    AbsPath,
    Boolean,
    Duration,
    Integer,
    ManyOf,
    Number,
    OneOf,
    PathList,
    Size,
    Text,
)
from llamad.config.model_schema import TIER_NAMES, ModelConfig
from llamad.config.sections import (
    DEFAULT_MODEL_ID,
    ClientSection,
    DaemonSection,
    HttpSection,
    Table,
    ThreadsSection,
)
from llamad.errors import ModelNotFound

if TYPE_CHECKING:
    from llamad.actors.curve import CurveFiles, CurveServer
    from llamad.actors.wire import Limits
    from llamad.cache.settings import CacheSettings
    from llamad.model.cache_view_config import CacheViewConfig
    from llamad.model.threads import ThreadPolicy
    from llamad.model.worker_spec import WorkerSpec

__all__ = [
    "DEFAULT_MODEL_ID",
    "CacheSection",
    "ClientSection",
    "DaemonSection",
    "HttpSection",
    "KvEventsSection",
    "LlamadConfig",
    "SecuritySection",
    "ThreadsSection",
]

MIB = 1 << 20

_seconds = Duration(positive=True)
_count = Integer(ge=1)


class RamTier(Table, frozen=True, kw_only=True):
    """The ``ram`` tier: shared memory, the fastest; purged when the daemon stops,
    after a clean stop has demoted its rows to ``ram_file``."""

    quota: Annotated[
        int,
        Key(
            "Bytes this tier may hold (0 turns it off). Saves land here while it has "
            "room; its least recently used rows then demote to ram_file.",
            Size(),
        ),
    ] = DEFAULT_RAM_QUOTA


class RamFileTier(Table, frozen=True, kw_only=True):
    """The ``ram_file`` tier: files on tmpfs, survive a daemon restart."""

    quota: Annotated[
        int,
        Key(
            "Bytes this tier may hold (0 turns it off). It takes the rows ram demotes "
            "(a link, no copy, when both are on /dev/shm as by default) and ram's rows at "
            "a clean stop, so keep it at least as large as ram; its least recently used "
            "rows demote to disk.",
            Size(),
        ),
    ] = DEFAULT_RAM_FILE_QUOTA
    root: Annotated[
        str | None,
        Key(
            "Its directory (on tmpfs, so that it survives the daemon, unlike a systemd "
            "RuntimeDirectory).",
            AbsPath(),
            default_text="/dev/shm/llamad-<uid>/<cache.instance>",
            example="/dev/shm/llamad",
        ),
    ] = None


class DiskTier(Table, frozen=True, kw_only=True):
    """The ``disk`` tier: files that survive a reboot."""

    quota: Annotated[
        int,
        Key(
            "Bytes this tier may hold (0 turns it off). Its least recently used rows are deleted.",
            Size(),
        ),
    ] = DEFAULT_DISK_QUOTA
    root: Annotated[
        str | None,
        Key(
            "Its directory.",
            AbsPath(),
            default_text="<state_dir>/kvc",
            example="/var/lib/llamad/kvc",
        ),
    ] = None
    prefetch: Annotated[
        int,
        Key(
            "Bytes of the most recently used rows read into the page cache in the "
            "background when the cache starts, so the first restores after a restart "
            "or reboot do not wait for the device (0 turns it off).",
            Size(),
        ),
    ] = DEFAULT_PREFETCH_BYTES
    write_behind: Annotated[
        bool,
        Key(
            "Copy every row saved in ram or ram_file to this tier in the background, one "
            "at a time, so that it survives a reboot (false: rows reach disk only by "
            "demotion).",
            Boolean(),
        ),
    ] = True


_POLICY = CachePolicy()


class PolicySection(Table, frozen=True, kw_only=True):
    """When a model saves, and at which length (SPEC C7); ``[models.<id>.cache.policy]``
    overrides any key for one model."""

    min_tokens: Annotated[
        int, Key("No save of fewer tokens (a short prefill beats a restore).", Integer(ge=0))
    ] = _POLICY.min_tokens
    cold_min_tokens: Annotated[
        int, Key("A cold prefill is saved only if at least this long.", Integer(ge=0))
    ] = _POLICY.cold_min_tokens
    cold_max_tokens: Annotated[
        int, Key("... and saved at most this long (>= cold_min_tokens).", Integer(ge=0))
    ] = _POLICY.cold_max_tokens
    continued_interval: Annotated[int, Key("Tokens generated between continued saves.", _count)] = (
        _POLICY.continued_interval
    )
    boundary_trim_tokens: Annotated[
        int, Key("Tail tokens a cold save leaves out.", Integer(ge=0))
    ] = _POLICY.boundary_trim_tokens
    boundary_align_tokens: Annotated[
        int, Key("A cold save's length is rounded down to a multiple of this.", _count)
    ] = _POLICY.boundary_align_tokens
    session_resume_wait_ms: Annotated[
        int,
        Key(
            "How long a lookup with a parent key waits for an in-flight finish save.",
            Duration(unit="ms"),
        ),
    ] = _POLICY.session_resume_wait_ms
    evict_save_timeout_ms: Annotated[
        int, Key("Cap of a synchronous evict or shutdown save.", Duration(unit="ms"))
    ] = _POLICY.evict_save_timeout_ms


class LookupSection(Table, frozen=True, kw_only=True):
    """When restoring a diverging row and truncating it beats a shorter prefix."""

    common_min_tokens: Annotated[
        int,
        Key(
            "A diverging row is used only if it covers this many prompt tokens (a row "
            "that starts with the whole prompt, its earlier turn saved with the reply, "
            "is an exact hit whatever the prompt's length).",
            _count,
        ),
    ] = 256
    restore_cost: Annotated[
        float,
        Key("Cost of restoring one token relative to prefilling one.", Number(ge=0, le=1)),
    ] = 0.05
    allow_common: Annotated[
        bool, Key("Restore diverging rows at all (false: exact prefixes only).", Boolean())
    ] = True


class PressureSection(Table, frozen=True, kw_only=True):
    """The memory-pressure scheduler (SPEC C9): evicts when memory runs short."""

    enabled: Annotated[bool, Key("Run it (off by default).", Boolean())] = False
    source: Annotated[
        str,
        Key(
            "What is sampled: system memory, GPU memory (nvidia_smi), or nothing (noop).",
            OneOf(tuple(s for s in SOURCES if s != "callable")),
        ),
    ] = "system"
    interval_s: Annotated[float, Key("Seconds between checks.", _seconds)] = 5.0
    high_watermark: Annotated[
        float, Key("Evict when the used share exceeds this.", Number(gt=0, le=1))
    ] = 0.85
    low_watermark: Annotated[
        float, Key("... down to this share (< high_watermark).", Number(ge=0, lt=1))
    ] = 0.75
    min_evict_bytes: Annotated[int, Key("Smallest eviction worth doing.", Size())] = MIB
    evict_tiers: Annotated[
        tuple[str, ...], Key("The tiers it evicts from.", ManyOf(TIER_NAMES))
    ] = ("ram", "ram_file")


class CacheSection(Table, frozen=True, kw_only=True):
    """The KV cache: tiers and quotas, policy, lookup, pressure, writers."""

    instance: Annotated[
        str,
        Key(
            "Names this daemon's cache on the host: ram segments and the default ram_file "
            "directory carry it, so two daemons on one host need different instances.",
            Text(pattern=r"[A-Za-z0-9_-]{1,64}", hint="[A-Za-z0-9_-], 1 to 64 characters"),
        ),
    ] = "default"
    ram: Annotated[RamTier, Section("The ram tier.")] = msgspec.field(default_factory=RamTier)
    ram_file: Annotated[RamFileTier, Section("The ram_file tier.")] = msgspec.field(
        default_factory=RamFileTier
    )
    disk: Annotated[DiskTier, Section("The disk tier.")] = msgspec.field(default_factory=DiskTier)
    save_permits: Annotated[
        int, Key("Saves written at once, daemon-wide.", Integer(ge=1, le=MAX_PERMITS))
    ] = 4
    reservation_ttl_s: Annotated[
        float, Key("A save reservation not completed in this time is reaped.", _seconds)
    ] = 60.0
    max_wait_s: Annotated[
        float, Key("Longest a lookup may wait for an in-flight save.", _seconds)
    ] = 60.0
    stats_flush_s: Annotated[
        float, Key("How often hit counts are written back into file headers.", _seconds)
    ] = 10.0
    promote_hits: Annotated[
        int,
        Key(
            "A row restored from a slower tier than the model could read gets a copy in "
            "the faster one (a link from ram_file to ram) once it has been hit this many "
            "times in its life (0: never).",
            Integer(ge=0, le=2**32 - 1),
        ),
    ] = 2
    stop_moves_s: Annotated[
        float,
        Key(
            "How long a clean stop may spend demoting ram rows to ram_file and finishing "
            "copies to disk (what is left is picked up at the next start).",
            Number(ge=0, le=600),
        ),
    ] = 5.0
    liveness_s: Annotated[
        float,
        Key(
            "cache-meta's heartbeat window: silent this long (stopped, or stuck in one "
            "operation), it is killed and restarted by cache_sup. Meanwhile lookups run "
            "cold (see models.<id>.cache.lookup_timeout_s).",
            _seconds,
        ),
    ] = META_LIVENESS_S
    policy: Annotated[PolicySection, Section("The save policy (SPEC C7).")] = msgspec.field(
        default_factory=PolicySection
    )
    lookup: Annotated[LookupSection, Section("Prefix lookup.")] = msgspec.field(
        default_factory=LookupSection
    )
    pressure: Annotated[PressureSection, Section("The memory-pressure scheduler.")] = msgspec.field(
        default_factory=PressureSection
    )


class KvEventsSection(Table, frozen=True, kw_only=True):
    """Saved rows published as vLLM's KV events, for llm-d, Dynamo and llamad's own router."""

    enabled: Annotated[
        bool,
        Key(
            "Publish every row's blocks (BlockStored, BlockRemoved, AllBlocksCleared, msgpack "
            "over a ZeroMQ PUB socket) from cache-meta, with a replay socket.",
            Boolean(),
        ),
    ] = True
    endpoint: Annotated[
        str | None,
        Key(
            "The PUB socket: ipc://PATH, or tcp://HOST:PORT on loopback (beyond it only with "
            "allow_remote). Published in <runtime_dir>/kv_events.json and `llamad status`.",
            Text(hint="ipc://PATH or tcp://HOST:PORT"),
            default_text="ipc://<runtime_dir>/kv-events.sock",
            example="tcp://127.0.0.1:5557",
        ),
    ] = None
    replay_endpoint: Annotated[
        str | None,
        Key(
            "The ROUTER socket that replays buffered batches from a sequence number.",
            Text(hint="ipc://PATH or tcp://HOST:PORT"),
            default_text="ipc://<runtime_dir>/kv-events-replay.sock",
            example="tcp://127.0.0.1:5558",
        ),
    ] = None
    allow_remote: Annotated[
        bool,
        Key(
            "Let the sockets bind tcp beyond loopback. The events carry the token ids of "
            "every saved prompt, unencrypted: only on a network you trust.",
            Boolean(),
        ),
    ] = False
    topic: Annotated[
        str | None,
        Key(
            "The topic frame of every message (a SUB socket subscribes to a prefix of it).",
            Text(),
            default_text="empty",
            example="kv@llamad",
        ),
    ] = None
    block_size: Annotated[
        int,
        Key(
            "Tokens per hashed block (vLLM's default is 16 too); a router must hash prompts "
            "with the same size.",
            Integer(ge=1, le=4096),
        ),
    ] = 16
    buffer_steps: Annotated[
        int, Key("Batches kept for the replay socket.", Integer(ge=1, le=10_000_000))
    ] = 10_000


class SecuritySection(Table, frozen=True, kw_only=True):
    """What a client may make the daemon read, and how much it may send (SPEC D5)."""

    model_dirs: Annotated[
        tuple[str, ...] | None,
        Key(
            "Directories model files may come from, in the config and in load_model; "
            "a path is checked after resolving symlinks and `..`.",
            PathList(),
            default_text="<llamad cache>/models and the default model's directory",
            example=["/srv/models"],
        ),
    ] = None
    max_message_bytes: Annotated[
        int, Key("Largest message frame a peer may send (ZeroMQ MAXMSGSIZE).", Size(ge=1))
    ] = 64 * MIB
    max_header_bytes: Annotated[
        int, Key("Largest msgpack header (<= max_message_bytes).", Size(ge=1))
    ] = MIB
    peer_idle_s: Annotated[
        float,
        Key(
            "A client of the front silent this long is sent a PING; one whose connection "
            "is gone (it crashed, or its host went away) is then released and its open "
            "requests cancelled. A live client stays however long it is idle "
            "(0.05 s to 1 day).",
            _seconds,
        ),
    ] = 30.0
    max_peers: Annotated[
        int,
        Key(
            "Most clients the front knows at once; a handshake beyond it is refused "
            "(unavailable, reason too_many_peers).",
            Integer(ge=1),
        ),
    ] = 10_000
    curve_secret_key: Annotated[
        str | None,
        Key(
            "The daemon's CURVE secret key file (Z85, mode 0600; `llamad keys generate`). "
            "Set, every tcp endpoint (the front's and each worker's) is a CURVE server "
            "that lets in only curve_client_keys, and may listen beyond loopback.",
            AbsPath(),
            default_text="none: tcp on loopback only, no CURVE",
            example="/etc/llamad/server.key",
        ),
    ] = None
    curve_client_keys: Annotated[
        tuple[str, ...],
        Key(
            "Public key files of the clients allowed in over CURVE; a directory stands for "
            "every *.pub file in it (read when the daemon starts).",
            PathList(),
            default_text="none",
            example=["/etc/llamad/clients"],
        ),
    ] = ()

    def curve_files(self) -> CurveFiles | None:
        """Where the CURVE keys are (``None``: CURVE off)."""
        from llamad.actors.curve import CurveFiles  # noqa: PLC0415 (zmq, only when asked)

        if self.curve_secret_key is None:
            return None
        return CurveFiles(self.curve_secret_key, self.curve_client_keys)


class LlamadConfig(Table, frozen=True, kw_only=True):
    """The whole configuration, validated and resolved.

    ``source``: the file it was read from (``None``: defaults only).
    ``overrides``: the environment variables that set keys.
    """

    daemon: Annotated[DaemonSection, Section("The daemon process.")] = msgspec.field(
        default_factory=DaemonSection
    )
    cache: Annotated[CacheSection, Section("The KV cache.")] = msgspec.field(
        default_factory=CacheSection
    )
    security: Annotated[SecuritySection, Section("Security limits.")] = msgspec.field(
        default_factory=SecuritySection
    )
    client: Annotated[ClientSection, Section("How clients connect.")] = msgspec.field(
        default_factory=ClientSection
    )
    http: Annotated[HttpSection, Section("The HTTP gateway (OpenAI-compatible routes).")] = (
        msgspec.field(default_factory=HttpSection)
    )
    kv_events: Annotated[
        KvEventsSection, Section("KV events in vLLM's wire format (docs/internals/kv-events.md).")
    ] = msgspec.field(default_factory=KvEventsSection)
    models: Annotated[
        dict[str, ModelConfig],
        Tables("One table per model, keyed by the model id clients use.", name_hint="<id>"),
    ] = msgspec.field(default_factory=dict)
    source: str | None = None
    overrides: tuple[str, ...] = ()

    # -- resolved places ------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The client-facing endpoint the daemon binds and clients connect to."""
        assert self.daemon.endpoint is not None, "resolved by load_config"
        return self.daemon.endpoint

    @property
    def runtime_dir(self) -> Path:
        assert self.daemon.runtime_dir is not None, "resolved by load_config"
        return Path(self.daemon.runtime_dir)

    @property
    def state_dir(self) -> Path:
        assert self.daemon.state_dir is not None, "resolved by load_config"
        return Path(self.daemon.state_dir)

    @property
    def registry_root(self) -> Path:
        """The actor registry every process of this daemon registers in."""
        return self.runtime_dir / "actors"

    @property
    def model_dirs(self) -> tuple[Path, ...]:
        return tuple(Path(d) for d in self.security.model_dirs or ())

    def model(self, model_id: str) -> ModelConfig:
        """The table of ``model_id``; :class:`~llamad.errors.ModelNotFound` if none."""
        found = self.models.get(model_id)
        if found is None:
            raise ModelNotFound(
                f"no model {model_id!r} in the configuration", details={"model_id": model_id}
            )
        return found

    # -- what the daemon's parts are started with (llamad.config.convert) -----

    def _convert(self) -> Any:
        return importlib.import_module("llamad.config.convert")

    def cache_settings(self) -> CacheSettings:
        """Everything cache-meta needs to start."""
        settings: CacheSettings = self._convert().cache_settings(self)
        return settings

    def worker_spec(self, model_id: str) -> WorkerSpec:
        """What ``model_id``'s worker process is started with."""
        spec: WorkerSpec = self._convert().worker_spec(self, model_id)
        return spec

    def cache_view_config(self, model_id: str) -> CacheViewConfig:
        """Which tiers ``model_id`` saves to and restores from."""
        view: CacheViewConfig = self._convert().cache_view_config(self, model_id)
        return view

    def thread_policy(self, model_id: str) -> ThreadPolicy | None:
        """``model_id``'s thread governor policy (``None``: the worker's default)."""
        policy: ThreadPolicy | None = self._convert().thread_policy(self, model_id)
        return policy

    def limits(self) -> Limits:
        """Message size limits for the daemon's sockets."""
        limits: Limits = self._convert().limits(self)
        return limits

    def curve_server(self) -> CurveServer | None:
        """The daemon's CURVE keys, read and checked (``None``: CURVE off)."""
        server: CurveServer | None = self._convert().curve_server(self)
        return server

    @property
    def tcp_host(self) -> str | None:
        """The host of a ``tcp://`` endpoint (where the workers listen too), else ``None``."""
        if not self.endpoint.startswith("tcp://"):
            return None
        return self.endpoint[len("tcp://") :].rpartition(":")[0]
