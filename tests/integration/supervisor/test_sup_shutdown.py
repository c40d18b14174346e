"""Shutdown policies: brutal_kill, a timeout, infinity; and nested supervisors stopping."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog

from llamad.supervisor import (
    BRUTAL_KILL,
    INFINITY,
    ChildSpec,
    Supervisor,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)
from sup_helpers import EventLog, pid_alive, toy

pytestmark = pytest.mark.timeout(90)


def run_and_stop(events: EventLog, *children: ChildSpec) -> list[MutableMapping[str, Any]]:
    spec = SupervisorSpec("shut", SupFlags(), children)
    with structlog.testing.capture_logs() as logs:
        sup = Supervisor(spec)
        sup.start()
        assert sup.stop() == 0
    assert not any(pid_alive(e["pid"]) for e in events.of("start"))
    return logs


def test_brutal_kill_kills_without_sigterm(events: EventLog) -> None:
    logs = run_and_stop(events, toy(events, "sleeper", "w", shutdown=BRUTAL_KILL))
    assert events.of("term") == []
    stopped = next(e for e in logs if e["event"] == "child.stopped")
    assert stopped["exit"] == "signal SIGKILL"


def test_shutdown_timeout_kills_a_child_that_ignores_sigterm(events: EventLog) -> None:
    logs = run_and_stop(events, toy(events, "sleeper", "w", 0.0, True, shutdown=0.5))
    assert [e["event"] for e in events.of("term")] == ["term"]
    assert events.of("term_done") == []
    assert any(e["event"] == "child.shutdown_timeout" for e in logs)
    stopped = next(e for e in logs if e["event"] == "child.stopped")
    assert stopped["exit"] == "signal SIGKILL"


def test_shutdown_timeout_lets_a_prompt_child_finish(events: EventLog) -> None:
    logs = run_and_stop(events, toy(events, "sleeper", "w", 0.2, shutdown=20))
    assert len(events.of("term_done")) == 1
    assert not any(e["event"] == "child.shutdown_timeout" for e in logs)


def test_infinity_waits_for_a_slow_child_to_finish(events: EventLog) -> None:
    logs = run_and_stop(events, toy(events, "sleeper", "w", 1.5, shutdown=INFINITY))
    assert len(events.of("term_done")) == 1
    stopped = next(e for e in logs if e["event"] == "child.stopped")
    assert stopped["exit"] == "signal SIGTERM"


def test_nested_supervisor_stops_its_children_in_reverse_order_before_exiting(
    events: EventLog,
) -> None:
    inner = SupervisorSpec(
        "inner", SupFlags(), (toy(events, "sleeper", "x"), toy(events, "sleeper", "y"))
    )
    logs = run_and_stop(events, toy(events, "sleeper", "a"), supervisor_child(inner))
    assert events.sequence("term") == [("term", "y"), ("term", "x"), ("term", "a")]
    inner_stop = next(e for e in logs if e["event"] == "child.stopped" and e["child"] == "inner")
    assert inner_stop["exit"] == "exit 0"


def test_nested_supervisor_is_ready_only_after_its_children_started(events: EventLog) -> None:
    inner = SupervisorSpec("inner", SupFlags(), (toy(events, "slow_ready", "x", 0.5),))
    run_and_stop(events, supervisor_child(inner), toy(events, "sleeper", "after"))
    assert events.sequence("start") == [("start", "x"), ("start", "after")]
