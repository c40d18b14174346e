"""A validated :class:`~llamad.config.schema.LlamadConfig` into what the daemon's parts start with.

- :func:`cache_settings`: cache-meta's ``CacheSettings`` (tiers with a quota
  above 0, counters and permits in the runtime directory, the registry).
- :func:`worker_spec`: one model worker's ``WorkerSpec`` (``ContextOptions``,
  ``ModelOptions``, ``WorkerConfig`` with the model's merged ``CachePolicy``,
  the ``ThreadPolicy``, the cache settings and the model's ``CacheViewConfig``,
  timeouts).
- :func:`cache_view_config`: the model's ``CacheViewConfig``, checked against
  the cache's tiers.
- :func:`limits`: the sockets' message size ``Limits``.
- :func:`curve_server`: the daemon's CURVE keys, read from their files; a
  worker spec carries the files (``RemoteAccess``), never the keys.

Every class checks itself when built; a refusal is re-raised as a
:class:`~llamad.errors.ConfigError` naming the *config key* that set the
field (``details["path"]`` its segments, ``details["problem"]`` the reason),
so the error a user sees at load time points into their file.
:func:`conversion_problems` builds every part once, piece by piece, when the
config is loaded, so a config that loads always converts.

Nothing here loads libllama: ``ContextOptions``, ``ModelOptions`` and
``check_gguf`` are plain Python (the root converts the config and never loads
a model, SPEC P9).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final, TypeVar

from llamad.actors.curve import CurveServer, RemoteAccess
from llamad.actors.errors import ActorConfigError
from llamad.actors.wire import Limits
from llamad.cache.kv_publish import KvEventsSettings
from llamad.cache.lookup import LookupPolicy
from llamad.cache.policy import CachePolicy
from llamad.cache.pressure import PressureConfig
from llamad.cache.remote import RemoteConfig
from llamad.cache.settings import CacheSettings
from llamad.cache.tier_kind import TierKind, check_save_tier
from llamad.cache.tiers import SHM_ROOT, TierConfig
from llamad.config.keys import fields_of
from llamad.config.model_schema import ModelConfig, ModelPolicy, ModelThreads
from llamad.config.problems import KeyPath, Problems, format_key
from llamad.config.schema import LlamadConfig
from llamad.errors import ConfigError, LlamadError
from llamad.llama_ffi.gguf_check import check_gguf
from llamad.llama_ffi.options import ContextOptions, ModelOptions, default_threads
from llamad.model.cache_view_config import CacheViewConfig
from llamad.model.config import MarkerPair, WorkerConfig
from llamad.model.threads import ThreadPolicy
from llamad.model.worker_spec import WorkerSpec
from llamad.paths import KV_EVENTS_FILE

__all__ = [
    "cache_policy",
    "cache_settings",
    "cache_view_config",
    "context_options",
    "conversion_problems",
    "curve_server",
    "limits",
    "model_options",
    "thread_policy",
    "worker_config",
    "worker_spec",
]

T = TypeVar("T")

COUNTERS_FILE: Final = "cache-counters"
PERMITS_FILE: Final = "cache-permits"

_CONTEXT_KEYS: Final = tuple(
    f.name for f in dataclasses.fields(ContextOptions) if f.name != "kv_unified"
)
# Not configured: ``vocab_only`` (a worker needs weights) and ``repack`` (off
# only under ``deterministic``: WorkerSpec.load_options).
_MODEL_OPTION_KEYS: Final = tuple(
    f.name for f in dataclasses.fields(ModelOptions) if f.name not in ("vocab_only", "repack")
)
_POLICY_KEYS: Final = tuple(f.name for f in dataclasses.fields(CachePolicy))
_GOVERNOR_KEYS: Final = tuple(f.name for f in fields_of(ModelThreads))
_FIELD_PREFIX: Final = re.compile(r"^(?:worker spec |cache policy |worker )?([A-Za-z_][\w.]*):\s*")


def _field_and_problem(exc: LlamadError) -> tuple[str, str]:
    """The library field a refusal names, and the reason without the field."""
    field = exc.details.get("field")
    match = _FIELD_PREFIX.match(exc.message)
    if not isinstance(field, str) or not field:
        field = match.group(1) if match else ""
    problem = exc.message[match.end() :] if match and match.group(1) == field else exc.message
    return field, problem


def _refusal(key: KeyPath, problem: str) -> ConfigError:
    name = format_key(key)
    return ConfigError(
        f"{name}: {problem}", details={"field": name, "path": list(key), "problem": problem}
    )


def _built(build: Callable[[], T], key_of: Callable[[str], KeyPath]) -> T:
    """``build()``, its refusal re-raised naming the config key of the field."""
    try:
        return build()
    except LlamadError as exc:
        if isinstance(exc, ConfigError) and "path" in exc.details:
            raise  # already names a config key
        field, problem = _field_and_problem(exc)
        raise _refusal(key_of(field), problem) from None


def _under(prefix: KeyPath, rename: dict[str, KeyPath] | None = None) -> Callable[[str], KeyPath]:
    def key_of(field: str) -> KeyPath:
        if rename and field in rename:
            return rename[field]
        last = field.rpartition(".")[2]
        return (*prefix, last) if last else prefix

    return key_of


# -- the cache ----------------------------------------------------------------


def tier_configs(config: LlamadConfig) -> tuple[TierConfig, ...]:
    """The tiers with a quota above 0, fastest first."""
    c = config.cache

    def tier(kind: TierKind, root: str | None, quota: int) -> TierConfig:
        assert root is not None, "resolved by load_config"
        return _built(
            lambda: TierConfig(kind, Path(root), quota, c.instance),
            _under(("cache", kind.value), {"instance": ("cache", "instance")}),
        )

    return tuple(
        tier(kind, root, quota)
        for kind, root, quota in (
            (TierKind.RAM, str(SHM_ROOT), c.ram.quota),
            (TierKind.RAM_FILE, c.ram_file.root, c.ram_file.quota),
            (TierKind.DISK, c.disk.root, c.disk.quota),
        )
        if quota > 0
    )


def cache_settings(config: LlamadConfig) -> CacheSettings:
    """cache-meta's settings: counters and writer permits in the runtime directory."""
    c = config.cache
    lookup = _built(
        lambda: LookupPolicy(
            common_min_tokens=c.lookup.common_min_tokens,
            restore_cost=c.lookup.restore_cost,
            allow_common=c.lookup.allow_common,
        ),
        _under(("cache", "lookup")),
    )
    p = c.pressure
    pressure = _built(
        lambda: PressureConfig(
            enabled=p.enabled,
            source=p.source,
            interval_s=p.interval_s,
            high_watermark=p.high_watermark,
            low_watermark=p.low_watermark,
            min_evict_bytes=p.min_evict_bytes,
            evict_tiers=tuple(TierKind(t) for t in p.evict_tiers),
        ),
        _under(("cache", "pressure")),
    )
    r = c.remote
    url = r.url
    if url is not None and importlib.util.find_spec("redis") is None:
        raise _refusal(
            ("cache", "remote", "url"),
            "the remote tier needs the redis package: install llamad[remote]",
        )
    remote = (
        None
        if url is None
        else _built(
            lambda: RemoteConfig(
                url=url,
                prefix=r.prefix,
                quota=r.quota,
                chunk_bytes=r.chunk_bytes,
                timeout_ms=r.timeout_ms,
                fetch_timeout_ms=r.fetch_timeout_ms,
                min_tokens=r.min_tokens,
                retry_min_ms=r.retry_min_ms,
                retry_max_ms=r.retry_max_ms,
            ),
            _under(("cache", "remote")),
        )
    )
    tiers = tier_configs(config)
    runtime = config.runtime_dir
    dir_key: KeyPath = ("daemon", "runtime_dir")
    k = config.kv_events
    kv_events = None
    if k.enabled:
        assert k.endpoint is not None, "resolved by load_config"
        kv_events = _built(
            lambda: KvEventsSettings(
                endpoint=k.endpoint or "",
                replay_endpoint=k.replay_endpoint,
                topic=k.topic or "",
                block_size=k.block_size,
                buffer_steps=k.buffer_steps,
                info_path=str(runtime / KV_EVENTS_FILE),
            ),
            _under(("kv_events",)),
        )
    return _built(
        lambda: CacheSettings(
            tiers=tiers,
            counters_path=runtime / COUNTERS_FILE,
            permits_path=runtime / PERMITS_FILE,
            registry_root=config.registry_root,
            reservation_ttl_s=c.reservation_ttl_s,
            max_wait_s=c.max_wait_s,
            stats_flush_s=c.stats_flush_s,
            save_permits=c.save_permits,
            prefetch_bytes=c.disk.prefetch,
            lookup=lookup,
            pressure=pressure,
            promote_hits=c.promote_hits,
            write_behind=c.disk.write_behind,
            stop_moves_s=c.stop_moves_s,
            liveness_timeout=c.liveness_s,
            remote=remote,
            kv_events=kv_events,
        ),
        _under(
            ("cache",),
            {
                "tiers": ("cache",),
                "counters_path": dir_key,
                "permits_path": dir_key,
                "registry_root": dir_key,
                "max_wait": ("cache", "max_wait_s"),
                "reservation_ttl": ("cache", "reservation_ttl_s"),
                "prefetch_bytes": ("cache", "disk", "prefetch"),
                "write_behind": ("cache", "disk", "write_behind"),
                "liveness_timeout": ("cache", "liveness_s"),
            },
        ),
    )


