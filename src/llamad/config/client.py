"""What a client reads of the configuration: the endpoint and its CURVE keys.

``[daemon]`` (where the daemon listens) and ``[client]`` (the keys a client
connects with) of the file the daemon runs (``path``, else
``$LLAMAD_CONFIG``, else none), with the environment's overrides. A client
has no business with the models' files or the cache's tables, so this module
reads neither and loads no cache or model-worker module; :mod:`.load` reads
the rest of the file through the same functions.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import msgspec

from llamad.actors.errors import ActorConfigError
from llamad.config.dirs import default_endpoint, default_runtime_dir, default_state_dir
from llamad.config.env import apply_env
from llamad.config.problems import Problems
from llamad.config.reader import read_table
from llamad.config.sections import ClientSection, DaemonSection
from llamad.config.security import check_endpoint
from llamad.errors import ConfigError

if TYPE_CHECKING:
    from llamad.actors.curve import CurveClient

__all__ = [
    "CONFIG_ENV",
    "check_client",
    "client_curve",
    "client_endpoint",
    "client_table",
    "raw_config",
    "resolve_daemon",
    "table_of",
]

_CLIENT_CURVE_KEYS: Final = "client.curve_secret_key and client.curve_server_key"


CONFIG_ENV: Final = "LLAMAD_CONFIG"
"""Names the config file when none is given."""


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


def raw_config(
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


def resolve_daemon(
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


def check_client(c: ClientSection, problems: Problems) -> None:
    if (c.curve_secret_key is None) != (c.curve_server_key is None):
        missing = "curve_server_key" if c.curve_server_key is None else "curve_secret_key"
        other = "curve_secret_key" if missing == "curve_server_key" else "curve_server_key"
        problems.add(("client", missing), f"is not set, but {other} is: CURVE needs both")


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
    raw, source, _ = raw_config(path, env, problems)
    client = client_table(raw, problems)
    daemon = resolve_daemon(
        read_table(DaemonSection, table_of(raw, "daemon", problems), ("daemon",), problems),
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
    raw, source, _ = raw_config(path, env, problems)
    client = client_table(raw, problems)
    problems.raise_if_any(source or "no config file")
    try:
        return client.curve()
    except ActorConfigError as exc:
        problems.add(("client", exc.field), exc.message.removeprefix(f"{exc.field}: "))
        problems.raise_if_any(source or "no config file")
        raise  # unreachable: a problem was just added


def table_of(raw: Mapping[str, Any], name: str, problems: Problems) -> dict[str, Any]:
    table = raw.get(name, {})
    if not isinstance(table, dict):
        problems.add((name,), "expected a table")
        return {}
    return table


def client_table(raw: Mapping[str, Any], problems: Problems) -> ClientSection:
    client = read_table(ClientSection, table_of(raw, "client", problems), ("client",), problems)
    check_client(client, problems)
    return client
