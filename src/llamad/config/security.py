"""What the configuration may point the daemon at (SPEC D5).

- A model file must lie in one of ``security.model_dirs`` once every symlink
  and ``..`` is resolved: a link inside an allowed directory that points
  outside it is refused, as is ``/srv/models/../../etc/x``. The containment
  check comes before any existence check, so a refusal never says whether a
  file outside the allowed directories exists. The daemon checks every
  ``load_model`` path the same way and loads the resolved path; a worker
  checks every ``load_adapter`` path with :func:`llamad.paths.contained_model_path`
  (its spec carries the directories).
- The HTTP gateway binds a loopback address unless API keys are configured
  (``http.keys``): without them it would serve anyone who can reach it.
- The client-facing endpoint is ``ipc://`` or ``tcp://`` on a loopback
  address, unless CURVE keys are configured (``security.curve_secret_key``
  for the daemon, ``client.curve_secret_key`` and ``client.curve_server_key``
  for a client): without them a TCP socket on another interface would serve
  anyone who can reach it, in clear text.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from llamad.actors.errors import ActorConfigError
from llamad.actors.sockets import validate_endpoint
from llamad.errors import ConfigError
from llamad.paths import contained_model_path

__all__ = ["DAEMON_CURVE_KEYS", "check_endpoint", "check_http", "is_loopback", "resolve_model_path"]

DAEMON_CURVE_KEYS = "security.curve_secret_key and security.curve_client_keys"
"""The keys that let the daemon serve tcp beyond loopback."""


def _refuse(field: str, problem: str) -> ConfigError:
    return ConfigError(f"{field}: {problem}", details={"field": field, "problem": problem})


def resolve_model_path(
    path: str | os.PathLike[str], model_dirs: Sequence[str | os.PathLike[str]], field: str = "path"
) -> Path:
    """The real path of model file ``path`` if it lies in one of ``model_dirs``.

    Raises :class:`~llamad.errors.ConfigError` (``details["field"]`` is
    ``field``, ``details["problem"]`` the reason without it): not absolute,
    outside every allowed directory, missing, unreachable (too long, a loop
    of symbolic links, permission denied), or not a regular file.
    """
    text = os.fspath(path)
    real = contained_model_path(text, model_dirs, field)
    try:
        mode = real.stat().st_mode
    except OSError as exc:
        raise _refuse(field, f"{text} {_unreadable(exc)}") from None
    if not stat.S_ISREG(mode):
        raise _refuse(field, f"{text} is not a regular file")
    return real


def _unreadable(exc: OSError) -> str:
    """Why a path cannot be used, in words (never a raw ``OSError``: the
    config check, the daemon and ``load_model`` report it against its key)."""
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return "does not exist"
    if exc.errno == errno.ENAMETOOLONG:
        return "is too long a path (or one of its names is longer than the file system allows)"
    if exc.errno == errno.ELOOP:
        return "runs into a loop of symbolic links"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be reached by the daemon's user (permission denied)"
    return f"cannot be read ({exc.strerror or exc})"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``, IPv6 bracketed or not) is loopback."""
    return _loopback(host)


def _loopback(host: str) -> bool:
    host = host.removeprefix("[").removesuffix("]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_endpoint(
    endpoint: str,
    field: str = "endpoint",
    *,
    curve: bool = False,
    curve_keys: str = DAEMON_CURVE_KEYS,
) -> str:
    """``endpoint`` if the daemon may bind it (or a client connect to it), else
    :class:`ConfigError` naming ``field``. ``curve``: CURVE keys are configured,
    which alone allow tcp beyond loopback; ``curve_keys`` names them in the refusal."""
    try:
        validate_endpoint(endpoint, field)
    except ActorConfigError as exc:
        raise _refuse(field, exc.message.removeprefix(f"{field}: ")) from None
    if endpoint.startswith("tcp://") and not curve:
        host = endpoint[len("tcp://") :].rpartition(":")[0]
        if not _loopback(host):
            raise _refuse(
                field,
                f"{endpoint} is not on a loopback address: without CURVE, tcp is served on "
                f"loopback only (127.0.0.1, ::1, localhost); set {curve_keys} to serve it "
                "beyond (`llamad keys generate` writes the keys)",
            )
    return endpoint


def check_http(enabled: bool, host: str, keys: int, field: str = "http.keys") -> None:
    """:class:`ConfigError` naming ``field`` when the gateway would bind beyond
    loopback with no API key (``keys``: how many are configured)."""
    if enabled and keys == 0 and not _loopback(host):
        raise _refuse(
            field,
            f"http.host {host} is not a loopback address: the HTTP gateway serves beyond "
            "loopback only with API keys; add one (`llamad keys http` makes a key and "
            "prints its [http.keys.<name>] table), bind 127.0.0.1, or set http.enabled = false",
        )
