"""Liveness beyond OTP: a child alive but silent past its timeout is killed and restarted."""

from __future__ import annotations

import os
import signal

import pytest
import structlog

from llamad.supervisor import ChildState, Supervisor, SupervisorSpec, SupFlags
from sup_helpers import EventLog, pid_alive, toy, wait_until

pytestmark = pytest.mark.timeout(90)


@pytest.mark.slow
def test_hung_child_is_killed_and_restarted(events: EventLog) -> None:
    beater = toy(events, "beater", "w", 3.0, liveness_timeout=1.0)
    spec = SupervisorSpec("live", SupFlags(intensity=5, period=60), (beater,))
    with structlog.testing.capture_logs() as logs, Supervisor(spec) as sup:
        first = sup.which_children()[0].pid
        wait_until(
            lambda: (c := sup.which_children()[0]).state is ChildState.RUNNING and c.pid != first,
            "w restarted",
        )
        assert not pid_alive(first or 0)
    # It heartbeat for 3 s (3x its timeout) unharmed, then hung and was killed.
    assert events.of("hang")[0]["pid"] == first
    hung = [e for e in logs if e["event"] == "child.hung"]
    assert hung[0]["pid"] == first
    exited = next(e for e in logs if e["event"] == "child.exited" and e["pid"] == first)
    assert exited["reason"] == "abnormal"
    assert exited["exit"] == "signal SIGKILL"
    assert exited["cause"] == "hung"


@pytest.mark.slow
@pytest.mark.parametrize("how", ["restart", "start_child"])
def test_a_beating_child_is_not_hung_by_a_sibling_start_longer_than_its_timeout(
    events: EventLog, how: str
) -> None:
    # The supervisor waits for a starting child's ready report without reading
    # the other children's status pipes; their beats pile up unread meanwhile.
    # Judged on the last beat it *read*, a healthy child looked silent for the
    # whole start and was SIGKILLed as hung (the soak saw a worker killed each
    # time the other model's worker took over 5 s to restart).
    beater = toy(events, "beater", "w", 60.0, liveness_timeout=1.0)
    slow = toy(events, "slow_ready", "s", 2.5)
    spec = SupervisorSpec("live", SupFlags(intensity=5, period=60), (beater, slow))
    with structlog.testing.capture_logs() as logs, Supervisor(spec) as sup:
        w_pid, s_pid = (c.pid for c in sup.which_children())
        if how == "restart":
            os.kill(s_pid or 0, signal.SIGKILL)
            wait_until(
                lambda: (
                    (c := sup.which_children()[1]).state is ChildState.RUNNING and c.pid != s_pid
                ),
                "s restarted",
            )
        else:
            sup.start_child(toy(events, "slow_ready", "s2", 2.5))
        # which_children is answered on a later turn of the loop than the one
        # that ended the start, whose liveness check has run by then.
        assert sup.which_children()[0].pid == w_pid
        assert pid_alive(w_pid or 0)
    assert [e for e in logs if e["event"] == "child.hung"] == []
