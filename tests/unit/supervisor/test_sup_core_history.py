"""What ``which_children`` tells an operator beyond OTP: restart counts and the last exit."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from llamad.supervisor.core import (
    ChildInfo,
    Escalation,
    LastExit,
    NotRestarted,
    RestartPlan,
    SupervisorCore,
)
from llamad.supervisor.exits import ExitReason
from llamad.supervisor.spec import ChildSpec, Restart, Start, SupervisorSpec, SupFlags

pytestmark = pytest.mark.timeout(60)

NORMAL, SHUTDOWN, ABNORMAL = ExitReason.NORMAL, ExitReason.SHUTDOWN, ExitReason.ABNORMAL


def child(cid: str, restart: str = "permanent") -> ChildSpec:
    return ChildSpec(cid, Start("toys:worker", (cid,)), restart=Restart(restart))


class Tree:
    """A core whose plans are carried out with fake pids, as the runtime would."""

    def __init__(self, flags: SupFlags, *children: ChildSpec) -> None:
        self.core = SupervisorCore(SupervisorSpec("t", flags, children))
        self.pids = itertools.count(100)
        for cid in self.core.initial_starts():
            self.core.started(cid, next(self.pids))

    def crash(self, cid: str, reason: ExitReason = ABNORMAL, **kw: Any) -> Any:
        pid = self.core.pid_of(cid)
        assert pid is not None
        decision = self.core.exited(pid, reason, kw.pop("now", 0.0), **kw)
        if isinstance(decision, RestartPlan):
            for stop in decision.stop:
                self.core.stopped(stop.child_id, LastExit(reason=SHUTDOWN, at=-1.0))
            for started in decision.start:
                self.core.restarted(started, next(self.pids))
        return decision

    def info(self, cid: str) -> ChildInfo:
        return next(c for c in self.core.which_children() if c.id == cid)


def test_a_new_child_has_no_restarts_and_no_last_exit() -> None:
    t = Tree(SupFlags(), child("a"))
    assert (t.info("a").restarts, t.info("a").last_exit) == (0, None)


def test_restart_count_counts_each_restart_of_that_child() -> None:
    t = Tree(SupFlags(intensity=10, period=60), child("a"), child("b"))
    for i in range(3):
        t.crash("a", now=float(i))
    assert (t.info("a").restarts, t.info("b").restarts) == (3, 0)


def test_siblings_restarted_by_the_strategy_count_a_restart_too() -> None:
    t = Tree(SupFlags(strategy="rest_for_one", intensity=10), child("a"), child("b"), child("c"))
    t.crash("b")
    assert [c.restarts for c in t.core.which_children()] == [0, 1, 1]


def test_last_exit_records_reason_status_cause_and_wall_time() -> None:
    t = Tree(SupFlags(intensity=10), child("a"))
    t.crash("a", now=5.0, at=1_700_000_000.5, exit="signal SIGKILL", cause="hung")
    assert t.info("a").last_exit == LastExit(
        reason=ABNORMAL, at=1_700_000_000.5, exit="signal SIGKILL", cause="hung"
    )


def test_last_exit_time_defaults_to_the_rule_clock() -> None:
    t = Tree(SupFlags(intensity=10), child("a"))
    t.crash("a", now=5.0)
    last = t.info("a").last_exit
    assert last is not None and (last.reason, last.at) == (ABNORMAL, 5.0)


def test_a_child_the_strategy_stopped_shows_a_shutdown_exit() -> None:
    t = Tree(SupFlags(strategy="one_for_all", intensity=10), child("a"), child("b"))
    t.crash("a")
    b = t.info("b").last_exit
    assert b is not None and b.reason is SHUTDOWN


def test_a_child_kept_after_a_normal_exit_keeps_its_history() -> None:
    t = Tree(SupFlags(intensity=10), child("a", "transient"))
    t.crash("a", ABNORMAL, now=1.0)
    assert isinstance(t.crash("a", NORMAL, now=2.0, at=2.5), NotRestarted)
    info = t.info("a")
    assert (info.pid, info.restarts, info.last_exit) == (None, 1, LastExit(reason=NORMAL, at=2.5))


def test_restart_child_is_not_counted_as_a_supervisor_restart() -> None:
    t = Tree(SupFlags(), child("a", "transient"))
    t.crash("a", NORMAL)
    t.core.prepare_restart("a")
    t.core.started("a", 999)
    assert t.info("a").restarts == 0


def test_a_failed_restart_counts_only_once_it_succeeds() -> None:
    t = Tree(SupFlags(intensity=10), child("a"))
    pid = t.core.pid_of("a")
    assert pid is not None
    plan = t.core.exited(pid, ABNORMAL, 0.0)
    assert isinstance(plan, RestartPlan)
    t.core.start_failed("a")
    assert t.info("a").restarts == 0
    retry = t.core.try_again("a", 1.0)
    assert isinstance(retry, RestartPlan)
    assert t.core.restarted("a", 555) == 1
    assert t.info("a").restarts == 1


def test_stopped_is_ignored_for_a_child_already_forgotten() -> None:
    t = Tree(SupFlags(), child("a", "temporary"), child("b"))
    assert t.crash("a") == NotRestarted("a", removed=True)
    t.core.stopped("a", LastExit(reason=SHUTDOWN, at=0.0))
    t.core.stopped("ghost", LastExit(reason=SHUTDOWN, at=0.0))
    assert [(c.id, c.last_exit) for c in t.core.which_children()] == [("b", None)]


def test_escalation_keeps_the_history_of_the_child_that_caused_it() -> None:
    t = Tree(SupFlags(intensity=0), child("a"))
    assert isinstance(t.crash("a", at=9.0), Escalation)
    assert t.info("a").last_exit == LastExit(reason=ABNORMAL, at=9.0)
