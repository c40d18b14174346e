"""Errors raised by the actor runtime itself.

Wire-level refusals reuse the shared classes in :mod:`llamad.errors`
(``bad_request``, ``unknown_op``, ``too_large``, ``version_mismatch``,
``worker_crashed``, ``unavailable``, ``timeout``); the classes here are the
runtime's own local failures.
"""

from __future__ import annotations

from typing import Any

from llamad.errors import ConfigError, LlamadError


class ActorConfigError(ConfigError, ValueError):
    """An op spec, limit, actor name or endpoint is invalid.

    Raised at construction; ``field`` names the offending field. Also a
    ``ValueError`` so plain Python callers can catch it idiomatically.
    """

    code = "actor_config_error"
    detail_attrs = ("field",)

    def __init__(self, field: str, problem: str, **details: Any) -> None:
        super().__init__(f"{field}: {problem}", details={"field": field, **details})
        self.field = field


class NameTaken(LlamadError):
    """Another live process already serves under this actor name."""

    code = "name_taken"


class ClientClosed(LlamadError):
    """The client (or the stream) was closed by its owner and cannot be used."""

    code = "client_closed"


class WrongProcess(LlamadError):
    """A socket owner was used from a process other than the one that created it.

    ZeroMQ contexts and sockets never survive a ``fork``; using one in the
    child would corrupt the parent's connections, so the runtime refuses.
    """

    code = "wrong_process"
