"""The supervisor's process shell: one event loop that spawns, watches and stops children.

:class:`Supervisor` owns a :class:`~llamad.supervisor.core.SupervisorCore`
(the OTP rules) and the child processes. Its loop waits in one ``epoll`` set
on every child's pidfd (exit), every child's status pipe (ready, heartbeats)
and a wake-up pipe (API commands from other threads, signals). It executes the
core's decisions: stop children (SIGTERM, wait ``shutdown``, SIGKILL, reap),
start them in order, escalate or shut down.

Two ways to run it:

- ``Supervisor(spec).run()`` in a process's main thread: a root
  (:func:`run_root`; the daemon's own root is run by
  :mod:`llamad.daemon.main`) or a nested supervisor child
  (:func:`run_supervisor_process`, its entry point); SIGTERM/SIGINT stop it
  in order; it returns the exit code to exit with.
- ``Supervisor(spec).start()`` on a background thread, for in-process use (and
  tests); :meth:`Supervisor.stop` shuts it down.

Every public method is thread-safe: calls from other threads are marshalled to
the loop thread, which alone spawns children. That matters beyond tidiness:
``PR_SET_PDEATHSIG`` fires when the *thread* that forked a child exits, so
children must be created by the thread that lives as long as the supervisor.

Every decision carried out is logged and published as one event
(:mod:`llamad.supervisor.events`) on :attr:`Supervisor.events`.

File descriptors: the supervisor owns its wake-up pipe and ``epoll`` set, and
per child a pidfd and the status pipe's read end (:class:`ChildHandle`: a
:class:`ChildProcess`, or a :class:`~llamad.supervisor.hosted.HostedChild`
for a supervisor child hosted on a thread of this process).
Every path that drops a child — its own exit, a stop, a failed start, the
supervisor's end — closes that child's fds, so a supervisor that restarts a
crashing child forever holds the same fds throughout, and one that has
stopped holds none.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import FrameType
from typing import Any, NoReturn, Protocol, TypeVar

import structlog

from llamad.logs import configure as configure_logs
from llamad.supervisor import child as child_side
from llamad.supervisor.child import notifies_ready, notify_ready
from llamad.supervisor.child_process import (
    ChildHandle,
    ChildProcess,
    Interrupt,
    ReadyOutcome,
    shutdown_processes,
)
from llamad.supervisor.core import (
    AutoShutdownPlan,
    ChildCounts,
    ChildInfo,
    Decision,
    Escalation,
    LastExit,
    NotRestarted,
    RestartPlan,
    Stale,
    StartedChild,
    Stop,
    SupervisorCore,
)
from llamad.supervisor.errors import StartFailed, SupervisorStopped
from llamad.supervisor.events import (
    ChildExited,
    ChildHung,
    ChildNotRestarted,
    ChildRestarted,
    ChildRestartFailed,
    ChildShutdownTimeout,
    ChildStarted,
    ChildStartFailed,
    ChildStopped,
    EventFeed,
    SupAutoShutdown,
    SupCrashed,
    SupervisorEvent,
    SupEscalated,
    SupRestarting,
    SupShuttingDown,
    SupStarted,
    SupStopped,
    event_kind,
    log_fields,
)
from llamad.supervisor.exits import (
    EXIT_CRASHED,
    EXIT_ESCALATED,
    EXIT_NORMAL,
    EXIT_START_FAILED,
    ExitReason,
    classify_exit,
    describe_exit,
)
from llamad.supervisor.hosted import HostedChild, PipeBeat
from llamad.supervisor.spec import BRUTAL_KILL, ChildSpec, Shutdown, SupervisorSpec

__all__ = ["ChildBeat", "OwnBeat", "ParentBeat", "Supervisor", "run_root", "run_supervisor_process"]

log = structlog.get_logger("llamad.supervisor")

_T = TypeVar("_T")

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_STOP_TICK_S = 0.5


class OwnBeat(Protocol):
    """How a supervisor shows whoever watches it that its loop turns.

    Called on the loop thread at every turn of the loop and while it waits on
    a child's start or stop; :meth:`interval` caps how long the loop sleeps
    between two calls. By default (:class:`ParentBeat`) the beat is a
    heartbeat on the parent supervisor's status pipe; the daemon's root,
    watched by systemd, pings systemd's watchdog instead
    (:mod:`llamad.daemon.readiness`).
    """

    def interval(self) -> float | None: ...

    def beat(self, sup: Supervisor) -> None: ...


class ParentBeat:
    """A heartbeat to the parent supervisor (none when this process has none)."""

    def interval(self) -> float | None:
        return child_side.heartbeat_interval()

    def beat(self, sup: Supervisor) -> None:
        child_side.heartbeat()


@dataclass(frozen=True)
class ChildBeat:
    """When a running child last proved it is alive (:meth:`Supervisor.child_beats`)."""

    child_id: str
    pid: int
    silent_s: float
    """Seconds since its last heartbeat (or its ready report)."""
    liveness_timeout: float | None
    killed_for: str | None
    """Set once this supervisor has SIGKILLed it and has not reaped it yet."""


class Supervisor:
    """A running supervisor: OTP semantics over real OS processes."""

    def __init__(self, spec: SupervisorSpec, *, own_beat: OwnBeat | None = None) -> None:
        self.spec = spec
        self._own_beat: OwnBeat = own_beat if own_beat is not None else ParentBeat()
        self.name = spec.name
        self._core = SupervisorCore(spec)
        self._log = log.bind(sup=spec.name)
        self._events = EventFeed(spec.name)
        self._procs: dict[int, ChildHandle] = {}
        #: Children being stopped now (out of ``_procs``), for a kill that
        #: comes in the middle of a graceful stop.
        self._stopping: list[ChildHandle] = []
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._commands: deque[tuple[Callable[[], Any], Future[Any]]] = deque()
        self._commands_lock = threading.Lock()
        self._accepting = True
        self._retries: deque[str] = deque()
        self._stop_requested = False
        self._kill_requested = False
        self._loop_thread: int | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._done = threading.Event()
        self._start_error: StartFailed | None = None
        self._exit_code: int | None = None

    # ================================================================= running

    def run(
        self,
        *,
        install_signal_handlers: bool = True,
        on_ready: Callable[[], None] | None = None,
    ) -> int:
        """Start the children in order, then supervise until told to stop or giving up.

        Returns the exit code for this process: 0 after a requested stop or an
        auto_shutdown, :data:`~llamad.supervisor.exits.EXIT_ESCALATED` after
        exceeding the restart intensity, :data:`~llamad.supervisor.exits.EXIT_START_FAILED`
        if an initial child could not start. ``on_ready`` runs once every
        initial child has started.
        """
        if self._loop_thread is not None:
            raise RuntimeError("a Supervisor runs once")
        self._loop_thread = threading.get_ident()
        restore = self._install_signals() if install_signal_handlers else None
        code: int = EXIT_START_FAILED
        try:
            early_exit = self._start_initial()
            if early_exit is not None:
                code = early_exit
            else:
                self._started.set()
                if on_ready is not None:
                    on_ready()
                code = self._loop()
        except BaseException as exc:
            code = EXIT_CRASHED
            self._log.exception("sup.crashed")
            self._events.publish(SupCrashed(error=f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            # Signals must stop writing to the wake-up pipe before it is closed.
            if restore is not None:
                restore()
            self._close(code)
        return code

    def start(self) -> None:
        """Run on a background thread; return once every initial child has started.

        Raises :class:`~llamad.supervisor.errors.StartFailed` (after stopping
        whatever had started) if an initial child cannot start.
        """
        self._thread = threading.Thread(
            target=self._run_in_thread,
            name=f"supervisor-{self.name}",
            daemon=True,
        )
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error
        if self._done.is_set():
            raise SupervisorStopped(
                f"supervisor {self.name!r} ended while starting", details={"supervisor": self.name}
            )

    def _run_in_thread(self) -> None:
        # A crash is logged by run() and visible as exit_code; the children are
        # already gone. Re-raising here would only reach threading's excepthook.
        with contextlib.suppress(Exception):
            self.run(install_signal_handlers=False)

    def stop(self, timeout: float | None = None) -> int | None:
        """Stop every child in reverse start order and end the loop; the exit code.

        ``None`` if the loop did not finish within ``timeout``.
        """
        self.request_stop()
        return self.wait(timeout)

    def request_stop(self) -> None:
        """Ask the loop to shut down (returns at once; safe from any thread)."""
        self._stop_requested = True
        self._wake()

    def request_kill(self) -> None:
        """Kill every child at once (SIGKILL, no shutdown policy) and end the
        loop, even in the middle of a graceful stop (safe from any thread).

        What a supervisor process does when its own parent SIGKILLs it (its
        children die with it by their parent-death signal), for a supervisor
        hosted on a thread (:mod:`llamad.supervisor.hosted`)."""
        self._kill_requested = True
        self.request_stop()

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the loop to end (stop, escalation, auto_shutdown); its exit code."""
        if not self._done.wait(timeout):
            return None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        return self._exit_code

    @property
    def exit_code(self) -> int | None:
        """The exit code once the loop has ended, else ``None``."""
        return self._exit_code

    @property
    def running(self) -> bool:
        return self._started.is_set() and not self._done.is_set()

    @property
    def events(self) -> EventFeed:
        """The decisions this supervisor carried out, as events (thread-safe to read)."""
        return self._events

    def __enter__(self) -> Supervisor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ============================================================ public API

    def start_child(
        self, child: ChildSpec | Sequence[Any], *, child_id: str | None = None
    ) -> StartedChild:
        """Start a new child; its id and pid once it is ready (OTP ``start_child``).

        A static supervisor takes a :class:`ChildSpec` (appended to the start
        order); ``simple_one_for_one`` takes extra args for its template and an
        optional ``child_id``. Blocks until the child reports ready.
        """
        return self._call(lambda: self._do_start_child(child, child_id))

    def terminate_child(self, child: str | int) -> None:
        """Stop a child by id (or pid) with its shutdown policy; keep its spec unless
        it is temporary or dynamic (OTP ``terminate_child``)."""
        self._call(lambda: self._do_terminate_child(child))

    def restart_child(self, child_id: str) -> int:
        """Start a kept child spec that has no process; its new pid."""
        return self._call(lambda: self._do_restart_child(child_id))

    def delete_child(self, child_id: str) -> None:
        """Forget a kept child spec that has no process."""
        self._call(lambda: self._core.delete(child_id))

    def which_children(self) -> list[ChildInfo]:
        """Every child in start order with its pid or state."""
        return self._call(self._core.which_children)

    def count_children(self) -> ChildCounts:
        return self._call(self._core.count_children)

    def child_beats(self) -> list[ChildBeat]:
        """Every running child's last sign of life, for an :class:`OwnBeat`.

        Loop thread only (where an ``OwnBeat`` runs). Each child's status pipe
        is drained first, so beats count even while the loop itself waits on
        another child's start or stop and does not read the pipes.
        """
        now = time.monotonic()
        beats = []
        for proc in self._procs.values():
            proc.read_status()  # EOF is the loop's to handle, on its next turn
            beats.append(
                ChildBeat(
                    child_id=proc.spec.id,
                    pid=proc.pid,
                    silent_s=max(0.0, now - proc.last_beat),
                    liveness_timeout=proc.spec.liveness_timeout,
                    killed_for=proc.killed_for,
                )
            )
        return beats

    # ================================================================ loop

    def _loop(self) -> int:
        while True:
            if self._stop_requested:
                return self._shut_down("requested", self._core.shutdown_order(), EXIT_NORMAL)
            exited: list[ChildHandle] = []
            for key, _ in self._selector.select(self._next_timeout()):
                if key.data is None:
                    self._drain_wake()
                    continue
                kind, proc = key.data
                if kind == "status":
                    if not proc.read_status():
                        self._selector.unregister(key.fd)
                        proc.close_status()
                else:
                    exited.append(proc)
            if self._stop_requested:
                continue
            for proc in exited:
                # Identity, not pid: handling an earlier exit may already have
                # stopped this one (one_for_all) and started others.
                if self._procs.get(proc.pid) is proc:
                    code = self._handle_exit(proc)
                    if code is not None:
                        return code
            self._run_commands()
            for _ in range(len(self._retries)):
                code = self._retry(self._retries.popleft())
                if code is not None:
                    return code
            self._check_liveness()
            self._beat()

    def _beat(self) -> None:
        if self._kill_requested:
            # Runs while every wait turns (a start, a stop): a kill that came
            # during a graceful stop ends that stop now.
            for proc in self._stopping:
                proc.kill("supervisor_killed")
        self._own_beat.beat(self)

    def _next_timeout(self) -> float | None:
        waits: list[float] = []
        if self._retries or self._commands:
            return 0.0
        now = time.monotonic()
        for proc in self._procs.values():
            limit = proc.spec.liveness_timeout
            if limit is not None:
                waits.append(max(0.0, proc.last_beat + limit - now) + 0.001)
        own = self._own_beat.interval()
        if own is not None:
            waits.append(own)
        return min(waits) if waits else None

    def _handle_exit(self, proc: ChildHandle) -> int | None:
        rc = proc.reap()
        assert rc is not None, "pidfd readable means the child has exited"
        self._forget(proc)
        # The child is gone and reaped: its pidfd and status pipe are ours to
        # close, or every unplanned exit would leak them until EMFILE.
        proc.close()
        now, at = time.monotonic(), time.time()
        reason = classify_exit(rc)
        exit_text = describe_exit(rc)
        decision = self._core.exited(
            proc.pid, reason, now, at=at, exit=exit_text, cause=proc.killed_for
        )
        self._publish(
            ChildExited(
                child=proc.spec.id,
                pid=proc.pid,
                reason=reason,
                exit=exit_text,
                cause=proc.killed_for,
                restarts_in_window=self._core.restarts_in_window(now),
            ),
            at=at,
        )
        return self._execute(decision)

    def _publish(self, event: SupervisorEvent, *, at: float | None = None) -> None:
        """Log ``event`` and publish it to subscribers: one vocabulary for both."""
        stamped = self._events.publish(event, at=at)
        getattr(self._log, stamped.log_level())(event_kind(stamped), **log_fields(stamped))

    def _execute(self, decision: Decision) -> int | None:
        if isinstance(decision, Stale):
            return None
        if isinstance(decision, NotRestarted):
            self._publish(ChildNotRestarted(child=decision.child_id, removed=decision.removed))
            return None
        if isinstance(decision, RestartPlan):
            self._publish(
                SupRestarting(
                    trigger=decision.trigger,
                    strategy=self.spec.flags.strategy.value,
                    stop=tuple(s.child_id for s in decision.stop),
                    start=decision.start,
                    restarts_in_window=decision.restarts_in_window,
                )
            )
            self._stop_children(decision.stop)
            for child_id in decision.start:
                result = self._spawn_and_wait(self._core.spec_of(child_id))
                if isinstance(result, StartFailed):
                    self._core.start_failed(child_id)
                    self._retries.append(child_id)
                    self._publish(ChildRestartFailed(child=child_id, **_failure_fields(result)))
                    break
                restarts = self._core.restarted(child_id, result.pid)
                self._publish(
                    ChildRestarted(
                        child=child_id,
                        pid=result.pid,
                        restarts=restarts,
                        restarts_in_window=decision.restarts_in_window,
                    )
                )
            return None
        if isinstance(decision, Escalation):
            self._publish(
                SupEscalated(
                    trigger=decision.trigger,
                    restarts_in_window=decision.restarts_in_window,
                    intensity=self.spec.flags.intensity,
                    period=self.spec.flags.period,
                )
            )
            return self._shut_down("escalated", decision.stop, EXIT_ESCALATED)
        assert isinstance(decision, AutoShutdownPlan)
        self._publish(SupAutoShutdown(trigger=decision.trigger))
        return self._shut_down("auto_shutdown", decision.stop, EXIT_NORMAL)

    def _retry(self, child_id: str) -> int | None:
        decision = self._core.try_again(child_id, time.monotonic())
        return None if decision is None else self._execute(decision)

    def _check_liveness(self) -> None:
        now = time.monotonic()
        for proc in list(self._procs.values()):
            limit = proc.spec.liveness_timeout
            if limit is None or proc.killed_for is not None:
                continue
            # Beats that came while the loop waited on another child's start
            # or stop are still unread in the pipe: a child is judged on them,
            # not on the last one read (EOF is the loop's, on its next turn).
            proc.read_status()
            silent = now - proc.last_beat
            if silent > limit:
                self._publish(
                    ChildHung(
                        child=proc.spec.id,
                        pid=proc.pid,
                        silent_for=round(silent, 3),
                        liveness_timeout=limit,
                    )
                )
                proc.kill("hung")

    # ====================================================== starting children

    def _start_initial(self) -> int | None:
        """Start the initial children; the exit code if the supervisor must end now."""
        for child_id in self._core.initial_starts():
            result = self._spawn_and_wait(self._core.spec_of(child_id))
            if isinstance(result, StartFailed):
                if result.details.get("reason") == "interrupted":
                    return self._shut_down("requested", self._core.shutdown_order(), EXIT_NORMAL)
                self._publish(ChildStartFailed(child=child_id, **_failure_fields(result)))
                self._start_error = result
                self._shut_down("start_failed", self._core.shutdown_order(), EXIT_START_FAILED)
                return EXIT_START_FAILED
            self._core.started(child_id, result.pid)
            self._publish(ChildStarted(child=child_id, pid=result.pid))
        self._publish(
            SupStarted(
                strategy=self.spec.flags.strategy.value,
                children=len(self._core.initial_starts()),
                pid=os.getpid(),
            )
        )
        return None

    def _spawn(self, spec: ChildSpec) -> ChildHandle:
        if spec.hosted:
            return HostedChild.spawn(spec, lambda beat: _ServedSupervisor.hosted(spec, beat))
        return ChildProcess.spawn(spec, supervisor=self.name)

    def _spawn_and_wait(self, spec: ChildSpec) -> ChildHandle | StartFailed:
        try:
            proc = self._spawn(spec)
        except OSError as exc:
            return StartFailed(
                f"cannot spawn {spec.id!r}: {exc}",
                details={"child": spec.id, "reason": "spawn", "error": str(exc)},
            )
        try:
            outcome = proc.wait_ready(
                spec.start_timeout,
                self._beat,
                self._own_beat.interval(),
                Interrupt(self._wake_r, self._stop_wanted),
            )
        except BaseException:
            # Not ours to keep if the wait itself failed: neither the process
            # nor its fds may outlive this call.
            proc.kill("supervisor_failed")
            proc.wait(None)
            proc.close()
            raise
        if outcome is ReadyOutcome.READY:
            self._procs[proc.pid] = proc
            self._selector.register(proc.pidfd, selectors.EVENT_READ, ("exit", proc))
            if proc.status_fd is not None:
                self._selector.register(proc.status_fd, selectors.EVENT_READ, ("status", proc))
            return proc
        if outcome in (ReadyOutcome.TIMEOUT, ReadyOutcome.INTERRUPTED):
            # Not started yet, so no shutdown protocol applies: nothing to save.
            proc.kill(outcome.value)
            proc.wait(None)
            proc.close()
            if outcome is ReadyOutcome.INTERRUPTED:
                return StartFailed(
                    f"start of {spec.id!r} abandoned: the supervisor is stopping",
                    details={"child": spec.id, "reason": "interrupted", "pid": proc.pid},
                )
            return StartFailed(
                f"{spec.id!r} did not report ready within {spec.start_timeout}s",
                details={"child": spec.id, "reason": "start_timeout", "pid": proc.pid},
            )
        rc = proc.returncode
        proc.close()
        exit_text = describe_exit(rc) if rc is not None else "unknown"
        return StartFailed(
            f"{spec.id!r} exited before it was ready ({exit_text})",
            details={"child": spec.id, "reason": "exit", "exit": exit_text, "pid": proc.pid},
        )

    # ====================================================== stopping children

    def _stop_children(self, stops: Sequence[Stop]) -> None:
        """Stop ``stops`` in the given order (simple_one_for_one: all at once)."""
        procs = [self._procs[s.pid] for s in stops if s.pid in self._procs]
        if not procs:
            return
        if self._core.is_dynamic:
            self._terminate(procs, self._core.spec.children[0].shutdown_policy)
            return
        for proc in procs:
            self._terminate([proc], proc.spec.shutdown_policy)

    def _terminate(self, procs: list[ChildHandle], policy: Shutdown) -> None:
        for proc in procs:
            self._forget(proc)
        if self._kill_requested:
            policy = BRUTAL_KILL
        self._stopping = procs
        own = self._own_beat.interval()
        # Turn at least every _STOP_TICK_S while children stop, so that a kill
        # (request_kill) cuts a long graceful stop short promptly.
        tick_every = _STOP_TICK_S if own is None else min(own, _STOP_TICK_S)
        try:
            shutdown_processes(procs, policy, self._beat, tick_every)
        finally:
            self._stopping = []
        for proc in procs:
            proc.close()
            rc = proc.returncode
            exit_text = describe_exit(rc) if rc is not None else "unknown"
            if proc.killed_for == "shutdown_timeout":
                self._publish(
                    ChildShutdownTimeout(child=proc.spec.id, pid=proc.pid, shutdown=policy)
                )
            at = time.time()
            self._core.stopped(
                proc.spec.id,
                LastExit(reason=ExitReason.SHUTDOWN, at=at, exit=exit_text, cause=proc.killed_for),
            )
            self._publish(ChildStopped(child=proc.spec.id, pid=proc.pid, exit=exit_text), at=at)

    def _shut_down(self, why: str, stops: Sequence[Stop], code: int) -> int:
        self._publish(SupShuttingDown(reason=why, children=len(stops)))
        self._stop_children(stops)
        self._publish(SupStopped(reason=why, exit_code=code))
        return code

    def _forget(self, proc: ChildHandle) -> None:
        self._procs.pop(proc.pid, None)
        for fd in (proc.pidfd, proc.status_fd):
            if fd is not None and fd >= 0:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(fd)

    # ====================================================== dynamic children

    def _do_start_child(
        self, child: ChildSpec | Sequence[Any], child_id: str | None
    ) -> StartedChild:
        spec = self._core.prepare_start(child, child_id)
        result = self._spawn_and_wait(spec)
        if isinstance(result, StartFailed):
            self._publish(ChildStartFailed(child=spec.id, **_failure_fields(result)))
            raise result
        self._core.add_started(spec, result.pid)
        self._publish(ChildStarted(child=spec.id, pid=result.pid, dynamic=True))
        return StartedChild(spec.id, result.pid)

    def _do_terminate_child(self, child: str | int) -> None:
        child_id = self._core.resolve(child)
        pid = self._core.pid_of(child_id)
        if pid is not None:
            self._stop_children((Stop(child_id, pid),))
        self._core.terminated(child_id)

    def _do_restart_child(self, child_id: str) -> int:
        spec = self._core.prepare_restart(child_id)
        result = self._spawn_and_wait(spec)
        if isinstance(result, StartFailed):
            self._publish(ChildStartFailed(child=child_id, **_failure_fields(result)))
            raise result
        self._core.started(child_id, result.pid)
        self._publish(ChildStarted(child=child_id, pid=result.pid))
        return result.pid

    # ======================================================= plumbing

    def _call(self, fn: Callable[[], _T]) -> _T:
        if threading.get_ident() == self._loop_thread and not self._done.is_set():
            return fn()
        future: Future[_T] = Future()
        with self._commands_lock:
            if not self._accepting or not self._started.is_set():
                raise SupervisorStopped(
                    f"supervisor {self.name!r} is not running", details={"supervisor": self.name}
                )
            self._commands.append((fn, future))
        self._wake()
        return future.result()

    def _run_commands(self) -> None:
        while True:
            with self._commands_lock:
                if not self._commands:
                    return
                fn, future = self._commands.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:
                future.set_exception(exc)

    def _wake(self) -> None:
        # Under the lock so a late caller never writes to a closed (maybe reused) fd.
        with self._commands_lock:
            if self._wake_w < 0:
                return
            with contextlib.suppress(BlockingIOError):
                os.write(self._wake_w, b"\0")

    def _stop_wanted(self) -> bool:
        """For blocking waits: drain the wake-up pipe, say whether to give up.

        Draining loses nothing: queued commands stay in ``_commands`` and the
        loop runs them without needing the wake-up byte.
        """
        self._drain_wake()
        return self._stop_requested

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass

    def _install_signals(self) -> Callable[[], None] | None:
        if threading.current_thread() is not threading.main_thread():
            return None

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Only a flag: the wake-up fd below interrupts the loop's select.
            self._stop_requested = True

        previous = {sig: signal.signal(sig, on_signal) for sig in _STOP_SIGNALS}
        previous_fd = signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)

        def restore() -> None:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

        return restore

    def _close(self, code: int) -> None:
        with self._commands_lock:
            self._accepting = False
            pending = list(self._commands)
            self._commands.clear()
        for _, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(
                    SupervisorStopped(
                        f"supervisor {self.name!r} stopped", details={"supervisor": self.name}
                    )
                )
        # Reached with live children only if the loop itself failed: never leave
        # them behind, whatever happened.
        leftovers = list(self._procs.values())
        for proc in leftovers:
            self._forget(proc)
            proc.kill("supervisor_failed")
        for proc in leftovers:
            proc.wait(None)
            proc.close()
        self._selector.close()
        with self._commands_lock:
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._wake_r = self._wake_w = -1
        self._exit_code = code
        self._done.set()
        self._started.set()


