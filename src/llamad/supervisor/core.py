"""The supervisor's restart logic as a plain object: no processes, no clock.

:class:`SupervisorCore` holds the children (specs in start order and the pid
each one runs as) and applies OTP's rules. The process layer
(:mod:`llamad.supervisor.supervisor_proc`) feeds it events — a child exited with a
reason at a time, a start succeeded or failed — and executes the decision it
returns: which children to stop (in that order), which to start (in that
order), or that the supervisor must escalate or shut itself down. Because it
never touches a process, a unit test can step it through any scenario.

Bookkeeping follows OTP's ``supervisor.erl``: a child that is not restarted is
forgotten if temporary (or dynamic under ``simple_one_for_one``) and otherwise
kept with no pid; a restart that fails to start a child leaves it
``restarting`` and is retried (counting against the intensity again) by
:meth:`SupervisorCore.try_again`; a one_for_all / rest_for_one restart stops
the affected siblings in reverse start order, drops the temporary ones for
good and starts the rest in start order, including siblings that had been
stopped with ``terminate_child`` (as OTP does).

Beyond OTP, the core keeps what an operator asks about a child: how many
times the supervisor restarted it and how and when its process last ended
(:class:`LastExit`), reported by :meth:`SupervisorCore.which_children`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import msgspec

from llamad.supervisor.errors import (
    ChildAlreadyPresent,
    ChildAlreadyStarted,
    ChildNotFound,
    ChildRestarting,
    ChildRunning,
    InvalidSpec,
    SimpleOneForOne,
)
from llamad.supervisor.exits import ExitReason
from llamad.supervisor.intensity import RestartIntensity
from llamad.supervisor.spec import (
    AutoShutdown,
    ChildSpec,
    ChildType,
    Restart,
    Strategy,
    SupervisorSpec,
    check_child_fits,
)

__all__ = [
    "AutoShutdownPlan",
    "ChildCounts",
    "ChildInfo",
    "ChildState",
    "Decision",
    "Escalation",
    "LastExit",
    "NotRestarted",
    "RestartPlan",
    "Stale",
    "StartedChild",
    "Stop",
    "SupervisorCore",
]


class ChildState(StrEnum):
    """What ``which_children`` reports for a child (OTP: pid, ``restarting``, ``undefined``)."""

    RUNNING = "running"
    RESTARTING = "restarting"
    UNDEFINED = "undefined"


class Stop(NamedTuple):
    """A child process to stop: its id and the pid it runs as."""

    child_id: str
    pid: int


class StartedChild(NamedTuple):
    """What ``start_child`` returns, in process and over the actor runtime alike."""

    id: str
    pid: int


class LastExit(msgspec.Struct, frozen=True, kw_only=True):
    """How and when a child's process last ended.

    ``reason`` is ``shutdown`` when the supervisor stopped it (whatever its
    wait status). ``at`` is wall-clock seconds (``time.time()``): it is for
    people and logs; the restart rules run on the monotonic clock.
    """

    reason: ExitReason
    at: float
    #: The wait status in words (``"exit 3"``, ``"signal SIGKILL"``), if known.
    exit: str | None = None
    #: Why the supervisor killed it, if it did (``hung``, ``shutdown_timeout``).
    cause: str | None = None


class ChildInfo(msgspec.Struct, frozen=True):
    """One row of ``which_children``: OTP's fields, then what an operator asks.

    ``restarts`` counts the times the supervisor restarted this child (after
    its own exit or a sibling's, per the strategy), not ``restart_child``
    calls; ``last_exit`` is ``None`` until its process has ended once.
    """

    id: str
    pid: int | None
    state: ChildState
    type: ChildType
    restart: Restart
    restarts: int = 0
    last_exit: LastExit | None = None


class ChildCounts(msgspec.Struct, frozen=True):
    """``count_children``: specs, live processes, and specs by type (as OTP)."""

    specs: int
    active: int
    supervisors: int
    workers: int


@dataclass(frozen=True)
class Stale:
    """The exit belongs to no current child (already replaced or stopped)."""

    pid: int


@dataclass(frozen=True)
class NotRestarted:
    """The child exited and its restart type says not to restart it."""

    child_id: str
    #: True when the spec was forgotten (temporary or dynamic child).
    removed: bool


@dataclass(frozen=True)
class RestartPlan:
    """Stop ``stop`` in order, then start ``start`` in order."""

    trigger: str
    stop: tuple[Stop, ...]
    start: tuple[str, ...]
    restarts_in_window: int


@dataclass(frozen=True)
class Escalation:
    """Restart intensity exceeded: stop ``stop`` in order, then exit abnormally."""

    trigger: str
    stop: tuple[Stop, ...]
    restarts_in_window: int


@dataclass(frozen=True)
class AutoShutdownPlan:
    """A significant child's exit ends the supervisor: stop ``stop``, then exit normally."""

    trigger: str
    stop: tuple[Stop, ...]


Decision = Stale | NotRestarted | RestartPlan | Escalation | AutoShutdownPlan


@dataclass
class _Child:
    spec: ChildSpec
    pid: int | None = None
    restarting: bool = False
    restarts: int = 0
    last_exit: LastExit | None = None

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def state(self) -> ChildState:
        if self.pid is not None:
            return ChildState.RUNNING
        return ChildState.RESTARTING if self.restarting else ChildState.UNDEFINED


class SupervisorCore:
    """OTP's supervisor state machine over child ids and pids.

    Not thread-safe: one owner (the supervisor loop) calls it.
    """

    def __init__(self, spec: SupervisorSpec) -> None:
        self.spec = spec
        self.name = spec.name
        self.flags = spec.flags
        self._intensity = RestartIntensity(spec.flags.intensity, spec.flags.period)
        self._dynamic = spec.flags.strategy is Strategy.SIMPLE_ONE_FOR_ONE
        self._template: ChildSpec | None = spec.children[0] if self._dynamic else None
        self._children: list[_Child] = [] if self._dynamic else [_Child(c) for c in spec.children]
        self._serial = 0

    # ------------------------------------------------------------------ queries

    @property
    def is_dynamic(self) -> bool:
        """True for ``simple_one_for_one``."""
        return self._dynamic

    def initial_starts(self) -> tuple[str, ...]:
        """Ids to start when the supervisor starts, in order (none for dynamic)."""
        return tuple(c.id for c in self._children)

    def spec_of(self, child_id: str) -> ChildSpec:
        return self._get(child_id).spec

    def pid_of(self, child_id: str) -> int | None:
        return self._get(child_id).pid

    def shutdown_order(self) -> tuple[Stop, ...]:
        """Every running child in reverse start order."""
        return tuple(Stop(c.id, c.pid) for c in reversed(self._children) if c.pid is not None)

    def restarts_in_window(self, now: float) -> int:
        return self._intensity.in_window(now)

    def which_children(self) -> list[ChildInfo]:
        """Every child in start order, with its pid or state."""
        return [
            ChildInfo(c.id, c.pid, c.state, c.spec.type, c.spec.restart, c.restarts, c.last_exit)
            for c in self._children
        ]

    def count_children(self) -> ChildCounts:
        active = sum(1 for c in self._children if c.pid is not None)
        sups = sum(1 for c in self._children if c.spec.type is ChildType.SUPERVISOR)
        specs = 1 if self._dynamic else len(self._children)
        return ChildCounts(specs, active, sups, len(self._children) - sups)

    # ------------------------------------------------------------ lifecycle feed

    def started(self, child_id: str, pid: int) -> None:
        """The process for ``child_id`` is up and reported ready."""
        child = self._get(child_id)
        child.pid = pid
        child.restarting = False

    def restarted(self, child_id: str, pid: int) -> int:
        """A restart plan started ``child_id`` again; its restart count now."""
        self.started(child_id, pid)
        child = self._get(child_id)
        child.restarts += 1
        return child.restarts

    def stopped(self, child_id: str, last_exit: LastExit) -> None:
        """The supervisor stopped ``child_id``'s process (a restart plan,
        ``terminate_child`` or shutdown): remember how, if the child is kept."""
        child = self._find(child_id)
        if child is not None:
            child.last_exit = last_exit

    def start_failed(self, child_id: str) -> None:
        """Restarting ``child_id`` failed; it waits for :meth:`try_again`.

        The children after it in the same plan stay without a process; the
        retry's own plan (per strategy) brings them back.
        """
        child = self._get(child_id)
        child.pid = None
        child.restarting = True

    def exited(
        self,
        pid: int,
        reason: ExitReason,
        now: float,
        *,
        at: float | None = None,
        exit: str | None = None,
        cause: str | None = None,
    ) -> Decision:
        """A child process exited on its own (not stopped by us) with ``reason``.

        ``now`` (monotonic) drives the restart window. ``at`` (wall clock,
        default ``now``), ``exit`` and ``cause`` only describe the exit for
        ``which_children`` (:class:`LastExit`).
        """
        child = self._by_pid(pid)
        if child is None:
            return Stale(pid)
        child.last_exit = LastExit(
            reason=reason, at=now if at is None else at, exit=exit, cause=cause
        )
        restart = child.spec.restart
        if restart is Restart.PERMANENT or (
            restart is Restart.TRANSIENT and reason is ExitReason.ABNORMAL
        ):
            return self._restart(child, now)
        removed = self._del_child(child)
        return self._maybe_auto_shutdown(child, removed)

    def try_again(self, child_id: str, now: float) -> Decision | None:
        """Retry a failed restart; ``None`` if the child no longer waits for one."""
        child = self._find(child_id)
        if child is None or not child.restarting:
            return None
        return self._restart(child, now)

    # ------------------------------------------------------------ dynamic API

    def prepare_start(self, child: ChildSpec | Sequence[Any], child_id: str | None) -> ChildSpec:
        """Validate a ``start_child`` request; return the concrete spec to start.

        Static supervisors take a :class:`ChildSpec`; ``simple_one_for_one``
        takes extra args appended to the template's (and an optional id,
        unique among its children; by default ``"<template id>-<n>"``).
        """
        if self._dynamic:
            assert self._template is not None
            if isinstance(child, ChildSpec | str | bytes):
                raise SimpleOneForOne(
                    "simple_one_for_one takes extra args, not a child spec",
                    details={"supervisor": self.name},
                )
            if child_id is None:
                self._serial += 1
                child_id = f"{self._template.id}-{self._serial}"
                while self._find(child_id) is not None:
                    self._serial += 1
                    child_id = f"{self._template.id}-{self._serial}"
            spec = self._template.with_start(
                self._template.start.with_extra_args(list(child)), child_id
            )
            existing = self._find(spec.id)
            if existing is not None:
                raise ChildAlreadyStarted(
                    f"child {spec.id!r} exists", details={"child": spec.id, "pid": existing.pid}
                )
            return spec
        if not isinstance(child, ChildSpec):
            raise SimpleOneForOne(
                "a static supervisor takes a ChildSpec, not extra args",
                details={"supervisor": self.name},
            )
        if child_id is not None and child_id != child.id:
            raise InvalidSpec("child_id", f"must match spec.id {child.id!r}, got {child_id!r}")
        check_child_fits(self.flags, child, "child")
        existing = self._find(child.id)
        if existing is not None:
            if existing.pid is not None:
                raise ChildAlreadyStarted(
                    f"child {child.id!r} is running",
                    details={"child": child.id, "pid": existing.pid},
                )
            raise ChildAlreadyPresent(f"child {child.id!r} is present", details={"child": child.id})
        return child

    def add_started(self, spec: ChildSpec, pid: int) -> None:
        """Record a child started by ``start_child`` (appended to the start order)."""
        self._children.append(_Child(spec, pid))

    def resolve(self, id_or_pid: str | int) -> str:
        """The child id for an id or (as OTP allows for dynamic children) a pid."""
        if isinstance(id_or_pid, str):
            return self._get(id_or_pid).id
        child = self._by_pid(id_or_pid)
        if child is None:
            raise ChildNotFound(f"no child with pid {id_or_pid}", details={"pid": id_or_pid})
        return child.id

    def terminated(self, child_id: str) -> None:
        """``terminate_child`` stopped ``child_id`` (no auto_shutdown, no restart)."""
        self._del_child(self._get(child_id))

    def prepare_restart(self, child_id: str) -> ChildSpec:
        """Validate ``restart_child``: only a kept spec with no process qualifies."""
        if self._dynamic:
            raise SimpleOneForOne("restart_child does not apply to simple_one_for_one")
        child = self._get(child_id)
        self._check_idle(child)
        return child.spec

    def delete(self, child_id: str) -> None:
        """``delete_child``: forget a kept spec that has no process."""
        if self._dynamic:
            raise SimpleOneForOne("delete_child does not apply to simple_one_for_one")
        child = self._get(child_id)
        self._check_idle(child)
        self._children.remove(child)

    # ------------------------------------------------------------ internals

    def _restart(self, child: _Child, now: float) -> Decision:
        verdict = self._intensity.record(now)
        if not verdict.allowed:
            self._del_child(child)
            return Escalation(child.id, self.shutdown_order(), verdict.restarts_in_window)
        strategy = self.flags.strategy
        if strategy in (Strategy.ONE_FOR_ONE, Strategy.SIMPLE_ONE_FOR_ONE):
            child.pid = None
            child.restarting = False
            return RestartPlan(child.id, (), (child.id,), verdict.restarts_in_window)
        index = self._children.index(child)
        group = self._children if strategy is Strategy.ONE_FOR_ALL else self._children[index:]
        stop = tuple(
            Stop(c.id, c.pid) for c in reversed(group) if c.pid is not None and c is not child
        )
        child.pid = None
        restart_group: list[_Child] = []
        for c in list(group):
            if c is not child and c.spec.restart is Restart.TEMPORARY:
                self._children.remove(c)
                continue
            c.pid = None
            c.restarting = False
            restart_group.append(c)
        start = tuple(c.id for c in restart_group)
        return RestartPlan(child.id, stop, start, verdict.restarts_in_window)

    def _maybe_auto_shutdown(self, child: _Child, removed: bool) -> Decision:
        mode = self.flags.auto_shutdown
        if mode is AutoShutdown.NEVER or not child.spec.significant:
            return NotRestarted(child.id, removed)
        if mode is AutoShutdown.ALL_SIGNIFICANT:
            alive = (
                self._children
                if self._dynamic
                else [c for c in self._children if c.spec.significant]
            )
            if any(c.pid is not None or c.restarting for c in alive):
                return NotRestarted(child.id, removed)
        return AutoShutdownPlan(child.id, self.shutdown_order())

    def _del_child(self, child: _Child) -> bool:
        if self._dynamic or child.spec.restart is Restart.TEMPORARY:
            self._children.remove(child)
            return True
        child.pid = None
        child.restarting = False
        return False

    def _check_idle(self, child: _Child) -> None:
        if child.pid is not None:
            raise ChildRunning(
                f"child {child.id!r} is running", details={"child": child.id, "pid": child.pid}
            )
        if child.restarting:
            raise ChildRestarting(f"child {child.id!r} is restarting", details={"child": child.id})

    def _find(self, child_id: str) -> _Child | None:
        for c in self._children:
            if c.id == child_id:
                return c
        return None

    def _get(self, child_id: str) -> _Child:
        child = self._find(child_id)
        if child is None:
            raise ChildNotFound(f"no child {child_id!r}", details={"child": child_id})
        return child

    def _by_pid(self, pid: int) -> _Child | None:
        for c in self._children:
            if c.pid == pid:
                return c
        return None