def limits(config: LlamadConfig) -> Limits:
    """Message size limits of the daemon's client-facing sockets."""
    s = config.security
    return _built(
        lambda: Limits(
            max_frame_bytes=s.max_message_bytes,
            max_header_bytes=s.max_header_bytes,
            peer_idle_s=s.peer_idle_s,
            max_peers=s.max_peers,
        ),
        _under(("security",), {"max_frame_bytes": ("security", "max_message_bytes")}),
    )


def curve_server(config: LlamadConfig) -> CurveServer | None:
    """The daemon's CURVE keys (``None``: CURVE off), read and checked."""
    files = config.security.curve_files()
    if files is None:
        return None
    try:
        return files.load()
    except ActorConfigError as exc:
        raise _refusal(
            ("security", exc.field), exc.message.removeprefix(f"{exc.field}: ")
        ) from None


def remote_access(config: LlamadConfig) -> RemoteAccess | None:
    """How a worker is reached from other hosts: on the endpoint's tcp host,
    with the daemon's CURVE keys (``None``: the endpoint is ipc)."""
    host = config.tcp_host
    if host is None:
        return None
    return RemoteAccess(host, config.security.curve_files())


# -- one model ----------------------------------------------------------------


def _model_key(model_id: str, *rest: str) -> KeyPath:
    return ("models", model_id, *rest)


