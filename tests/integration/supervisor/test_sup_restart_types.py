"""permanent / transient / temporary with real exits: normal, shutdown (SIGTERM), abnormal."""

from __future__ import annotations

import os
import signal

import pytest
import structlog

from llamad.supervisor import ChildState, Supervisor, SupervisorSpec, SupFlags
from sup_helpers import EventLog, toy, wait_until

pytestmark = pytest.mark.timeout(90)


def state(sup: Supervisor, child_id: str) -> ChildState | None:
    for c in sup.which_children():
        if c.id == child_id:
            return c.state
    return None


def test_transient_child_exiting_normally_is_not_restarted(events: EventLog) -> None:
    spec = SupervisorSpec(
        "t", SupFlags(), (toy(events, "exiter", "t", 0, 0.2, restart="transient"),)
    )
    with structlog.testing.capture_logs() as logs, Supervisor(spec) as sup:
        wait_until(lambda: state(sup, "t") is ChildState.UNDEFINED, "t stopped")
        wait_until(lambda: any(e["event"] == "child.not_restarted" for e in logs), "decision")
        assert len(events.of("start", "t")) == 1
    exited = [e for e in logs if e["event"] == "child.exited"]
    assert exited[0]["reason"] == "normal" and exited[0]["exit"] == "exit 0"


def test_transient_child_exiting_abnormally_is_restarted(events: EventLog) -> None:
    spec = SupervisorSpec(
        "t",
        SupFlags(intensity=1, period=60),
        (toy(events, "exiter", "t", 3, 0.2, restart="transient"),),
    )
    sup = Supervisor(spec)
    sup.start()
    # exit 3 twice within the period: one restart, then escalation.
    assert sup.wait(60) == 3
    assert len(events.of("start", "t")) == 2


def test_external_sigterm_is_a_shutdown_exit_so_transient_is_not_restarted(
    events: EventLog,
) -> None:
    spec = SupervisorSpec("t", SupFlags(), (toy(events, "sleeper", "t", restart="transient"),))
    with Supervisor(spec) as sup:
        pid = sup.which_children()[0].pid
        os.kill(pid or 0, signal.SIGTERM)
        wait_until(lambda: state(sup, "t") is ChildState.UNDEFINED, "t stopped")
        assert len(events.of("start", "t")) == 1


def test_permanent_child_exiting_normally_is_restarted(events: EventLog) -> None:
    spec = SupervisorSpec(
        "p", SupFlags(intensity=1, period=60), (toy(events, "exiter", "p", 0, 0.2),)
    )
    sup = Supervisor(spec)
    sup.start()
    assert sup.wait(60) == 3  # restarted once, the second normal exit exceeds intensity 1
    assert len(events.of("start", "p")) == 2


def test_temporary_child_is_never_restarted(events: EventLog) -> None:
    spec = SupervisorSpec(
        "t",
        SupFlags(),
        (toy(events, "sleeper", "tmp", restart="temporary"), toy(events, "sleeper", "p")),
    )
    with Supervisor(spec) as sup:
        pid = sup.which_children()[0].pid
        os.kill(pid or 0, signal.SIGKILL)
        wait_until(lambda: [c.id for c in sup.which_children()] == ["p"], "tmp forgotten")
        assert len(events.of("start", "tmp")) == 1


@pytest.mark.parametrize("strategy", ["one_for_all", "rest_for_one"])
def test_temporary_sibling_is_not_restarted_when_a_sibling_failure_restarts_the_rest(
    events: EventLog, strategy: str
) -> None:
    children = (
        toy(events, "sleeper", "a"),
        toy(events, "sleeper", "tmp", restart="temporary"),
        toy(events, "sleeper", "c"),
    )
    spec = SupervisorSpec("t", SupFlags(strategy=strategy, intensity=3), children)
    with Supervisor(spec) as sup:
        before = {c.id: c.pid for c in sup.which_children()}
        os.kill(before["a"] or 0, signal.SIGKILL)
        wait_until(
            lambda: (
                [c.id for c in sup.which_children()] == ["a", "c"]
                and all(c.pid not in (None, before[c.id]) for c in sup.which_children())
            ),
            "a and c restarted without tmp",
        )
        assert len(events.of("term", "tmp")) == 1  # it was stopped...
        assert len(events.of("start", "tmp")) == 1  # ...and never started again