def _failure_fields(err: StartFailed) -> dict[str, Any]:
    """The parts of a start failure that its event carries (see ``StartFailed``)."""
    return {k: err.details[k] for k in ("reason", "exit", "pid", "error") if k in err.details}


class _ServedSupervisor:
    """A supervisor and, when ``service`` names one, its dynamic API served as
    that actor (up before the supervisor reports ready): what a supervisor
    child runs, as a process (:func:`run_supervisor_process`) or hosted on a
    thread (a :class:`~llamad.supervisor.hosted.HostedBody`)."""

    def __init__(
        self, spec: Mapping[str, Any], service: str | None, beat: OwnBeat | None = None
    ) -> None:
        self._supervisor = Supervisor(SupervisorSpec.from_wire(spec), own_beat=beat)
        self._service = service

    @classmethod
    def hosted(cls, spec: ChildSpec, beat: PipeBeat) -> _ServedSupervisor:
        service = spec.start.kwargs.get("service")
        return cls(spec.start.kwargs["spec"], service if isinstance(service, str) else None, beat)

    def run(self, ready: Callable[[], None], *, install_signal_handlers: bool = False) -> int:
        stop_service: Callable[[], None] | None = None

        def on_ready() -> None:
            nonlocal stop_service
            if self._service is not None:
                # Imported here: only supervisors that serve pay for ZeroMQ.
                from llamad.supervisor.service import SupervisorService  # noqa: PLC0415

                served = SupervisorService(self._supervisor, self._service)
                served.start()
                stop_service = served.stop
            ready()

        try:
            return self._supervisor.run(
                install_signal_handlers=install_signal_handlers, on_ready=on_ready
            )
        finally:
            if stop_service is not None:
                stop_service()

    def request_stop(self) -> None:
        self._supervisor.request_stop()

    def request_kill(self) -> None:
        self._supervisor.request_kill()