def context_options(config: LlamadConfig, model_id: str) -> ContextOptions:
    """The model's context: its keys, ``kv_unified`` always on (any sequence may
    restore any row), thread counts defaulting to the daemon's CPUs capped by
    the thread budget."""
    m = config.model(model_id)
    values: dict[str, Any] = {k: getattr(m, k) for k in _CONTEXT_KEYS}
    cpus = min(default_threads(), config.daemon.threads.cores or default_threads())
    for name in ("n_threads", "n_threads_batch"):
        if values[name] is None:
            values[name] = cpus
    return _built(lambda: ContextOptions(kv_unified=True, **values), _under(_model_key(model_id)))


def model_options(config: LlamadConfig, model_id: str) -> ModelOptions:
    m = config.model(model_id)
    values = {k: getattr(m, k) for k in _MODEL_OPTION_KEYS}
    return _built(lambda: ModelOptions(**values), _under(_model_key(model_id)))


def _overridden(table: ModelPolicy | ModelThreads) -> set[str]:
    return {f.name for f in fields_of(type(table)) if getattr(table, f.name) is not None}


def cache_policy(config: LlamadConfig, model_id: str) -> CachePolicy:
    """``[cache.policy]`` with the model's overrides."""
    own = config.model(model_id).cache.policy
    overridden = _overridden(own)
    values = {
        k: getattr(own, k) if k in overridden else getattr(config.cache.policy, k)
        for k in _POLICY_KEYS
    }

    def key_of(field: str) -> KeyPath:
        if field in overridden:
            return _model_key(model_id, "cache", "policy", field)
        return ("cache", "policy", field) if field else _model_key(model_id, "cache", "policy")

    return _built(lambda: CachePolicy(**values), key_of)


