"""The child side of supervision: the runner every child execs into, and its helpers.

A supervisor starts each child as ``python -m llamad.supervisor.run_child ...``
(spawn/exec, never a fork of the threaded supervisor). The runner:

1. asks the kernel to SIGKILL it when its parent dies (``PR_SET_PDEATHSIG``),
   then checks ``getppid()`` against the parent it was given, closing the race
   where the parent died before the ``prctl`` took effect;
2. reads its boot record (msgpack: target, args, kwargs, liveness timeout)
   from an inherited pipe, so arguments need no argv quoting and have no
   argv size limit;
3. imports the target, reports *ready* on the status pipe (unless the target
   is marked :func:`notifies_ready` and reports it itself), and calls it.

The status pipe carries one byte per message from child to supervisor:
``R`` (ready) and ``H`` (heartbeat). A pipe, rather than the actor runtime,
because it needs no ZeroMQ context in the child (a worker that hangs inside a
C call still has a working pipe, and a heartbeat costs one ``write``), it works
before the child has built any sockets, and the supervisor can watch it in the
same ``epoll`` set as the children's pidfds.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import importlib
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import msgpack

from llamad._heap import release_free_heap
from llamad.supervisor.exits import (
    EXIT_CHILD_BOOT_FAILED,
    EXIT_CHILD_ERROR,
    EXIT_NORMAL,
    EXIT_ORPHANED,
)

__all__ = [
    "ChildContext",
    "beat_interval",
    "child_context",
    "heartbeat",
    "heartbeat_interval",
    "main",
    "notifies_ready",
    "notify_ready",
    "write_status",
]

READY = b"R"
HEARTBEAT = b"H"

_PR_SET_PDEATHSIG = 1
_READY_ATTR = "__llamad_notifies_ready__"

_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class ChildContext:
    """Who this process is in the tree (available inside the entry function)."""

    supervisor: str
    child_id: str
    parent_pid: int
    status_fd: int
    liveness_timeout: float | None


_context: ChildContext | None = None
_ready_sent = False
_last_beat = 0.0
_lock = threading.Lock()


def child_context() -> ChildContext | None:
    """This process's place in the tree, or ``None`` when not run by a supervisor."""
    return _context


def notifies_ready(fn: _F) -> _F:
    """Mark an entry function that calls :func:`notify_ready` itself.

    Without the mark the runner reports ready as soon as the target is
    imported. With it, the supervisor waits (up to the spec's
    ``start_timeout``) until the function says it is ready, e.g. after a model
    has loaded or, for a nested supervisor, after its children have started.
    """
    setattr(fn, _READY_ATTR, True)
    return fn


def notify_ready() -> None:
    """Tell the supervisor this child has started (idempotent; no-op if unsupervised)."""
    global _ready_sent
    ctx = _context
    with _lock:
        if ctx is None or _ready_sent:
            return
        _ready_sent = True
        write_status(ctx.status_fd, READY)
    # Started: what the imports and the start freed goes back to the system
    # instead of staying resident for the child's life (SPEC P9).
    release_free_heap()


def heartbeat_interval() -> float | None:
    """How often :func:`heartbeat` actually writes (``None`` if no liveness timeout)."""
    ctx = _context
    if ctx is None or ctx.liveness_timeout is None:
        return None
    return beat_interval(ctx.liveness_timeout)


def beat_interval(liveness_timeout: float) -> float:
    """How often a child watched with ``liveness_timeout`` should beat."""
    # Four beats per timeout window leave room for a loaded machine's scheduling delay.
    return liveness_timeout / 4


def heartbeat() -> None:
    """Prove liveness to the supervisor; call it from the loop whose progress matters.

    Cheap enough to call on every iteration: it writes at most once per
    :func:`heartbeat_interval` and never blocks (a full pipe means the
    supervisor is behind, and a dropped beat is harmless then).
    """
    global _last_beat
    ctx = _context
    interval = heartbeat_interval()
    if ctx is None or interval is None:
        return
    now = time.monotonic()
    if now - _last_beat < interval:
        return
    _last_beat = now
    write_status(ctx.status_fd, HEARTBEAT)


def write_status(fd: int, message: bytes) -> None:
    """One status byte to the supervisor; never blocks, never raises."""
    # The supervisor may be gone or behind; neither may take the child down here.
    with contextlib.suppress(BlockingIOError, BrokenPipeError, OSError):
        os.write(fd, message)


def _set_parent_death_signal() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")


def _read_boot(fd: int) -> dict[str, Any]:
    chunks: list[bytes] = []
    with os.fdopen(fd, "rb", closefd=True) as f:
        while chunk := f.read(65536):
            chunks.append(chunk)
    boot = msgpack.unpackb(b"".join(chunks), raw=False)
    if not isinstance(boot, Mapping) or not isinstance(boot.get("target"), str):
        raise ValueError("malformed boot record")
    return dict(boot)


def _resolve(target: str) -> Callable[..., Any]:
    module_name, _, attr_path = target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr_path.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise TypeError(f"{target} is not callable")
    return obj  # type: ignore[no-any-return]


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llamad.supervisor.run_child")
    parser.add_argument("--sup", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--boot-fd", type=int, required=True)
    parser.add_argument("--status-fd", type=int, required=True)
    return parser.parse_args(argv)


def prepare_status_fd(fd: int) -> None:
    """Make the status pipe private to this process and non-blocking.

    Non-blocking is what lets :func:`heartbeat` drop a beat instead of hanging
    when a stuck supervisor leaves the pipe full.
    """
    os.set_inheritable(fd, False)
    os.set_blocking(fd, False)


def main(argv: list[str] | None = None) -> NoReturn:
    """Entry of every supervised child process (see the module docstring)."""
    global _context
    args = _parse_args(sys.argv[1:] if argv is None else argv)
    _set_parent_death_signal()
    if os.getppid() != args.parent:
        os._exit(EXIT_ORPHANED)
    try:
        boot = _read_boot(args.boot_fd)
        prepare_status_fd(args.status_fd)
        liveness = boot.get("liveness_timeout")
        _context = ChildContext(
            supervisor=args.sup,
            child_id=args.id,
            parent_pid=args.parent,
            status_fd=args.status_fd,
            liveness_timeout=float(liveness) if liveness is not None else None,
        )
        fn = _resolve(boot["target"])
        call_args = list(boot.get("args") or ())
        call_kwargs = dict(boot.get("kwargs") or {})
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(EXIT_CHILD_BOOT_FAILED)
    if not getattr(fn, _READY_ATTR, False):
        notify_ready()
    try:
        fn(*call_args, **call_kwargs)
    except SystemExit:
        raise
    except BaseException:
        traceback.print_exc()
        sys.exit(EXIT_CHILD_ERROR)
    sys.exit(EXIT_NORMAL)
