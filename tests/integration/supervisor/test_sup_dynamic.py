"""Dynamic children and start failures: start/terminate/restart/delete/which/count."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import structlog

from llamad.supervisor import (
    ChildAlreadyPresent,
    ChildAlreadyStarted,
    ChildNotFound,
    ChildRunning,
    ChildSpec,
    ChildState,
    SimpleOneForOne,
    Start,
    StartFailed,
    Supervisor,
    SupervisorSpec,
    SupervisorStopped,
    SupFlags,
)
from llamad.supervisor.exits import EXIT_CHILD_BOOT_FAILED, EXIT_ESCALATED, EXIT_START_FAILED
from sup_helpers import EventLog, pid_alive, toy, wait_until

pytestmark = pytest.mark.timeout(90)


def test_static_supervisor_child_lifecycle(events: EventLog) -> None:
    with Supervisor(SupervisorSpec("dyn", SupFlags(), (toy(events, "sleeper", "a"),))) as sup:
        _, pid = sup.start_child(toy(events, "sleeper", "b"))
        assert [(c.id, c.pid) for c in sup.which_children()][1] == ("b", pid)
        with pytest.raises(ChildAlreadyStarted):
            sup.start_child(toy(events, "sleeper", "b"))
        with pytest.raises(ChildRunning):
            sup.delete_child("b")
        sup.terminate_child("b")
        assert not pid_alive(pid)
        assert sup.which_children()[1].state is ChildState.UNDEFINED
        with pytest.raises(ChildAlreadyPresent):
            sup.start_child(toy(events, "sleeper", "b"))
        new_pid = sup.restart_child("b")
        assert new_pid != pid and pid_alive(new_pid)
        sup.terminate_child(new_pid)  # a pid works too
        sup.delete_child("b")
        assert [c.id for c in sup.which_children()] == ["a"]
        with pytest.raises(ChildNotFound):
            sup.terminate_child("b")
        counts = sup.count_children()
        assert (counts.specs, counts.active, counts.workers) == (1, 1, 1)


def test_simple_one_for_one_starts_children_with_per_child_args(events: EventLog) -> None:
    template = ChildSpec("model", Start("sup_toys:sleeper", (events.path,)), restart="transient")
    spec = SupervisorSpec("model_sup", SupFlags(strategy="simple_one_for_one"), (template,))
    with Supervisor(spec) as sup:
        id1, p1 = sup.start_child(["smollm2"], child_id="smollm2")
        id2, p2 = sup.start_child(["llama-8b"])
        assert (id1, id2) == ("smollm2", "model-1")
        assert {e["name"]: e["pid"] for e in events.of("start")} == {
            "smollm2": p1,
            "llama-8b": p2,
        }
        assert [c.id for c in sup.which_children()] == ["smollm2", "model-1"]
        with pytest.raises(SimpleOneForOne):
            sup.restart_child("smollm2")
        sup.terminate_child(p1)
        assert [c.id for c in sup.which_children()] == ["model-1"]
        assert sup.count_children().active == 1


def test_start_child_that_dies_before_ready_raises_and_is_not_kept(events: EventLog) -> None:
    with Supervisor(SupervisorSpec("dyn", SupFlags(), ())) as sup:
        bad = ChildSpec("bad", Start("sup_toys:no_such_function"))
        with pytest.raises(StartFailed) as e:
            sup.start_child(bad)
        assert e.value.details["exit"] == f"exit {EXIT_CHILD_BOOT_FAILED}"
        assert sup.which_children() == []


def test_start_timeout_kills_a_child_that_never_reports_ready(events: EventLog) -> None:
    with Supervisor(SupervisorSpec("dyn", SupFlags(), ())) as sup:
        slow = toy(events, "slow_ready", "slow", 60.0, start_timeout=0.5)
        with pytest.raises(StartFailed) as e:
            sup.start_child(slow)
        assert e.value.details["reason"] == "start_timeout"
        assert not pid_alive(e.value.details["pid"])
        assert sup.which_children() == []


def test_initial_child_failing_to_start_stops_started_siblings(events: EventLog) -> None:
    spec = SupervisorSpec(
        "init",
        SupFlags(),
        (toy(events, "sleeper", "a"), ChildSpec("bad", Start("no_such_module:fn"))),
    )
    sup = Supervisor(spec)
    with pytest.raises(StartFailed):
        sup.start()
    assert sup.exit_code == EXIT_START_FAILED
    assert events.sequence("term") == [("term", "a")]
    with pytest.raises(SupervisorStopped):
        sup.which_children()


def test_failed_restarts_are_retried_and_count_toward_intensity(
    events: EventLog, tmp_path: Path
) -> None:
    marker = tmp_path / "fail"
    spec = SupervisorSpec(
        "retry", SupFlags(intensity=3, period=60), (toy(events, "gated", "g", str(marker)),)
    )
    with structlog.testing.capture_logs() as logs:
        sup = Supervisor(spec)
        sup.start()
        pid = sup.which_children()[0].pid
        marker.touch()
        os.kill(pid or 0, signal.SIGKILL)
        assert sup.wait(60) == EXIT_ESCALATED
    # restart 1 fails, retries 2 and 3 fail, retry 4 exceeds intensity 3.
    assert len(events.of("start_fail")) == 3
    assert sum(e["event"] == "child.restart_failed" for e in logs) == 3


def test_calls_after_stop_raise_supervisor_stopped(events: EventLog) -> None:
    sup = Supervisor(SupervisorSpec("gone", SupFlags(), (toy(events, "sleeper", "a"),)))
    sup.start()
    sup.stop()
    with pytest.raises(SupervisorStopped):
        sup.start_child(toy(events, "sleeper", "b"))
    wait_until(lambda: not sup.running, "stopped")