def _markers(model_id: str, m: ModelConfig, name: str) -> MarkerPair | None:
    table = getattr(m, name)
    if table is None:
        return None
    return _built(
        lambda: MarkerPair(open=table.open, close=table.close), _under(_model_key(model_id, name))
    )


def worker_config(
    config: LlamadConfig, model_id: str, policy: CachePolicy | None = None
) -> WorkerConfig:
    """The core's configuration (``policy``: :func:`cache_policy` unless given)."""
    m = config.model(model_id)
    chosen = policy if policy is not None else cache_policy(config, model_id)
    thinking, tool_call = _markers(model_id, m, "thinking"), _markers(model_id, m, "tool_call")
    return _built(
        lambda: WorkerConfig(
            n_ctx=m.n_ctx,
            n_batch=m.n_batch,
            n_seq_max=m.n_seq_max,
            max_queue=m.max_queue,
            prefill_chunk_size=m.prefill_chunk_size,
            strategy=m.strategy,
            policy=chosen,
            thinking=thinking,
            tool_call=tool_call,
            miss_window=m.miss_window,
            live_reuse=m.live_reuse,
            release_saved_idle=m.release_saved_idle,
        ),
        _under(_model_key(model_id)),
    )


def cache_view_config(
    config: LlamadConfig, model_id: str, settings: CacheSettings | None = None
) -> CacheViewConfig:
    """The tiers the model saves to and restores from, checked against the cache's."""
    v = config.model(model_id).cache
    key_of = _under(
        _model_key(model_id, "cache"),
        {"supplied_fingerprint": _model_key(model_id, "cache", "fingerprint")},
    )
    view = _built(
        lambda: CacheViewConfig(
            save_tier=check_save_tier(v.save_tier),
            restore_tiers=frozenset(TierKind(t) for t in v.restore_tiers or tuple(TierKind)),
            fingerprint_mode=v.fingerprint_mode,  # type: ignore[arg-type]  # checked by the class
            supplied_fingerprint=None if v.fingerprint is None else bytes.fromhex(v.fingerprint),
            lookup_timeout_s=v.lookup_timeout_s,
            cooldown_s=v.cooldown_s,
            sync_save_timeout_s=v.sync_save_timeout_s,
            writer_threads=v.writer_threads,
        ),
        key_of,
    )
    tiers = (settings or cache_settings(config)).tiers
    _built(lambda: view.check_against({t.kind: t.quota for t in tiers}), key_of)
    return view


def _governor_defaults() -> dict[str, Any]:
    return {
        f.name: f.default
        for f in dataclasses.fields(ThreadPolicy)
        if f.name in _GOVERNOR_KEYS and f.default is not dataclasses.MISSING
    }


