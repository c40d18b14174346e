"""auto_shutdown with significant children, on real processes."""

from __future__ import annotations

import pytest

from llamad.supervisor import Supervisor, SupervisorSpec, SupFlags
from sup_helpers import EventLog, pid_alive, toy, wait_until

pytestmark = pytest.mark.timeout(90)


def test_any_significant_child_exit_shuts_the_supervisor_down(events: EventLog) -> None:
    children = (
        toy(events, "sleeper", "bystander"),
        toy(events, "exiter", "job", 0, 0.3, restart="transient", significant=True),
    )
    sup = Supervisor(SupervisorSpec("auto", SupFlags(auto_shutdown="any_significant"), children))
    sup.start()
    assert sup.wait(60) == 0
    assert [e["name"] for e in events.of("term")] == ["bystander"]
    assert not any(pid_alive(e["pid"]) for e in events.of("start"))


def test_all_significant_keeps_running_while_a_significant_child_lives(
    events: EventLog,
) -> None:
    children = (
        toy(events, "sleeper", "bystander"),
        toy(events, "exiter", "early", 0, 0.1, restart="temporary", significant=True),
        toy(events, "sleeper", "late", restart="temporary", significant=True),
    )
    sup = Supervisor(SupervisorSpec("auto", SupFlags(auto_shutdown="all_significant"), children))
    sup.start()
    wait_until(lambda: [c.id for c in sup.which_children()] == ["bystander", "late"], "early gone")
    assert sup.running
    sup.terminate_child("late")  # a terminate_child is not an automatic exit: still running
    assert sup.running
    assert [c.id for c in sup.which_children()] == ["bystander"]
    assert sup.stop() == 0


def test_all_significant_exit_of_last_one_ends_the_supervisor(events: EventLog) -> None:
    children = (
        toy(events, "sleeper", "bystander"),
        toy(events, "exiter", "one", 0, 0.1, restart="temporary", significant=True),
        toy(events, "exiter", "two", 1, 0.8, restart="temporary", significant=True),
    )
    sup = Supervisor(SupervisorSpec("auto", SupFlags(auto_shutdown="all_significant"), children))
    sup.start()
    assert sup.wait(60) == 0
    assert [e["name"] for e in events.of("exit")] == ["one", "two"]
    assert [e["name"] for e in events.of("term")] == ["bystander"]
