"""OTP-style supervision of OS processes.

Build a tree from frozen, validated contracts and run it::

    from llamad.supervisor import ChildSpec, Start, SupFlags, SupervisorSpec, Supervisor

    spec = SupervisorSpec(
        "cache_sup",
        SupFlags(strategy="rest_for_one", intensity=3, period=10),
        (ChildSpec("meta", Start("llamad.cache.meta_proc:run_meta")),),
    )
    Supervisor(spec).run()          # main thread: SIGTERM stops it in order

The restart rules live in :class:`SupervisorCore` (a plain object you can step
in a test), the processes in :class:`Supervisor`, the child side (heartbeats,
readiness) in :mod:`llamad.supervisor.child`, the decisions it publishes in
:mod:`llamad.supervisor.events`. See
``docs/internals/supervision.md`` for the semantics and where they differ from
OTP.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llamad.supervisor.core import (
        ChildCounts,
        ChildInfo,
        ChildState,
        LastExit,
        StartedChild,
        SupervisorCore,
    )
    from llamad.supervisor.errors import (
        ChildAlreadyPresent,
        ChildAlreadyStarted,
        ChildNotFound,
        ChildRestarting,
        ChildRunning,
        InvalidSpec,
        SimpleOneForOne,
        StartFailed,
        SupervisorError,
        SupervisorStopped,
    )
    from llamad.supervisor.events import EventFeed, SupervisorEvent
    from llamad.supervisor.exits import ExitReason, classify_exit
    from llamad.supervisor.intensity import RestartIntensity
    from llamad.supervisor.proc import run_root, run_supervisor_process
    from llamad.supervisor.runtime import Supervisor
    from llamad.supervisor.spec import (
        BRUTAL_KILL,
        INFINITY,
        AutoShutdown,
        ChildSpec,
        ChildType,
        Restart,
        Start,
        Strategy,
        SupervisorSpec,
        SupFlags,
        supervisor_child,
    )

# Loaded on first use: every child process imports this package on its way to
# ``llamad.supervisor.child``, and should not pay for structlog and the
# supervisor loop it never runs (a fraction of a second per start otherwise).
_HOME = {
    **dict.fromkeys(
        ["ChildCounts", "ChildInfo", "ChildState", "LastExit", "StartedChild", "SupervisorCore"],
        "core",
    ),
    **dict.fromkeys(["EventFeed", "SupervisorEvent"], "events"),
    **dict.fromkeys(
        [
            "ChildAlreadyPresent",
            "ChildAlreadyStarted",
            "ChildNotFound",
            "ChildRestarting",
            "ChildRunning",
            "InvalidSpec",
            "SimpleOneForOne",
            "StartFailed",
            "SupervisorError",
            "SupervisorStopped",
        ],
        "errors",
    ),
    **dict.fromkeys(["ExitReason", "classify_exit"], "exits"),
    "RestartIntensity": "intensity",
    **dict.fromkeys(["run_root", "run_supervisor_process"], "proc"),
    "Supervisor": "runtime",
    **dict.fromkeys(
        [
            "BRUTAL_KILL",
            "INFINITY",
            "AutoShutdown",
            "ChildSpec",
            "ChildType",
            "Restart",
            "Start",
            "Strategy",
            "SupervisorSpec",
            "SupFlags",
            "supervisor_child",
        ],
        "spec",
    ),
}


def __getattr__(name: str) -> Any:
    home = _HOME.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BRUTAL_KILL",
    "INFINITY",
    "AutoShutdown",
    "ChildAlreadyPresent",
    "ChildAlreadyStarted",
    "ChildCounts",
    "ChildInfo",
    "ChildNotFound",
    "ChildRestarting",
    "ChildRunning",
    "ChildSpec",
    "ChildState",
    "ChildType",
    "EventFeed",
    "ExitReason",
    "InvalidSpec",
    "LastExit",
    "Restart",
    "RestartIntensity",
    "SimpleOneForOne",
    "Start",
    "StartFailed",
    "StartedChild",
    "Strategy",
    "SupFlags",
    "Supervisor",
    "SupervisorCore",
    "SupervisorError",
    "SupervisorEvent",
    "SupervisorSpec",
    "SupervisorStopped",
    "classify_exit",
    "run_root",
    "run_supervisor_process",
    "supervisor_child",
]
