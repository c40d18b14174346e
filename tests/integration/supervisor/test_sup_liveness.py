"""Liveness beyond OTP: a child alive but silent past its timeout is killed and restarted."""

from __future__ import annotations

import pytest
import structlog
from sup_helpers import EventLog, pid_alive, toy, wait_until

from llamad.supervisor import ChildState, Supervisor, SupervisorSpec, SupFlags

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