# -- the entry points --------------------------------------------------------


@notifies_ready
def run_supervisor_process(spec: Mapping[str, Any], service: str | None = None) -> NoReturn:
    """Run the supervisor described by ``spec`` (its wire form) until it stops.

    With ``service``, its dynamic API is also served as actor ``service``
    (:mod:`llamad.supervisor.service`), up before the supervisor reports ready.
    Exits 0 after SIGTERM/SIGINT or auto_shutdown, non-zero after an
    escalation or a failed initial start (so the parent sees an abnormal exit).
    """
    configure_logs()
    served = _ServedSupervisor(spec, service)
    sys.exit(served.run(notify_ready, install_signal_handlers=True))


def run_root(
    spec: SupervisorSpec, *, log_level: str = "info", log_format: str = "console"
) -> NoReturn:
    """Run ``spec`` as this process's root supervisor (main thread) and exit with its code.

    Configures logging first (``LLAMAD_LOG_LEVEL`` / ``LLAMAD_LOG_FORMAT``
    override the arguments, as in every llamad process), so the root's own
    events follow the log format its children use. The code is non-zero after
    an escalation or a failed start, so a service manager (systemd
    ``Restart=on-failure``) can act on it.
    """
    configure_logs(log_level, log_format)
    sys.exit(Supervisor(spec).run(install_signal_handlers=True))
