"""Read, override, validate and resolve the configuration, as a whole, before anything starts.

:func:`load_config` is the one way in. In order:

1. the TOML file (``path``, else ``$LLAMAD_CONFIG``, else none: defaults),
   read with :mod:`tomllib`; a file that cannot be read or parsed is the
   one problem that stops everything at once;
2. ``LLAMAD_*__*`` environment overrides (:mod:`llamad.config.env`);
3. every table read against the schema (:mod:`llamad.config.reader`):
   unknown keys, wrong types, bad choices, out-of-range values, missing
   required keys;
4. resolution: directories, the endpoint, tier roots and model paths take
   their defaults; the endpoint, the model directories, the CURVE key
   files and every model path are checked (:mod:`llamad.config.security`,
   :mod:`llamad.actors.curve`); with no model at all
   the default model is served as ``"smollm2"``;
5. every part the daemon will build (cache settings, limits, each model's
   context, options, worker config, policy, cache view, thread policy and
   spec) is built once (:func:`llamad.config.convert.conversion_problems`),
   each model file's GGUF header checked.

Every problem of every step is collected and raised together as one
:class:`~llamad.errors.ConfigError` (:mod:`llamad.config.problems`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from llamad.actors.errors import ActorConfigError
from llamad.actors.registry import check_name
from llamad.cache.meta_wire import ACTOR_NAME as CACHE_META
from llamad.config.client import check_client, raw_config, resolve_daemon
from llamad.config.dirs import (
    default_model_dirs,
    default_ram_file_root,
)
from llamad.config.model_schema import DEFAULT_MODEL_PATH, ModelConfig
from llamad.config.problems import KeyPath, Problems
from llamad.config.reader import read_table
from llamad.config.schema import (
    DEFAULT_MODEL_ID,
    CacheSection,
    KvEventsSection,
    LlamadConfig,
    SecuritySection,
)
from llamad.config.security import check_endpoint, check_http, resolve_model_path
from llamad.errors import ConfigError, LlamadError
from llamad.paths import default_model_path

__all__ = ["load_config"]

_SUN_PATH_MAX: Final = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_WORKER_PREFIX: Final = "model."


def _socket_fits(runtime_dir: str, actor: str) -> bool:
    return len(os.fsencode(os.path.join(runtime_dir, "actors", f"{actor}.sock"))) <= _SUN_PATH_MAX


def _resolve_cache(c: CacheSection, state_dir: str, problems: Problems) -> CacheSection:
    ram_file_root = c.ram_file.root or default_ram_file_root(c.instance)
    disk_root = c.disk.root or os.path.join(state_dir, "kvc")
    if c.ram_file.quota and c.disk.quota and ram_file_root == disk_root:
        problems.add(("cache", "disk", "root"), "is the ram_file tier's directory too")
    if not (c.ram.quota or c.ram_file.quota or c.disk.quota):
        problems.add(("cache",), "every tier has quota 0: at least one must hold bytes")
    return msgspec.structs.replace(
        c,
        ram_file=msgspec.structs.replace(c.ram_file, root=ram_file_root),
        disk=msgspec.structs.replace(c.disk, root=disk_root),
    )


def _resolve_kv_events(k: KvEventsSection, runtime_dir: str, problems: Problems) -> KvEventsSection:
    """The publisher's endpoints: ipc sockets in the runtime directory by default."""
    if not k.enabled:
        return k
    endpoint = k.endpoint or f"ipc://{os.path.join(runtime_dir, 'kv-events.sock')}"
    replay = k.replay_endpoint or f"ipc://{os.path.join(runtime_dir, 'kv-events-replay.sock')}"
    for name, value in (("endpoint", endpoint), ("replay_endpoint", replay)):
        try:
            check_endpoint(value, name, curve=k.allow_remote, curve_keys="kv_events.allow_remote")
        except ConfigError as exc:
            problems.add(("kv_events", name), exc.details["problem"])
    if endpoint == replay:
        problems.add(("kv_events", "replay_endpoint"), "is the PUB socket's endpoint too")
    return msgspec.structs.replace(k, endpoint=endpoint, replay_endpoint=replay)


def _check_curve(s: SecuritySection, problems: Problems) -> None:
    """The daemon's CURVE keys: readable, well-formed, the secret private, at
    least one client allowed. Read again by each process that binds tcp."""
    files = s.curve_files()
    if files is None:
        if s.curve_client_keys:
            problems.add(
                ("security", "curve_secret_key"),
                "is not set, but curve_client_keys is: CURVE needs the daemon's secret key",
            )
        return
    try:
        files.load()
    except ActorConfigError as exc:
        problems.add(("security", exc.field), exc.message.removeprefix(f"{exc.field}: "))


