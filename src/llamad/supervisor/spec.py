"""Supervision contracts: how to start a child, how to treat it, how to supervise.

Everything here is a frozen dataclass validated at construction: an invalid
value raises :class:`~llamad.supervisor.errors.InvalidSpec` naming the field,
so a misconfigured tree refuses to start instead of misbehaving at runtime.

The names and defaults are OTP's (``supervisor:child_spec()`` and
``supervisor:sup_flags()``); the differences are that a child is an OS process
started from an importable ``"package.module:function"`` with msgpack-able
arguments (:class:`Start`), that durations are float seconds rather than
milliseconds, and fields OTP lacks: ``liveness_timeout`` (heartbeats),
``start_timeout`` (how long a start may take before it counts as failed), and
the child process's ``env`` and ``cwd``.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import msgpack

from llamad.supervisor.errors import InvalidSpec

__all__ = [
    "BRUTAL_KILL",
    "INFINITY",
    "AutoShutdown",
    "ChildSpec",
    "ChildType",
    "Restart",
    "Shutdown",
    "Start",
    "Strategy",
    "SupFlags",
    "SupervisorSpec",
    "supervisor_child",
]


class Restart(StrEnum):
    """When a terminated child is restarted (OTP ``restart``)."""

    PERMANENT = "permanent"  # always
    TRANSIENT = "transient"  # only after an abnormal exit
    TEMPORARY = "temporary"  # never, not even when a sibling's failure restarts the rest


class ChildType(StrEnum):
    """Whether the child is itself a supervisor (changes the default shutdown)."""

    WORKER = "worker"
    SUPERVISOR = "supervisor"


class Strategy(StrEnum):
    """Which children restart when one of them must be restarted."""

    ONE_FOR_ONE = "one_for_one"
    ONE_FOR_ALL = "one_for_all"
    REST_FOR_ONE = "rest_for_one"
    SIMPLE_ONE_FOR_ONE = "simple_one_for_one"


class AutoShutdown(StrEnum):
    """Whether the exit of significant children shuts the supervisor down."""

    NEVER = "never"
    ANY_SIGNIFICANT = "any_significant"
    ALL_SIGNIFICANT = "all_significant"


BRUTAL_KILL: Literal["brutal_kill"] = "brutal_kill"
INFINITY: Literal["infinity"] = "infinity"

#: ``brutal_kill`` (SIGKILL at once), seconds to wait after SIGTERM before
#: SIGKILL, or ``infinity`` (wait after SIGTERM for as long as it takes).
Shutdown = float | Literal["brutal_kill", "infinity"]

DEFAULT_WORKER_SHUTDOWN = 5.0
DEFAULT_START_TIMEOUT = 60.0

# Ids appear in logs, `ps` output and argv: printable, no whitespace, bounded.
_ID_RE = re.compile(r"[^\s\x00-\x1f\x7f\ud800-\udfff]{1,200}")
# A NUL cuts a C string; a lone surrogate cannot be encoded for exec or msgpack.
_NOT_TEXT = re.compile(r"[\x00\ud800-\udfff]")
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"
_TARGET_RE = re.compile(rf"{_IDENT}(?:\.{_IDENT})*:{_IDENT}(?:\.{_IDENT})*")

# POSIX's portable variable names; ``=`` or NUL in a name would corrupt the
# environment block the child receives.
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,254}")
_ENV_VALUE_MAX = 32 * 1024

_E = TypeVar("_E", bound=StrEnum)


def _enum(cls: type[_E], value: object, name: str) -> _E:
    if isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            return cls(value)
        except ValueError:
            pass
    choices = ", ".join(m.value for m in cls)
    raise InvalidSpec(name, f"must be one of {choices}, got {value!r}")


def _check_id(value: object, name: str) -> str:
    if not isinstance(value, str) or not _ID_RE.fullmatch(value):
        raise InvalidSpec(name, f"must be 1-200 printable characters without spaces, got {value!r}")
    return value


def _seconds(value: object, name: str, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidSpec(name, f"must be a number of seconds, got {value!r}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidSpec(name, f"must be finite and {bound}, got {value!r}")
    return seconds


def _optional_seconds(value: object, name: str) -> float | None:
    return None if value is None else _seconds(value, name, allow_zero=False)


def _check_env(value: object, name: str) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidSpec(name, f"must be a mapping of names to strings, got {value!r}")
    env: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not _ENV_NAME_RE.fullmatch(key):
            raise InvalidSpec(name, f"{key!r} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)")
        if not isinstance(val, str) or _NOT_TEXT.search(val) or len(val) > _ENV_VALUE_MAX:
            raise InvalidSpec(
                f"{name}.{key}",
                f"must be text without NUL or lone surrogates, at most {_ENV_VALUE_MAX} characters",
            )
        env[key] = val
    return MappingProxyType(env)


def _check_cwd(value: object, name: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    # Relative paths would depend on wherever the supervisor happens to run;
    # whether the directory exists is checked when the child starts (a missing
    # one is a failed start), since it may be created after the spec is built.
    if not isinstance(value, str) or not value.startswith("/") or _NOT_TEXT.search(value):
        raise InvalidSpec(name, f"must be an absolute path of text without NUL: {value!r}")
    return value


def _check_wire_keys(data: object, allowed: set[str], required: set[str], name: str) -> None:
    if not isinstance(data, Mapping):
        raise InvalidSpec(name, f"must be a mapping, got {type(data).__name__}")
    for key in data:
        if key not in allowed:
            raise InvalidSpec(f"{name}.{key}" if name else str(key), "unknown field")
    for key in required:
        if key not in data:
            raise InvalidSpec(f"{name}.{key}" if name else key, "missing")


@dataclass(frozen=True)
class Start:
    """How to start a child: call ``target(*args, **kwargs)`` in a fresh interpreter.

    ``target`` is ``"package.module:function"`` (``function`` may be dotted,
    e.g. ``Class.method``); the child runner imports it after exec, so it must
    be importable in the child's environment. Arguments travel as msgpack:
    ``None``, bools, ints, floats, ``str``, ``bytes``, lists/tuples (arrive as
    lists) and string-keyed mappings.
    """

    target: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not _TARGET_RE.fullmatch(self.target):
            raise InvalidSpec(
                "start.target", f"must look like 'package.module:function', got {self.target!r}"
            )
        if not isinstance(self.args, list | tuple):
            raise InvalidSpec("start.args", f"must be a sequence, got {type(self.args).__name__}")
        if not isinstance(self.kwargs, Mapping) or not all(isinstance(k, str) for k in self.kwargs):
            raise InvalidSpec("start.kwargs", "must be a mapping with string keys")
        object.__setattr__(self, "args", tuple(self.args))
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))
        try:
            msgpack.packb([list(self.args), dict(self.kwargs)], use_bin_type=True)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidSpec("start.args", f"arguments must be msgpack-able: {exc}") from exc

    @classmethod
    def of(cls, fn: Callable[..., object], *args: Any, **kwargs: Any) -> Start:
        """Build a start from an importable module-level function."""
        module = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", "")
        if not module or module == "__main__" or "<" in qualname:
            raise InvalidSpec(
                "start.target",
                f"{fn!r} is not importable by name from a fresh interpreter",
            )
        return cls(f"{module}:{qualname}", args, kwargs)

    def with_extra_args(self, extra: Sequence[Any]) -> Start:
        """This start with ``extra`` appended to ``args`` (``simple_one_for_one``)."""
        return Start(self.target, (*self.args, *extra), self.kwargs)

    def to_wire(self) -> dict[str, Any]:
        return {"target": self.target, "args": list(self.args), "kwargs": dict(self.kwargs)}

    @classmethod
    def from_wire(cls, data: object, name: str = "start") -> Start:
        _check_wire_keys(data, {"target", "args", "kwargs"}, {"target"}, name)
        assert isinstance(data, Mapping)
        try:
            return cls(data["target"], data.get("args", ()), data.get("kwargs", {}))
        except InvalidSpec as exc:
            # Our own checks name "start.<field>"; report where it sits in `data`.
            raise InvalidSpec(name + exc.field.removeprefix("start"), exc.problem) from exc


@dataclass(frozen=True)
class ChildSpec:
    """One supervised child (OTP ``child_spec()``).

    - ``restart``: ``permanent`` | ``transient`` | ``temporary``.
    - ``shutdown``: ``"brutal_kill"``, seconds (SIGTERM, wait, then SIGKILL) or
      ``"infinity"``; ``None`` takes OTP's default for ``type``: 5 s for a
      worker, ``infinity`` for a supervisor (so it can stop its own subtree).
    - ``significant``: with ``auto_shutdown``, this child's exit may shut the
      supervisor down; only a transient or temporary child may be significant.
    - ``liveness_timeout`` (beyond OTP): if set, the child must call
      :func:`llamad.supervisor.child.heartbeat` at least this often once ready;
      a child silent for longer is SIGKILLed and handled as an abnormal exit.
    - ``start_timeout`` (beyond OTP): how long the child may take to report
      ready; longer counts as a failed start. ``None`` waits forever.
    - ``env`` (beyond OTP): variables added to (or replacing in) the
      supervisor's environment for this child; names are
      ``[A-Za-z_][A-Za-z0-9_]*``, values strings without NUL.
    - ``cwd`` (beyond OTP): the child's working directory, an absolute path;
      ``None`` keeps the supervisor's. A directory that does not exist when
      the child starts makes the start fail (reason ``spawn``).
    - ``hosted`` (beyond OTP): a supervisor child that runs on a thread of
      its parent's process instead of a process of its own
      (:mod:`llamad.supervisor.hosted`). Only for ``type`` ``supervisor``
      started by :func:`supervisor_child`, without ``env`` or ``cwd``: a
      supervisor holds no state a crash must not take down, so an
      interpreter of its own buys nothing but memory.
    """

    id: str
    start: Start
    restart: Restart = Restart.PERMANENT
    shutdown: Shutdown | None = None
    type: ChildType = ChildType.WORKER
    significant: bool = False
    liveness_timeout: float | None = None
    start_timeout: float | None = DEFAULT_START_TIMEOUT
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    hosted: bool = False

    def __post_init__(self) -> None:
        _check_id(self.id, "id")
        if not isinstance(self.start, Start):
            raise InvalidSpec("start", f"must be a Start, got {type(self.start).__name__}")
        set_ = object.__setattr__
        set_(self, "restart", _enum(Restart, self.restart, "restart"))
        set_(self, "type", _enum(ChildType, self.type, "type"))
        set_(self, "shutdown", self._resolve_shutdown())
        if not isinstance(self.significant, bool):
            raise InvalidSpec("significant", f"must be a bool, got {self.significant!r}")
        if self.significant and self.restart is Restart.PERMANENT:
            raise InvalidSpec(
                "significant", "only a transient or temporary child can be significant"
            )
        set_(self, "liveness_timeout", _optional_seconds(self.liveness_timeout, "liveness_timeout"))
        set_(self, "start_timeout", _optional_seconds(self.start_timeout, "start_timeout"))
        set_(self, "env", _check_env(self.env, "env"))
        set_(self, "cwd", _check_cwd(self.cwd, "cwd"))
        self._check_hosted()

    def _check_hosted(self) -> None:
        if not isinstance(self.hosted, bool):
            raise InvalidSpec("hosted", f"must be a bool, got {self.hosted!r}")
        if not self.hosted:
            return
        if self.type is not ChildType.SUPERVISOR or self.start.target != SUPERVISOR_ENTRY:
            raise InvalidSpec("hosted", "only a supervisor child (supervisor_child) can be hosted")
        if self.env or self.cwd is not None:
            raise InvalidSpec("hosted", "a hosted child shares its parent's env and cwd")

    def _resolve_shutdown(self) -> Shutdown:
        value = self.shutdown
        if value is None:
            return INFINITY if self.type is ChildType.SUPERVISOR else DEFAULT_WORKER_SHUTDOWN
        if value in (BRUTAL_KILL, INFINITY):
            return value
        if isinstance(value, str):
            raise InvalidSpec(
                "shutdown", f"must be brutal_kill, infinity or seconds, got {value!r}"
            )
        return _seconds(value, "shutdown", allow_zero=True)

    @property
    def shutdown_policy(self) -> Shutdown:
        """``shutdown`` after defaulting (never ``None``)."""
        assert self.shutdown is not None
        return self.shutdown

    def with_start(self, start: Start, child_id: str | None = None) -> ChildSpec:
        """A copy with another ``start`` (and optionally another id)."""
        return ChildSpec(
            id=child_id or self.id,
            start=start,
            restart=self.restart,
            shutdown=self.shutdown,
            type=self.type,
            significant=self.significant,
            liveness_timeout=self.liveness_timeout,
            start_timeout=self.start_timeout,
            env=self.env,
            cwd=self.cwd,
            hosted=self.hosted,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "start": self.start.to_wire(),
            "restart": self.restart.value,
            "shutdown": self.shutdown,
            "type": self.type.value,
            "significant": self.significant,
            "liveness_timeout": self.liveness_timeout,
            "start_timeout": self.start_timeout,
            "env": dict(self.env),
            "cwd": self.cwd,
            "hosted": self.hosted,
        }

    @classmethod
    def from_wire(cls, data: object, name: str = "") -> ChildSpec:
        """Rebuild and validate a spec sent by :meth:`to_wire` (or written by hand)."""
        allowed = {f for f in cls.__dataclass_fields__}
        _check_wire_keys(data, allowed, {"id", "start"}, name)
        assert isinstance(data, Mapping)
        prefix = f"{name}." if name else ""
        kwargs = dict(data)
        kwargs["start"] = Start.from_wire(data["start"], f"{prefix}start")
        try:
            return cls(**kwargs)
        except InvalidSpec as exc:
            if not prefix:
                raise
            raise InvalidSpec(f"{prefix}{exc.field}", exc.problem) from exc


@dataclass(frozen=True)
class SupFlags:
    """How a supervisor restarts (OTP ``sup_flags()``).

    More than ``intensity`` restarts within ``period`` seconds (a sliding
    window on the monotonic clock) make the supervisor stop all its children
    and exit abnormally, escalating to its own supervisor.
    """

    strategy: Strategy = Strategy.ONE_FOR_ONE
    intensity: int = 1
    period: float = 5.0
    auto_shutdown: AutoShutdown = AutoShutdown.NEVER

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", _enum(Strategy, self.strategy, "strategy"))
        if isinstance(self.intensity, bool) or not isinstance(self.intensity, int):
            raise InvalidSpec("intensity", f"must be an int, got {self.intensity!r}")
        if self.intensity < 0:
            raise InvalidSpec("intensity", f"must be >= 0, got {self.intensity}")
        object.__setattr__(self, "period", _seconds(self.period, "period", allow_zero=False))
        object.__setattr__(
            self, "auto_shutdown", _enum(AutoShutdown, self.auto_shutdown, "auto_shutdown")
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy.value,
            "intensity": self.intensity,
            "period": self.period,
            "auto_shutdown": self.auto_shutdown.value,
        }

    @classmethod
    def from_wire(cls, data: object, name: str = "flags") -> SupFlags:
        allowed = {f for f in cls.__dataclass_fields__}
        _check_wire_keys(data, allowed, set(), name)
        assert isinstance(data, Mapping)
        try:
            return cls(**data)
        except InvalidSpec as exc:
            raise InvalidSpec(f"{name}.{exc.field}", exc.problem) from exc


def check_child_fits(flags: SupFlags, spec: ChildSpec, name: str) -> None:
    """Raise if ``spec`` may not live under a supervisor with ``flags``.

    OTP's combination rule: a significant child needs an ``auto_shutdown``
    other than ``never``.
    """
    if spec.significant and flags.auto_shutdown is AutoShutdown.NEVER:
        raise InvalidSpec(
            f"{name}.significant", "a significant child needs auto_shutdown other than never"
        )


@dataclass(frozen=True)
class SupervisorSpec:
    """A whole supervisor: its name (for logs), flags and children in start order.

    For ``simple_one_for_one``, ``children`` holds exactly one spec: the
    template that :meth:`Supervisor.start_child` instantiates with extra args.
    """

    name: str
    flags: SupFlags = field(default_factory=SupFlags)
    children: tuple[ChildSpec, ...] = ()

    def __post_init__(self) -> None:
        _check_id(self.name, "name")
        if not isinstance(self.flags, SupFlags):
            raise InvalidSpec("flags", f"must be SupFlags, got {type(self.flags).__name__}")
        if not isinstance(self.children, list | tuple):
            raise InvalidSpec("children", "must be a sequence of ChildSpec")
        children = tuple(self.children)
        object.__setattr__(self, "children", children)
        seen: set[str] = set()
        for i, child in enumerate(children):
            if not isinstance(child, ChildSpec):
                raise InvalidSpec(f"children[{i}]", f"must be a ChildSpec, got {child!r}")
            if child.id in seen:
                raise InvalidSpec(f"children[{i}].id", f"duplicate child id {child.id!r}")
            seen.add(child.id)
            check_child_fits(self.flags, child, f"children[{i}]")
        if self.flags.strategy is Strategy.SIMPLE_ONE_FOR_ONE and len(children) != 1:
            raise InvalidSpec(
                "children", f"simple_one_for_one needs exactly one template, got {len(children)}"
            )

    def to_wire(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "flags": self.flags.to_wire(),
            "children": [c.to_wire() for c in self.children],
        }

    @classmethod
    def from_wire(cls, data: object) -> SupervisorSpec:
        _check_wire_keys(data, {"name", "flags", "children"}, {"name"}, "")
        assert isinstance(data, Mapping)
        raw_children = data.get("children", ())
        if not isinstance(raw_children, list | tuple):
            raise InvalidSpec("children", "must be a list")
        children = tuple(
            ChildSpec.from_wire(c, f"children[{i}]") for i, c in enumerate(raw_children)
        )
        return cls(data["name"], SupFlags.from_wire(data.get("flags", {})), children)


#: The entry that runs a nested supervisor in its own child process.
SUPERVISOR_ENTRY = "llamad.supervisor.supervisor_proc:run_supervisor_process"


def supervisor_child(
    spec: SupervisorSpec,
    *,
    child_id: str | None = None,
    restart: Restart = Restart.PERMANENT,
    shutdown: Shutdown | None = None,
    significant: bool = False,
    liveness_timeout: float | None = None,
    start_timeout: float | None = DEFAULT_START_TIMEOUT,
    service: str | None = None,
    hosted: bool = False,
) -> ChildSpec:
    """A child spec that runs the supervisor ``spec`` as a child process
    (``hosted``: on a thread of its parent's process, see
    :mod:`llamad.supervisor.hosted`).

    The child reports ready only once all of its own children have started, so
    the parent's start order holds across levels (as with OTP's ``start_link``).
    With ``service``, the child also serves its dynamic API (``start_child``,
    ``which_children``, ...) as the actor of that name, for other processes
    (see :mod:`llamad.supervisor.service`).
    """
    kwargs: dict[str, Any] = {"spec": spec.to_wire()}
    if service is not None:
        kwargs["service"] = service
    return ChildSpec(
        id=child_id or spec.name,
        start=Start(SUPERVISOR_ENTRY, (), kwargs),
        restart=restart,
        shutdown=shutdown,
        type=ChildType.SUPERVISOR,
        significant=significant,
        liveness_timeout=liveness_timeout,
        start_timeout=start_timeout,
        hosted=hosted,
    )
