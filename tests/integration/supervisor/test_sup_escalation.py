"""Restart intensity exceeded: children stop in reverse order, the supervisor escalates."""

from __future__ import annotations

import os
import signal

import pytest
import structlog

from llamad.supervisor import (
    ChildState,
    Supervisor,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)
from llamad.supervisor.exits import EXIT_ESCALATED
from sup_helpers import EventLog, pid_alive, toy, wait_until

pytestmark = pytest.mark.timeout(120)


def test_intensity_exceeded_stops_children_in_reverse_order_and_exits_non_zero(
    events: EventLog,
) -> None:
    children = tuple(toy(events, "sleeper", n) for n in ("a", "b", "c", "d"))
    sup = Supervisor(SupervisorSpec("esc", SupFlags(intensity=1, period=60), children))
    sup.start()
    first = sup.which_children()[1].pid
    os.kill(first or 0, signal.SIGKILL)
    second = wait_until(
        lambda: (pid := sup.which_children()[1].pid) not in (None, first) and pid,
        "b restarted once",
    )
    os.kill(second, signal.SIGKILL)
    assert sup.wait(60) == EXIT_ESCALATED
    assert events.sequence("term") == [("term", "d"), ("term", "c"), ("term", "a")]
    assert not any(pid_alive(e["pid"]) for e in events.of("start"))


def test_nested_supervisor_escalates_and_its_parent_sees_an_abnormal_exit(
    events: EventLog,
) -> None:
    inner = SupervisorSpec(
        "inner", SupFlags(intensity=0), (toy(events, "sleeper", "x"), toy(events, "sleeper", "y"))
    )
    root = SupervisorSpec("root", SupFlags(intensity=3, period=60), (supervisor_child(inner),))
    with structlog.testing.capture_logs() as logs, Supervisor(root) as sup:
        inner_pid = sup.which_children()[0].pid
        x = events.wait_for("start", "x")[0]["pid"]
        os.kill(x, signal.SIGKILL)
        # intensity 0: inner gives up at once, stopping y; root restarts inner.
        wait_until(
            lambda: (
                (c := sup.which_children()[0]).state is ChildState.RUNNING and c.pid != inner_pid
            ),
            "inner restarted by root",
        )
        events.wait_for("start", "x", count=2)
        events.wait_for("start", "y", count=2)
        assert events.sequence("term") == [("term", "y")]
    inner_exit = next(e for e in logs if e["event"] == "child.exited" and e["child"] == "inner")
    assert inner_exit["reason"] == "abnormal"
    assert inner_exit["exit"] == f"exit {EXIT_ESCALATED}"
    assert inner_exit["pid"] == inner_pid
