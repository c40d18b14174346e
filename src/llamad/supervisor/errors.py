"""Typed errors of the supervision tree.

Each class carries a stable ``code`` (see :mod:`llamad.errors`) so that a
process asking a supervisor for ``start_child`` over the actor runtime gets the
same class back that the supervisor raised. The names follow OTP's error atoms
(``already_present``, ``running``, ``restarting``, ``not_found``,
``simple_one_for_one``), prefixed so they cannot collide with other packages'
codes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llamad.errors import ConfigError, LlamadError


class InvalidSpec(ConfigError, ValueError):
    """A child spec, supervisor flags or supervisor spec is invalid.

    Raised at construction (a misconfigured tree refuses to start); ``field``
    names the offending field, e.g. ``"restart"``, ``"children[2].significant"``.
    Also a ``ValueError`` so plain Python callers can catch it idiomatically.
    """

    code = "invalid_spec"
    detail_attrs = ("field", "problem")

    def __init__(
        self,
        field: str,
        problem: str,
        *,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(
            f"{field}: {problem}", details={**(details or {}), "field": field, "problem": problem}
        )
        self.field = field
        self.problem = problem


class SupervisorError(LlamadError):
    """Base of every supervisor operation failure."""

    code = "supervisor_error"


class ChildNotFound(SupervisorError):
    """No child with that id (or pid) is known to the supervisor."""

    code = "child_not_found"


class ChildAlreadyStarted(SupervisorError):
    """``start_child`` for an id whose process is running (``details['pid']``)."""

    code = "child_already_started"


class ChildAlreadyPresent(SupervisorError):
    """``start_child`` for an id whose spec is kept but not running.

    As in OTP, use ``restart_child`` to run it again or ``delete_child`` first.
    """

    code = "child_already_present"


class ChildRunning(SupervisorError):
    """``restart_child``/``delete_child`` on a child whose process is alive."""

    code = "child_running"


class ChildRestarting(SupervisorError):
    """The child is waiting for a retried restart; try again later."""

    code = "child_restarting"


class SimpleOneForOne(SupervisorError):
    """The operation does not apply to this supervisor's strategy.

    Raised for ``restart_child``/``delete_child`` on a ``simple_one_for_one``
    supervisor, and for a start argument that does not fit the strategy
    (extra args on a static supervisor, a full spec on a dynamic one).
    """

    code = "simple_one_for_one"


class StartFailed(SupervisorError):
    """A child process died or timed out before it reported ready.

    ``details`` carries ``child`` and ``reason`` (``exit``, ``start_timeout``,
    ``spawn``) and, for an exit, ``exit`` (e.g. ``"exit 2"``).
    """

    code = "child_start_failed"


class SupervisorStopped(SupervisorError):
    """The supervisor is not running (it stopped, escalated or never started)."""

    code = "supervisor_stopped"
