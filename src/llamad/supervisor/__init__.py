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

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

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
    from llamad.supervisor.supervisor_proc import Supervisor, run_root, run_supervisor_process


__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.supervisor.core": (
            "ChildCounts",
            "ChildInfo",
            "ChildState",
            "LastExit",
            "StartedChild",
            "SupervisorCore",
        ),
        "llamad.supervisor.errors": (
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
        ),
        "llamad.supervisor.events": (
            "EventFeed",
            "SupervisorEvent",
        ),
        "llamad.supervisor.exits": (
            "ExitReason",
            "classify_exit",
        ),
        "llamad.supervisor.intensity": ("RestartIntensity",),
        "llamad.supervisor.supervisor_proc": (
            "Supervisor",
            "run_root",
            "run_supervisor_process",
        ),
        "llamad.supervisor.spec": (
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
        ),
    },
)


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