def thread_policy(
    config: LlamadConfig, model_id: str, context: ContextOptions | None = None
) -> ThreadPolicy | None:
    """The governor's policy for the model; ``None`` when nothing is configured
    (the worker then makes the default one from its own CPUs)."""
    daemon = config.daemon.threads
    own = config.model(model_id).threads
    overridden = _overridden(own)
    values = {k: getattr(own, k) if k in overridden else getattr(daemon, k) for k in _GOVERNOR_KEYS}
    if daemon.cores is None and values == _governor_defaults():
        return None
    ctx = context if context is not None else context_options(config, model_id)

    def key_of(field: str) -> KeyPath:
        name = field.rpartition(".")[2]
        if name == "max_threads":
            return _model_key(model_id, "n_threads")
        if name in overridden:
            return _model_key(model_id, "threads", name)
        return ("daemon", "threads", name) if name else ("daemon", "threads")

    return _built(
        lambda: ThreadPolicy(
            max_threads=max(ctx.n_threads, ctx.n_threads_batch),
            cores=daemon.cores or default_threads(),
            **values,
        ),
        key_of,
    )


def worker_spec(config: LlamadConfig, model_id: str) -> WorkerSpec:
    """What ``model_id``'s worker process is started with, its
    :class:`CacheViewConfig` (:func:`cache_view_config`) included."""
    m = config.model(model_id)
    context = context_options(config, model_id)
    settings = cache_settings(config)
    view = cache_view_config(config, model_id, settings)
    return _built(
        lambda: WorkerSpec(
            model_id=model_id,
            model_path=m.path,
            context=context,
            worker=worker_config(config, model_id),
            model=model_options(config, model_id),
            cache=settings,
            registry_root=str(config.registry_root),
            decode_timeout_ms=m.decode_timeout_ms,
            liveness_s=m.liveness_s,
            load_timeout_s=m.load_timeout_s,
            threads=thread_policy(config, model_id, context),
            cache_view=view,
            remote=remote_access(config),
            adapter_dirs=tuple(str(d) for d in config.model_dirs),
            deterministic=m.deterministic,
        ),
        _under(
            _model_key(model_id),
            {"model_id": _model_key(model_id), "model_path": _model_key(model_id, "path")},
        ),
    )


# -- every part, once, at load time -------------------------------------------


def _collect(problems: Problems, build: Callable[[], T]) -> T | None:
    try:
        return build()
    except ConfigError as exc:
        path = exc.details.get("path")
        key = tuple(path) if isinstance(path, list) else ()
        if not problems.has(key):  # the reader already said what is wrong with it
            problems.add(key, str(exc.details.get("problem", exc.message)))
        return None


def conversion_problems(config: LlamadConfig, problems: Problems, model_ids: Iterable[str]) -> None:
    """Build the cache's settings and each of ``model_ids``' parts; add what
    refuses to ``problems``. Each model's parts are built apart, so one bad
    part does not hide another's problem."""
    settings = _collect(problems, lambda: cache_settings(config))
    _collect(problems, lambda: limits(config))
    for model_id in model_ids:
        _model_problems(config, model_id, settings, problems)


def _model_problems(
    config: LlamadConfig, model_id: str, settings: CacheSettings | None, problems: Problems
) -> None:
    before = len(problems)
    try:
        check_gguf(config.model(model_id).path)
    except LlamadError as exc:
        problems.add(_model_key(model_id, "path"), exc.message)
        return
    context = _collect(problems, lambda: context_options(config, model_id))
    _collect(problems, lambda: model_options(config, model_id))
    policy = _collect(problems, lambda: cache_policy(config, model_id))
    _collect(problems, lambda: worker_config(config, model_id, policy or CachePolicy()))
    if settings is not None:
        _collect(problems, lambda: cache_view_config(config, model_id, settings))
    if context is not None:
        _collect(problems, lambda: thread_policy(config, model_id, context))
    if settings is not None and len(problems) == before:
        _collect(problems, lambda: worker_spec(config, model_id))
