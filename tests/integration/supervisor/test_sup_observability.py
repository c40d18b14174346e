"""What a supervisor shows about its children, and how other processes read its decisions."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llamad.supervisor import (
    ChildSpec,
    ExitReason,
    Start,
    StartedChild,
    StartFailed,
    Supervisor,
    SupervisorEvent,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)
from llamad.supervisor.events import (
    ChildExited,
    ChildRestarted,
    ChildStarted,
    ChildStartFailed,
    SupStopped,
    event_kind,
)
from llamad.supervisor.exits import EXIT_ESCALATED
from llamad.supervisor.service import EventSubscription, SupervisorClient, SupervisorService
from sup_helpers import EventLog, pid_alive, toy, wait_until

pytestmark = pytest.mark.timeout(120)

VARS = ["LLAMAD_T_INHERITED", "LLAMAD_T_OVERRIDDEN", "LLAMAD_T_NEW"]


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private registry; short, because ipc socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="llobs"))
    monkeypatch.setenv("LLAMAD_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def read_until(
    sub: EventSubscription, last: Callable[[SupervisorEvent], bool]
) -> list[SupervisorEvent]:
    """Events from ``sub`` up to and including the first for which ``last`` is true."""
    got = []
    for event in sub:
        got.append(event)
        if last(event):
            return got
    raise AssertionError(f"the stream ended after {[event_kind(e) for e in got]}")


def kinds(events: list[SupervisorEvent]) -> list[str]:
    return [event_kind(e) for e in events]


def reporter(events: EventLog, name: str, **spec: object) -> ChildSpec:
    return ChildSpec(name, Start("sup_toys:reporter", (events.path, name, VARS)), **spec)  # type: ignore[arg-type]


def test_subscriber_in_another_process_reads_every_decision_up_to_escalation(
    events: EventLog, runtime: Path
) -> None:
    inner = SupervisorSpec(
        "obs_sup", SupFlags(intensity=1, period=3600), (toy(events, "sleeper", "w"),)
    )
    root = SupervisorSpec(
        "root", SupFlags(intensity=5, period=3600), (supervisor_child(inner, service="obs_sup"),)
    )
    with Supervisor(root), SupervisorClient("obs_sup") as client:
        with client.subscribe(since=0, timeout=60) as sub:
            # since=0 replays what happened before we subscribed.
            start = read_until(sub, lambda e: event_kind(e) == "sup.started")
            assert kinds(start) == ["child.started", "sup.started"]
            assert isinstance(start[0], ChildStarted)
            first = start[0].pid
            assert first == events.of("start", "w")[0]["pid"]

            os.kill(first, signal.SIGKILL)
            restart = read_until(sub, lambda e: isinstance(e, ChildRestarted))
            assert kinds(restart) == ["child.exited", "sup.restarting", "child.restarted"]
            exited, _, restarted = restart
            assert isinstance(exited, ChildExited) and isinstance(restarted, ChildRestarted)
            assert (exited.child, exited.pid, exited.reason, exited.exit) == (
                "w",
                first,
                ExitReason.ABNORMAL,
                "signal SIGKILL",
            )
            assert (restarted.child, restarted.restarts, restarted.restarts_in_window) == (
                "w",
                1,
                1,
            )
            # which_children agrees with the events (same client, stream still open).
            info = client.which_children()[0]
            assert (info.pid, info.restarts) == (restarted.pid, 1)
            assert info.last_exit is not None
            assert (info.last_exit.reason, info.last_exit.exit, info.last_exit.at) == (
                ExitReason.ABNORMAL,
                "signal SIGKILL",
                exited.at,
            )

            os.kill(restarted.pid, signal.SIGKILL)
            rest = list(sub)  # the service ends the stream after the final event
            assert kinds(rest) == [
                "child.exited",
                "sup.escalated",
                "sup.shutting_down",
                "sup.stopped",
            ]
            stopped = rest[-1]
            assert isinstance(stopped, SupStopped)
            assert (stopped.reason, stopped.exit_code) == ("escalated", EXIT_ESCALATED)
        every = start + restart + rest
        assert [e.seq for e in every] == list(range(1, len(every) + 1))
        assert {e.sup for e in every} == {"obs_sup"}


def test_which_children_and_the_in_process_feed_show_restarts_and_exits(
    events: EventLog,
) -> None:
    spec = SupervisorSpec(
        "hist", SupFlags(intensity=5, period=3600), (toy(events, "sleeper", "a"),)
    )
    with Supervisor(spec) as sup:
        first = sup.which_children()[0].pid or 0
        os.kill(first, signal.SIGKILL)
        info = wait_until(
            lambda: (c := sup.which_children()[0]).restarts == 1 and c.pid and c,
            "a restarted once",
        )
        assert info.last_exit is not None
        assert (info.last_exit.reason, info.last_exit.exit) == (
            ExitReason.ABNORMAL,
            "signal SIGKILL",
        )
        sup.terminate_child("a")
        stopped = sup.which_children()[0]
        assert stopped.last_exit is not None
        assert (stopped.restarts, stopped.last_exit.reason, stopped.last_exit.exit) == (
            1,
            ExitReason.SHUTDOWN,
            "signal SIGTERM",
        )
        assert stopped.last_exit.at >= info.last_exit.at
    assert kinds(sup.events.since(0)) == [
        "child.started",
        "sup.started",
        "child.exited",
        "sup.restarting",
        "child.restarted",
        "child.stopped",
        "sup.shutting_down",
        "sup.stopped",
    ]


def test_child_env_and_cwd_reach_the_process(
    events: EventLog, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMAD_T_INHERITED", "from-supervisor")
    monkeypatch.setenv("LLAMAD_T_OVERRIDDEN", "supervisor")
    child = reporter(
        events,
        "r",
        env={"LLAMAD_T_OVERRIDDEN": "child", "LLAMAD_T_NEW": "new"},
        cwd=str(tmp_path),
    )
    with Supervisor(SupervisorSpec("envs", SupFlags(), (child,))):
        seen = events.wait_for("start", "r")[0]
    assert seen["cwd"] == str(tmp_path)
    assert seen["env"] == {
        "LLAMAD_T_INHERITED": "from-supervisor",
        "LLAMAD_T_OVERRIDDEN": "child",
        "LLAMAD_T_NEW": "new",
    }


def test_a_missing_cwd_is_a_failed_start_with_its_event(events: EventLog, tmp_path: Path) -> None:
    with Supervisor(SupervisorSpec("cwd", SupFlags(), ())) as sup:
        with pytest.raises(StartFailed) as e:
            sup.start_child(reporter(events, "r", cwd=str(tmp_path / "missing")))
        assert e.value.details["reason"] == "spawn"
        failed = [x for x in sup.events.since(0) if isinstance(x, ChildStartFailed)]
        assert [(x.child, x.reason) for x in failed] == [("r", "spawn")]
        assert sup.which_children() == []


def test_start_child_returns_a_started_child_in_process_and_remotely(
    events: EventLog, tmp_path: Path, runtime: Path
) -> None:
    with Supervisor(SupervisorSpec("static", SupFlags(), ())) as sup:
        service = SupervisorService(sup, "static_sup")
        service.start()
        try:
            local = sup.start_child(toy(events, "sleeper", "here"))
            with SupervisorClient("static_sup") as client:
                remote = client.start_child(reporter(events, "there", cwd=str(tmp_path)))
            assert type(local) is type(remote) is StartedChild
            assert (local.id, remote.id) == ("here", "there")
            assert [c.pid for c in sup.which_children()] == [local.pid, remote.pid]
            assert pid_alive(remote.pid)
            # The spec's cwd travelled over the wire with it.
            assert events.wait_for("start", "there")[0]["cwd"] == str(tmp_path)
        finally:
            service.stop()
