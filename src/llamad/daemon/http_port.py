"""The HTTP gateway's port, checked by the root before any child starts.

The gateway binds its port itself (:mod:`llamad.gateway.proc`), but a port
that another program holds must refuse the *start*, naming the key, rather
than crash-loop the gateway until the root gives the whole daemon up. So the
root binds ``http.host``:``http.port`` once, with ``SO_REUSEADDR`` as the
gateway will, and lets it go:

- taken: :class:`~llamad.errors.DaemonInUse` naming ``http.port`` (exit 75,
  ``EX_TEMPFAIL``: it may start once the other program has stopped);
- an address this host does not have, or a name that does not resolve:
  :class:`~llamad.errors.ConfigError` naming ``http.host`` (exit 78);
- ``port = 0``: the free port the kernel gave is the gateway's for the
  daemon's life, so a restarted gateway comes back on the same port.
"""

from __future__ import annotations

import errno
import socket

from llamad.config import LlamadConfig
from llamad.errors import ConfigError, DaemonInUse

__all__ = ["check_http_port"]


def check_http_port(config: LlamadConfig) -> int | None:
    """The port the gateway will bind (``None``: ``[http]`` is off)."""
    http = config.http
    if not http.enabled:
        return None
    where = f"{http.host}:{http.port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            http.host, http.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise _host(f"{http.host} does not resolve ({exc})") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise DaemonInUse(
                    f"http.port: {where} is in use by another program; refusing to start "
                    "(set http.port to a free port, 0 for any, or http.enabled = false)",
                    details={"field": "http.port", "held": [where]},
                ) from None
            if exc.errno == errno.EACCES:
                raise ConfigError(
                    f"http.port: {where} needs privileges this user lacks (use a port >= 1024)",
                    details={"field": "http.port"},
                ) from None
            raise _host(f"{http.host} cannot be bound on this host ({exc.strerror})") from None
        port: int = sock.getsockname()[1]
        return port


def _host(problem: str) -> ConfigError:
    return ConfigError(f"http.host: {problem}", details={"field": "http.host", "problem": problem})
