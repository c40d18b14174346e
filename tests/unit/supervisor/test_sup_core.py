"""The restart logic stepped by hand: exit events and a clock in, decisions out."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llamad.supervisor.core import (
    AutoShutdownPlan,
    ChildState,
    Escalation,
    NotRestarted,
    RestartPlan,
    Stale,
    Stop,
    SupervisorCore,
)
from llamad.supervisor.errors import (
    ChildAlreadyPresent,
    ChildAlreadyStarted,
    ChildNotFound,
    ChildRestarting,
    ChildRunning,
    InvalidSpec,
    SimpleOneForOne,
)
from llamad.supervisor.exits import ExitReason
from llamad.supervisor.spec import ChildSpec, Restart, Start, SupervisorSpec, SupFlags

pytestmark = pytest.mark.timeout(120)

NORMAL, SHUTDOWN, ABNORMAL = ExitReason.NORMAL, ExitReason.SHUTDOWN, ExitReason.ABNORMAL


def child(cid: str, restart: str = "permanent", **kw: Any) -> ChildSpec:
    return ChildSpec(cid, Start("toys:worker", (cid,)), restart=Restart(restart), **kw)


class Harness:
    """A core plus fake pids: executes plans the way the process layer does."""

    def __init__(self, flags: SupFlags, *children: ChildSpec) -> None:
        self.core = SupervisorCore(SupervisorSpec("test", flags, children))
        self.pids: Iterator[int] = itertools.count(1000)
        for cid in self.core.initial_starts():
            self.core.started(cid, next(self.pids))

    def pid(self, cid: str) -> int:
        pid = self.core.pid_of(cid)
        assert pid is not None
        return pid

    def exit(self, cid: str, reason: ExitReason, now: float = 0.0) -> Any:
        return self.core.exited(self.pid(cid), reason, now)

    def execute(self, plan: RestartPlan) -> None:
        for cid in plan.start:
            self.core.started(cid, next(self.pids))

    def states(self) -> dict[str, ChildState]:
        return {c.id: c.state for c in self.core.which_children()}


def h(strategy: str, *children: ChildSpec, **flags: Any) -> Harness:
    return Harness(SupFlags(strategy=strategy, **flags), *children)


ABC = (child("a"), child("b"), child("c"))


# ------------------------------------------------------------ strategies


def test_one_for_one_restarts_only_the_failed_child() -> None:
    t = h("one_for_one", *ABC)
    plan = t.exit("b", ABNORMAL)
    assert plan == RestartPlan("b", (), ("b",), 1)


def test_one_for_all_stops_the_others_in_reverse_order_and_starts_all_in_order() -> None:
    t = h("one_for_all", *ABC)
    a, c = t.pid("a"), t.pid("c")
    plan = t.exit("b", ABNORMAL)
    assert plan == RestartPlan("b", (Stop("c", c), Stop("a", a)), ("a", "b", "c"), 1)


def test_rest_for_one_restarts_the_failed_child_and_those_after_it() -> None:
    t = h("rest_for_one", *ABC, child("d"))
    c, d = t.pid("c"), t.pid("d")
    plan = t.exit("b", ABNORMAL)
    assert plan == RestartPlan("b", (Stop("d", d), Stop("c", c)), ("b", "c", "d"), 1)
    assert t.states()["a"] is ChildState.RUNNING


def test_rest_for_one_failure_of_last_child_touches_nobody_else() -> None:
    t = h("rest_for_one", *ABC)
    assert t.exit("c", ABNORMAL) == RestartPlan("c", (), ("c",), 1)


def test_stale_exit_is_ignored() -> None:
    t = h("one_for_one", *ABC)
    old = t.pid("b")
    t.execute(t.exit("b", ABNORMAL))
    assert t.core.exited(old, ABNORMAL, 1.0) == Stale(old)


# ---------------------------------------------------------- restart types


def test_permanent_child_is_restarted_even_after_normal_exit() -> None:
    t = h("one_for_one", *ABC)
    assert isinstance(t.exit("a", NORMAL), RestartPlan)


@pytest.mark.parametrize("reason", [NORMAL, SHUTDOWN])
def test_transient_child_exiting_normally_is_not_restarted_but_kept(reason: ExitReason) -> None:
    t = h("one_for_one", child("a", "transient"))
    assert t.exit("a", reason) == NotRestarted("a", removed=False)
    assert t.states() == {"a": ChildState.UNDEFINED}


def test_transient_child_exiting_abnormally_is_restarted() -> None:
    t = h("one_for_one", child("a", "transient"))
    assert isinstance(t.exit("a", ABNORMAL), RestartPlan)


@pytest.mark.parametrize("reason", list(ExitReason))
def test_temporary_child_is_never_restarted_and_forgotten(reason: ExitReason) -> None:
    t = h("one_for_one", child("a", "temporary"), child("b"))
    assert t.exit("a", reason) == NotRestarted("a", removed=True)
    assert list(t.states()) == ["b"]


@pytest.mark.parametrize("strategy", ["one_for_all", "rest_for_one"])
def test_temporary_sibling_is_stopped_not_restarted(strategy: str) -> None:
    t = h(strategy, child("a"), child("b", "temporary"), child("c"))
    b = t.pid("b")
    plan = t.exit("a", ABNORMAL)
    assert isinstance(plan, RestartPlan)
    assert Stop("b", b) in plan.stop
    assert plan.start == ("a", "c")
    t.execute(plan)
    assert list(t.states()) == ["a", "c"]


def test_one_for_all_also_restarts_children_stopped_by_terminate_child() -> None:
    # OTP's restart starts every kept spec of the group, running or not.
    t = h("one_for_all", *ABC)
    t.core.terminated("c")
    plan = t.exit("a", ABNORMAL)
    assert isinstance(plan, RestartPlan)
    assert plan.start == ("a", "b", "c")


# -------------------------------------------------------------- intensity


def test_exceeding_intensity_escalates_and_stops_the_rest_in_reverse_order() -> None:
    t = h("one_for_one", *ABC, intensity=1, period=5)
    t.execute(t.exit("b", ABNORMAL, now=10.0))
    a, b, c = t.pid("a"), t.pid("b"), t.pid("c")
    decision = t.core.exited(b, ABNORMAL, 12.0)
    assert decision == Escalation("b", (Stop("c", c), Stop("a", a)), 2)


def test_restarts_outside_the_period_do_not_escalate() -> None:
    t = h("one_for_one", *ABC, intensity=1, period=5)
    t.execute(t.exit("b", ABNORMAL, now=10.0))
    assert isinstance(t.exit("b", ABNORMAL, now=15.5), RestartPlan)


def test_not_restarting_does_not_count_against_intensity() -> None:
    t = h("one_for_one", child("a", "temporary"), child("b", "transient"), intensity=0)
    assert isinstance(t.exit("a", ABNORMAL), NotRestarted)
    assert isinstance(t.exit("b", NORMAL), NotRestarted)


# ------------------------------------------------------ failed restarts


def test_failed_restart_waits_as_restarting_and_try_again_counts_a_restart() -> None:
    t = h("one_for_one", *ABC, intensity=2, period=10)
    t.exit("b", ABNORMAL, now=1.0)
    t.core.start_failed("b")
    assert t.states()["b"] is ChildState.RESTARTING
    assert t.core.try_again("b", 2.0) == RestartPlan("b", (), ("b",), 2)
    t.core.start_failed("b")
    assert isinstance(t.core.try_again("b", 3.0), Escalation)


def test_one_for_all_retry_restarts_the_whole_group_again() -> None:
    t = h("one_for_all", *ABC, intensity=5)
    t.exit("b", ABNORMAL)
    t.core.started("a", 50)
    t.core.start_failed("b")  # "c" is left without a process
    assert t.states() == {
        "a": ChildState.RUNNING,
        "b": ChildState.RESTARTING,
        "c": ChildState.UNDEFINED,
    }
    plan = t.core.try_again("b", 1.0)
    assert plan == RestartPlan("b", (Stop("a", 50),), ("a", "b", "c"), 2)


def test_try_again_after_terminate_child_does_nothing() -> None:
    t = h("one_for_one", *ABC, intensity=5)
    t.exit("b", ABNORMAL)
    t.core.start_failed("b")
    t.core.terminated("b")
    assert t.core.try_again("b", 1.0) is None


# ------------------------------------------------------------ auto_shutdown


def test_any_significant_exit_shuts_the_supervisor_down() -> None:
    t = h(
        "one_for_one",
        child("a"),
        child("s", "transient", significant=True),
        auto_shutdown="any_significant",
    )
    a = t.pid("a")
    assert t.exit("s", NORMAL) == AutoShutdownPlan("s", (Stop("a", a),))


def test_significant_transient_crash_is_restarted_not_shut_down() -> None:
    t = h("one_for_one", child("s", "transient", significant=True), auto_shutdown="any_significant")
    assert isinstance(t.exit("s", ABNORMAL), RestartPlan)


def test_all_significant_waits_for_the_last_significant_child() -> None:
    t = h(
        "one_for_one",
        child("x", "temporary", significant=True),
        child("y", "temporary", significant=True),
        child("z"),
        auto_shutdown="all_significant",
    )
    assert isinstance(t.exit("x", ABNORMAL), NotRestarted)
    z = t.pid("z")
    assert t.exit("y", NORMAL) == AutoShutdownPlan("y", (Stop("z", z),))


def test_terminate_child_never_triggers_auto_shutdown() -> None:
    t = h("one_for_one", child("s", "transient", significant=True), auto_shutdown="any_significant")
    t.core.terminated("s")
    assert t.states() == {"s": ChildState.UNDEFINED}


def test_non_significant_exit_does_not_shut_down() -> None:
    t = h(
        "one_for_one",
        child("s", "transient", significant=True),
        child("n", "transient"),
        auto_shutdown="any_significant",
    )
    assert t.exit("n", NORMAL) == NotRestarted("n", removed=False)


# ---------------------------------------------------------- dynamic API


def test_start_child_on_static_supervisor_appends_to_start_order() -> None:
    t = h("one_for_one", child("a"))
    spec = t.core.prepare_start(child("b"), None)
    t.core.add_started(spec, 77)
    assert [c.id for c in t.core.which_children()] == ["a", "b"]
    assert t.core.shutdown_order() == (Stop("b", 77), Stop("a", t.pid("a")))


def test_start_child_with_running_id_is_already_started() -> None:
    t = h("one_for_one", child("a"))
    with pytest.raises(ChildAlreadyStarted) as e:
        t.core.prepare_start(child("a"), None)
    assert e.value.details["pid"] == t.pid("a")


def test_start_child_with_kept_stopped_id_is_already_present() -> None:
    t = h("one_for_one", child("a"))
    t.core.terminated("a")
    with pytest.raises(ChildAlreadyPresent):
        t.core.prepare_start(child("a"), None)


def test_start_child_rejects_significant_child_under_never() -> None:
    t = h("one_for_one", child("a"))
    with pytest.raises(InvalidSpec) as e:
        t.core.prepare_start(child("s", "transient", significant=True), None)
    assert e.value.field == "child.significant"


def test_restart_and_delete_need_a_stopped_child() -> None:
    t = h("one_for_one", child("a"), child("b"))
    with pytest.raises(ChildRunning):
        t.core.prepare_restart("a")
    with pytest.raises(ChildRunning):
        t.core.delete("a")
    with pytest.raises(ChildNotFound):
        t.core.delete("nope")
    t.core.terminated("a")
    assert t.core.prepare_restart("a").id == "a"
    t.core.delete("a")
    assert list(t.states()) == ["b"]


def test_restart_child_while_restarting_is_refused() -> None:
    t = h("one_for_one", child("a"), intensity=3)
    t.exit("a", ABNORMAL)
    t.core.start_failed("a")
    with pytest.raises(ChildRestarting):
        t.core.prepare_restart("a")


def test_terminate_child_forgets_temporary_and_keeps_others() -> None:
    t = h("one_for_one", child("a", "temporary"), child("b", "transient"))
    t.core.terminated("a")
    t.core.terminated("b")
    assert t.states() == {"b": ChildState.UNDEFINED}


def test_simple_one_for_one_builds_children_from_template_with_extra_args() -> None:
    t = h("simple_one_for_one", child("model", "transient"))
    first = t.core.prepare_start(["smollm2", 1], None)
    assert first.id == "model-1"
    assert first.start.args == ("model", "smollm2", 1)
    t.core.add_started(first, 10)
    named = t.core.prepare_start(["llama"], "llama-8b")
    t.core.add_started(named, 11)
    assert t.core.resolve(11) == "llama-8b"
    with pytest.raises(ChildAlreadyStarted):
        t.core.prepare_start([], "llama-8b")
    with pytest.raises(SimpleOneForOne):
        t.core.prepare_start(child("x"), None)
    with pytest.raises(SimpleOneForOne):
        t.core.prepare_restart("model-1")
    with pytest.raises(SimpleOneForOne):
        t.core.delete("model-1")
    counts = t.core.count_children()
    assert (counts.specs, counts.active, counts.workers, counts.supervisors) == (1, 2, 2, 0)


def test_static_supervisor_refuses_extra_args() -> None:
    t = h("one_for_one", child("a"))
    with pytest.raises(SimpleOneForOne):
        t.core.prepare_start(["x"], None)


def test_simple_one_for_one_forgets_dynamic_child_that_is_not_restarted() -> None:
    t = h("simple_one_for_one", child("m", "transient"))
    t.core.add_started(t.core.prepare_start([], None), 10)
    assert t.core.exited(10, NORMAL, 0.0) == NotRestarted("m-1", removed=True)
    assert t.core.which_children() == []


def test_simple_one_for_one_all_significant_ends_with_last_child() -> None:
    t = h(
        "simple_one_for_one",
        child("m", "temporary", significant=True),
        auto_shutdown="all_significant",
    )
    t.core.add_started(t.core.prepare_start([], None), 10)
    t.core.add_started(t.core.prepare_start([], None), 11)
    assert isinstance(t.core.exited(10, NORMAL, 0.0), NotRestarted)
    assert t.core.exited(11, NORMAL, 0.0) == AutoShutdownPlan("m-2", ())


def test_count_children_counts_specs_running_and_types() -> None:
    t = h("one_for_one", child("a"), child("s", type="supervisor"), child("b"))
    t.core.terminated("b")
    counts = t.core.count_children()
    assert (counts.specs, counts.active, counts.supervisors, counts.workers) == (3, 2, 1, 2)


# ----------------------------------------------------- model-based property


@settings(max_examples=300, deadline=None)
@given(
    strategy=st.sampled_from(["one_for_one", "one_for_all", "rest_for_one"]),
    restarts=st.lists(st.sampled_from(list(Restart)), min_size=1, max_size=5),
    events=st.lists(
        st.tuples(st.integers(0, 4), st.sampled_from(list(ExitReason)), st.floats(0, 3)),
        max_size=25,
    ),
    intensity=st.integers(0, 4),
    period=st.floats(0.5, 10),
)
def test_random_exit_sequences_keep_otp_invariants(
    strategy: str,
    restarts: list[Restart],
    events: list[tuple[int, ExitReason, float]],
    intensity: int,
    period: float,
) -> None:
    children = [child(f"c{i}", r.value) for i, r in enumerate(restarts)]
    t = h(strategy, *children, intensity=intensity, period=period)
    order = [c.id for c in children]
    temporary = {c.id for c in children if c.restart is Restart.TEMPORARY}
    now = 0.0
    restart_times: list[float] = []
    for index, reason, gap in events:
        running = [c for c in t.core.which_children() if c.pid is not None]
        if not running:
            break
        victim = running[index % len(running)]
        now += gap
        decision = t.core.exited(victim.pid or 0, reason, now)
        should_restart = victim.restart is Restart.PERMANENT or (
            victim.restart is Restart.TRANSIENT and reason is ExitReason.ABNORMAL
        )
        if not should_restart:
            assert isinstance(decision, NotRestarted)
            assert decision.removed == (victim.restart is Restart.TEMPORARY)
            continue
        restart_times.append(now)
        within = sum(1 for r in restart_times if now - r <= period)
        if within > intensity:
            assert isinstance(decision, Escalation)
            stopped = [s.child_id for s in decision.stop]
            assert stopped == sorted(stopped, key=order.index, reverse=True)
            return
        assert isinstance(decision, RestartPlan)
        assert temporary.isdisjoint(decision.start)
        stopped = [s.child_id for s in decision.stop]
        assert stopped == sorted(stopped, key=order.index, reverse=True)
        assert list(decision.start) == sorted(decision.start, key=order.index)
        assert victim.id in decision.start
        if strategy == "one_for_one":
            assert decision.start == (victim.id,) and decision.stop == ()
        elif strategy == "rest_for_one":
            assert all(order.index(s) >= order.index(victim.id) for s in decision.start)
        t.execute(decision)
        states = t.states()
        assert all(states[s] is ChildState.RUNNING for s in decision.start)