def _resolve_security(s: SecuritySection, problems: Problems) -> SecuritySection:
    _check_curve(s, problems)
    if s.model_dirs is None:
        return msgspec.structs.replace(s, model_dirs=default_model_dirs())
    for d in s.model_dirs:
        if not os.path.isdir(d):
            problems.add(("security", "model_dirs"), f"{d} is not a directory")
    return s


def _resolve_model(
    model_id: str,
    m: ModelConfig,
    config: LlamadConfig,
    problems: Problems,
) -> ModelConfig:
    key: KeyPath = ("models", model_id)
    try:
        check_name(_WORKER_PREFIX + model_id, "model id")
    except ActorConfigError:
        problems.add(
            key,
            "not a model id (a letter or digit, then letters, digits, '_', '.', '-'; "
            f"at most {64 - len(_WORKER_PREFIX)} characters)",
        )
        return m
    if not _socket_fits(str(config.runtime_dir), _WORKER_PREFIX + model_id):
        problems.add(key, f"its worker's socket path under {config.runtime_dir} is too long")
    if problems.about((*key, "path")):
        return m
    path = m.path
    if path == DEFAULT_MODEL_PATH:
        try:
            path = str(default_model_path())
        except LlamadError as exc:
            problems.add((*key, "path"), exc.message)
            return m
    try:
        real = resolve_model_path(path, config.security.model_dirs or ())
    except ConfigError as exc:
        problems.add((*key, "path"), exc.details["problem"])
        return m
    return msgspec.structs.replace(m, path=str(real))


def _default_model_path(raw: dict[str, Any]) -> None:
    """The default model's id names the default model unless a path says
    otherwise: ``LLAMAD_MODELS__SMOLLM2__N_CTX=8192`` (or a
    ``[models.smollm2]`` table with ``n_ctx`` alone) overrides one key of the
    default model, it does not declare a model without a file."""
    models = raw.get("models")
    table = models.get(DEFAULT_MODEL_ID) if isinstance(models, dict) else None
    if isinstance(table, dict) and "path" not in table:
        table["path"] = DEFAULT_MODEL_PATH


def _resolve(config: LlamadConfig, env: Mapping[str, str], problems: Problems) -> LlamadConfig:
    curve = config.security.curve_secret_key is not None
    daemon = resolve_daemon(config.daemon, env, problems, curve=curve)
    check_client(config.client, problems)
    assert daemon.runtime_dir is not None and daemon.state_dir is not None
    if not _socket_fits(daemon.runtime_dir, CACHE_META):
        problems.add(("daemon", "runtime_dir"), "is too long for the sockets under it")
    config = msgspec.structs.replace(
        config,
        daemon=daemon,
        cache=_resolve_cache(config.cache, daemon.state_dir, problems),
        security=_resolve_security(config.security, problems),
    )
    config = msgspec.structs.replace(
        config, kv_events=_resolve_kv_events(config.kv_events, daemon.runtime_dir, problems)
    )
    http = config.http
    try:
        check_http(http.enabled, http.host, len(http.keys))
    except ConfigError as exc:
        problems.add(("http", "keys"), exc.details["problem"])
    models = dict(config.models)
    if not models and daemon.serve_default_model:
        models[DEFAULT_MODEL_ID] = ModelConfig(path=DEFAULT_MODEL_PATH)
    resolved = {mid: _resolve_model(mid, m, config, problems) for mid, m in models.items()}
    return msgspec.structs.replace(config, models=resolved)


def load_config(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> LlamadConfig:
    """The configuration the daemon runs, validated as a whole and resolved.

    ``path``: the TOML file (``None``: ``$LLAMAD_CONFIG``, else defaults only).
    ``env``: the environment whose ``LLAMAD_*__*`` variables override keys
    and whose ``XDG_*``/``LLAMAD_RUNTIME_DIR``/``STATE_DIRECTORY`` give the
    default directories (default: ``os.environ``). The default model and
    llamad's cache folder come from :mod:`llamad.paths`, which reads the
    process's own environment (``LLAMAD_DEFAULT_MODEL``, ``LLAMAD_CACHE_DIR``).
    Raises one :class:`~llamad.errors.ConfigError` listing every problem.
    """
    env = os.environ if env is None else env
    problems = Problems()
    raw, source, overrides = raw_config(path, env, problems)
    _default_model_path(raw)
    what = source or "no config file"
    config = _resolve(read_table(LlamadConfig, raw, (), problems), env, problems)
    # A refused value was left at its default, so the parts still build and
    # find the problems of the other values; a model whose id or file was
    # refused cannot be built at all.
    convert = importlib.import_module("llamad.config.convert")
    ok = [
        mid
        for mid in config.models
        if not problems.has(("models", mid)) and not problems.about(("models", mid, "path"))
    ]
    convert.conversion_problems(config, problems, ok)
    problems.raise_if_any(what)
    return msgspec.structs.replace(config, source=source, overrides=overrides)
