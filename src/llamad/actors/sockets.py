"""ZeroMQ plumbing shared by actors and clients: endpoints and socket options.

Every option is set on purpose:

- ``LINGER``: how long ``close`` may wait to flush. Actors linger briefly so
  their last replies (e.g. "stopping") go out; clients do not linger, since
  nothing they still hold is worth delaying their exit for.
- ``MAXMSGSIZE``: per frame; ZeroMQ drops a connection that exceeds it before
  allocating the frame, so a hostile peer cannot make us buffer gigabytes.
- ``SNDHWM``/``RCVHWM``: per-peer queue bounds in messages.
- ``ROUTER_MANDATORY`` on actors: a reply to a vanished peer raises
  ``EHOSTUNREACH`` instead of disappearing, which is how an actor learns a
  remote client is gone; a full queue raises ``EAGAIN`` instead of silently
  dropping.
- ``HEARTBEAT_*`` on tcp: ZMTP pings close a connection to a host that went
  away without a FIN, which ipc never needs. ``IPV6`` for a bracketed host
  only (``tcp://[::1]:P`` fails without it; with it, ``localhost`` would bind
  a dual-stack ``[::ffff:127.0.0.1]``).

An actor's ``ipc://`` socket file is made 0600 once bound
(:func:`restrict_ipc`): the 0700 runtime directory already keeps other
users out, and the file's own mode still does if that directory is ever
opened up. A client refused by either gets
:class:`~llamad.errors.PermissionDenied` at once (:func:`listening`).
CURVE for ``tcp://`` is in :mod:`llamad.actors.curve`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import Callable
from typing import Any, Final

import zmq
import zmq.backend

from llamad.actors.errors import ActorConfigError
from llamad.actors.wire import Limits
from llamad.errors import PermissionDenied

__all__ = [
    "FORKS",
    "NOBLOCK",
    "SNDMORE",
    "SNDMORE_NOBLOCK",
    "configure",
    "listening",
    "restrict_ipc",
    "send_frame",
    "tcp_options",
    "validate_endpoint",
]

# pyzmq's flags are enum.Flag members, and combining or testing them goes
# through the enum machinery on every message; plain ints are several times
# cheaper on the hot path.
NOBLOCK: Final = int(zmq.NOBLOCK)
SNDMORE: Final = int(zmq.SNDMORE)
SNDMORE_NOBLOCK: Final = SNDMORE | NOBLOCK
POLLIN: Final = int(zmq.POLLIN)

send_frame: Final[Callable[..., Any]] = zmq.backend.Socket.send
"""``send_frame(sock, data, flags)``: pyzmq's compiled ``send`` without the
Python-level wrapper ``zmq.Socket.send`` adds for DRAFT routing ids and
groups, which we never use (one Python frame less per message)."""

FORKS: Final = [0]
"""How many times this process image has been forked (bumped in the child).
Sockets cannot survive a fork; owners compare this instead of calling
``getpid()`` (a syscall) on every message."""


def _count_fork() -> None:
    FORKS[0] += 1


os.register_at_fork(after_in_child=_count_fork)

_HEARTBEAT_IVL_MS: Final = 1000
_HEARTBEAT_TIMEOUT_MS: Final = 3000
_TCP_PROBE_S: Final = 0.5


def validate_endpoint(endpoint: str, field: str = "endpoint") -> str:
    """Return ``endpoint`` if it is an ``ipc://`` or ``tcp://`` endpoint."""
    if not isinstance(endpoint, str):
        raise ActorConfigError(field, f"must be a string, got {endpoint!r}")
    # ZeroMQ takes a C string: a NUL would cut it, a lone surrogate fails to encode.
    if any(c == "\0" or "\ud800" <= c <= "\udfff" for c in endpoint):
        raise ActorConfigError(field, f"{endpoint!r} holds a NUL or a lone surrogate")
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if not path or "\0" in path:
            raise ActorConfigError(field, f"{endpoint!r} has no usable ipc path")
        if len(path.encode()) > 107:
            raise ActorConfigError(field, f"ipc path of {endpoint!r} is longer than 107 bytes")
        return endpoint
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://") :].rpartition(":")
        if not sep or not host or not (port == "*" or port.isdigit()):
            raise ActorConfigError(field, f"{endpoint!r} is not tcp://HOST:PORT")
        return endpoint
    raise ActorConfigError(field, f"{endpoint!r} is neither ipc:// nor tcp://")


def configure(sock: zmq.Socket[bytes], limits: Limits, *, linger_s: float, endpoint: str) -> None:
    """Apply the runtime's options to a fresh socket (before bind/connect to ``endpoint``)."""
    sock.setsockopt(zmq.LINGER, round(linger_s * 1000))
    sock.setsockopt(zmq.MAXMSGSIZE, limits.max_frame_bytes)
    sock.setsockopt(zmq.SNDHWM, limits.sndhwm)
    sock.setsockopt(zmq.RCVHWM, limits.rcvhwm)
    if sock.type == zmq.ROUTER:
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    if endpoint.startswith("tcp://"):
        tcp_options(sock, endpoint)


def tcp_options(sock: zmq.Socket[bytes], endpoint: str) -> None:
    """The tcp-only options, for the endpoints ``sock`` binds or connects from
    now on (libzmq copies options into each endpoint when it is created)."""
    if endpoint.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    sock.setsockopt(zmq.HEARTBEAT_IVL, _HEARTBEAT_IVL_MS)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, _HEARTBEAT_TIMEOUT_MS)
    sock.setsockopt(zmq.HEARTBEAT_TTL, _HEARTBEAT_TIMEOUT_MS)


def restrict_ipc(endpoint: str) -> None:
    """Make the socket file of a bound ``ipc://`` endpoint 0600 (no-op for tcp)."""
    if endpoint.startswith("ipc://"):
        os.chmod(endpoint[len("ipc://") :], 0o600)


def listening(endpoint: str) -> bool:
    """Whether something accepts connections on ``endpoint`` right now.

    A plain ``connect(2)`` is refused at once when nobody listens (the socket
    file of a SIGKILLed actor stays behind; a restarted worker's old tcp port
    is closed), whereas ZeroMQ would retry silently: this is what lets a
    client fail fast while an actor is down. A tcp probe that neither
    connects nor is refused within :data:`_TCP_PROBE_S` says ``True``:
    ZeroMQ's own connect then decides.
    Raises :class:`~llamad.errors.PermissionDenied` when an ipc socket or a
    directory above it refuses this user: ZeroMQ would retry that forever.
    """
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint[len("tcp://") :].rpartition(":")
        try:
            probe = socket.create_connection(
                (host.removeprefix("[").removesuffix("]"), int(port)), timeout=_TCP_PROBE_S
            )
        except ConnectionRefusedError:
            return False
        except (OSError, ValueError):
            return True
        with contextlib.suppress(OSError):
            probe.close()
        return True
    if not endpoint.startswith("ipc://"):
        return True
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(endpoint[len("ipc://") :])
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise PermissionDenied(
                f"{endpoint}: permission denied (the daemon's runtime directory and sockets "
                f"are private to the user it runs as; this is uid {os.getuid()})",
                details={"endpoint": endpoint, "reason": "ipc_permission"},
            ) from None
        return False
    finally:
        with contextlib.suppress(OSError):
            probe.close()
    return True
