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
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import msgspec

from llamad.actors.curve import CurveClient
from llamad.actors.errors import ActorConfigError
from llamad.actors.registry import check_name
from llamad.cache.meta_wire import ACTOR_NAME as CACHE_META
from llamad.config.dirs import (
    default_endpoint,
    default_model_dirs,
    default_ram_file_root,
    default_runtime_dir,
    default_state_dir,
)
from llamad.config.env import apply_env
from llamad.config.model_schema import DEFAULT_MODEL_PATH, ModelConfig
from llamad.config.problems import KeyPath, Problems
from llamad.config.reader import read_table
from llamad.config.schema import (
    DEFAULT_MODEL_ID,
    CacheSection,
    ClientSection,
    DaemonSection,
    LlamadConfig,
    SecuritySection,
)
from llamad.config.security import check_endpoint, resolve_model_path
from llamad.errors import ConfigError, LlamadError
from llamad.paths import default_model_path

__all__ = ["CONFIG_ENV", "client_curve", "client_endpoint", "load_config"]

_CLIENT_CURVE_KEYS: Final = "client.curve_secret_key and client.curve_server_key"

CONFIG_ENV: Final = "LLAMAD_CONFIG"
"""Names the config file when none is given."""

_SUN_PATH_MAX: Final = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_WORKER_PREFIX: Final = "model."


def _read_file(path: Path, problems: Problems) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        problems.add((), f"{path} does not exist")
    except OSError as exc:
        problems.add((), f"cannot read {path}: {exc.strerror or exc}")
    except tomllib.TOMLDecodeError as exc:
        problems.add((), f"{path} is not valid TOML: {exc}")
    except UnicodeDecodeError:
        problems.add((), f"{path} is not UTF-8 text")
    return {}


def _raw(
    path: str | os.PathLike[str] | None, env: Mapping[str, str], problems: Problems
) -> tuple[dict[str, Any], str | None, tuple[str, ...]]:
    """The file's tables with the environment's overrides, the file's name
    (``None``: no file) and the overriding variables."""
    if path is None and env.get(CONFIG_ENV):
        path = env[CONFIG_ENV]
    raw: dict[str, Any] = {}
    source = None if path is None else os.fspath(path)
    if source is not None:
        raw = _read_file(Path(source), problems)
        problems.raise_if_any(source)
    overrides = apply_env(raw, env, problems)
    return raw, source, overrides


def _resolve_daemon(
    d: DaemonSection,
    env: Mapping[str, str],
    problems: Problems,
    *,
    curve: bool,
    curve_keys: str | None = None,
) -> DaemonSection:
    runtime = d.runtime_dir or default_runtime_dir(env)
    endpoint = d.endpoint or default_endpoint(runtime)
    try:
        if curve_keys is None:
            check_endpoint(endpoint, curve=curve)
        else:
            check_endpoint(endpoint, curve=curve, curve_keys=curve_keys)
    except ConfigError as exc:
        problems.add(
            ("daemon", "endpoint") if d.endpoint else ("daemon", "runtime_dir"),
            exc.details["problem"],
        )
    return msgspec.structs.replace(
        d, runtime_dir=runtime, state_dir=d.state_dir or default_state_dir(env), endpoint=endpoint
    )


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


def _check_client(c: ClientSection, problems: Problems) -> None:
    if (c.curve_secret_key is None) != (c.curve_server_key is None):
        missing = "curve_server_key" if c.curve_server_key is None else "curve_secret_key"
        other = "curve_secret_key" if missing == "curve_server_key" else "curve_server_key"
        problems.add(("client", missing), f"is not set, but {other} is: CURVE needs both")


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


def _resolve(config: LlamadConfig, env: Mapping[str, str], problems: Problems) -> LlamadConfig:
    curve = config.security.curve_secret_key is not None
    daemon = _resolve_daemon(config.daemon, env, problems, curve=curve)
    _check_client(config.client, problems)
    assert daemon.runtime_dir is not None and daemon.state_dir is not None
    if not _socket_fits(daemon.runtime_dir, CACHE_META):
        problems.add(("daemon", "runtime_dir"), "is too long for the sockets under it")
    config = msgspec.structs.replace(
        config,
        daemon=daemon,
        cache=_resolve_cache(config.cache, daemon.state_dir, problems),
        security=_resolve_security(config.security, problems),
    )
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
    raw, source, overrides = _raw(path, env, problems)
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


def client_endpoint(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> str:
    """The endpoint a client connects to: ``[daemon]`` of the file (``path``,
    else ``$LLAMAD_CONFIG``, else none) with the environment's overrides.

    Reads and checks the ``[daemon]`` table alone (a client has no business
    with the models' files), and never loads libllama.
    """
    env = os.environ if env is None else env
    problems = Problems()
    raw, source, _ = _raw(path, env, problems)
    client = _client_table(raw, problems)
    daemon = _resolve_daemon(
        read_table(DaemonSection, _table(raw, "daemon", problems), ("daemon",), problems),
        env,
        problems,
        curve=client.curve_secret_key is not None and client.curve_server_key is not None,
        curve_keys=_CLIENT_CURVE_KEYS,
    )
    problems.raise_if_any(source or "no config file")
    assert daemon.endpoint is not None
    return daemon.endpoint


def client_curve(
    path: str | os.PathLike[str] | None = None, *, env: Mapping[str, str] | None = None
) -> CurveClient | None:
    """The CURVE keys a client connects with: ``[client]`` of the file (as
    :func:`client_endpoint` finds it) with the environment's overrides, the key
    files read and checked; ``None`` when none are configured."""
    env = os.environ if env is None else env
    problems = Problems()
    raw, source, _ = _raw(path, env, problems)
    client = _client_table(raw, problems)
    problems.raise_if_any(source or "no config file")
    try:
        return client.curve()
    except ActorConfigError as exc:
        problems.add(("client", exc.field), exc.message.removeprefix(f"{exc.field}: "))
        problems.raise_if_any(source or "no config file")
        raise  # unreachable: a problem was just added


def _table(raw: Mapping[str, Any], name: str, problems: Problems) -> dict[str, Any]:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        problems.add((name,), "expected a table")
        return {}
    return table


def _client_table(raw: Mapping[str, Any], problems: Problems) -> ClientSection:
    client = read_table(ClientSection, _table(raw, "client", problems), ("client",), problems)
    _check_client(client, problems)
    return client
