"""SIGKILL a child under each strategy: exactly the expected children restart, in order."""

from __future__ import annotations

import os
import signal

import pytest

from llamad.supervisor import ChildState, Supervisor, SupervisorSpec, SupFlags
from sup_helpers import EventLog, toy, wait_until

pytestmark = pytest.mark.timeout(90)


def pids(sup: Supervisor) -> dict[str, int | None]:
    return {c.id: c.pid for c in sup.which_children()}


def restarted(sup: Supervisor, before: dict[str, int | None], ids: set[str]) -> bool:
    now = {c.id: c for c in sup.which_children()}
    return all(now[i].state is ChildState.RUNNING and now[i].pid != before[i] for i in ids)


def three(events: EventLog, strategy: str) -> SupervisorSpec:
    children = tuple(toy(events, "sleeper", n) for n in ("a", "b", "c"))
    return SupervisorSpec("strat", SupFlags(strategy=strategy, intensity=5), children)


def test_children_start_in_order_and_stop_in_reverse_order(events: EventLog) -> None:
    sup = Supervisor(three(events, "one_for_one"))
    sup.start()
    assert events.sequence("start") == [("start", "a"), ("start", "b"), ("start", "c")]
    assert sup.stop() == 0
    assert events.sequence("term") == [("term", "c"), ("term", "b"), ("term", "a")]


def test_one_for_one_restarts_only_the_killed_child(events: EventLog) -> None:
    with Supervisor(three(events, "one_for_one")) as sup:
        before = pids(sup)
        os.kill(before["b"] or 0, signal.SIGKILL)
        wait_until(lambda: restarted(sup, before, {"b"}), "b restarted")
        after = pids(sup)
        assert after["a"] == before["a"] and after["c"] == before["c"]
        assert events.of("term") == []
        assert [e["pid"] for e in events.of("start", "b")] == [before["b"], after["b"]]


def test_one_for_all_restarts_every_child_in_order(events: EventLog) -> None:
    with Supervisor(three(events, "one_for_all")) as sup:
        before = pids(sup)
        os.kill(before["b"] or 0, signal.SIGKILL)
        wait_until(lambda: restarted(sup, before, {"a", "b", "c"}), "all restarted")
        seq = events.sequence("start", "term")
        assert seq[3:] == [
            ("term", "c"),
            ("term", "a"),
            ("start", "a"),
            ("start", "b"),
            ("start", "c"),
        ]


def test_rest_for_one_restarts_the_killed_child_and_those_after_it(events: EventLog) -> None:
    with Supervisor(three(events, "rest_for_one")) as sup:
        before = pids(sup)
        os.kill(before["b"] or 0, signal.SIGKILL)
        wait_until(lambda: restarted(sup, before, {"b", "c"}), "b and c restarted")
        assert pids(sup)["a"] == before["a"]
        assert events.sequence("start", "term")[3:] == [
            ("term", "c"),
            ("start", "b"),
            ("start", "c"),
        ]


def test_simple_one_for_one_restarts_only_the_killed_dynamic_child(events: EventLog) -> None:
    template = toy(events, "sleeper", "model")
    spec = SupervisorSpec(
        "models", SupFlags(strategy="simple_one_for_one", intensity=5), (template,)
    )
    with Supervisor(spec) as sup:
        for name in ("m1", "m2", "m3"):
            sup.start_child([], child_id=name)
        before = pids(sup)
        os.kill(before["m2"] or 0, signal.SIGKILL)
        wait_until(lambda: restarted(sup, before, {"m2"}), "m2 restarted")
        after = pids(sup)
        assert after["m1"] == before["m1"] and after["m3"] == before["m3"]
        assert list(after) == ["m1", "m2", "m3"]


def test_simple_one_for_one_stops_children_in_parallel(events: EventLog) -> None:
    template = toy(events, "sleeper", "slow", 2.0, shutdown=10)
    spec = SupervisorSpec("par", SupFlags(strategy="simple_one_for_one"), (template,))
    sup = Supervisor(spec)
    sup.start()
    for _ in range(3):
        sup.start_child([])
    assert sup.stop() == 0
    # Each child takes 2 s to stop after SIGTERM: all three were told before any finished.
    kinds = [kind for kind, _ in events.sequence("term", "term_done")]
    assert kinds == ["term"] * 3 + ["term_done"] * 3
