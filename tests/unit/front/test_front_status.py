"""The status of the daemon's supervisors: each child as ``which_children`` tells it."""

from __future__ import annotations

from llamad.front.status import supervisor_status
from llamad.supervisor.core import ChildInfo, ChildState, LastExit
from llamad.supervisor.exits import ExitReason
from llamad.supervisor.spec import ChildType, Restart


def _child(last_exit: LastExit | None, restarts: int = 1) -> ChildInfo:
    return ChildInfo(
        "cache-meta",
        42,
        ChildState.RUNNING,
        ChildType.WORKER,
        Restart.PERMANENT,
        restarts,
        last_exit,
    )


def test_a_child_killed_for_being_hung_says_so() -> None:
    hung = LastExit(reason=ExitReason.ABNORMAL, at=1.0, exit="signal SIGKILL", cause="hung")
    (row,) = supervisor_status("cache_sup", [_child(hung)]).children
    assert (row.id, row.pid, row.state, row.restarts) == ("cache-meta", 42, "running", 1)
    assert row.last_exit == "signal SIGKILL (hung)"


def test_a_child_that_crashed_by_itself_shows_only_its_exit() -> None:
    crashed = LastExit(reason=ExitReason.ABNORMAL, at=1.0, exit="exit 3")
    (row,) = supervisor_status("cache_sup", [_child(crashed)]).children
    assert row.last_exit == "exit 3"
    (fresh,) = supervisor_status("cache_sup", [_child(None, 0)]).children
    assert fresh.last_exit is None


def test_a_supervisor_that_did_not_answer_is_an_error_row() -> None:
    busy = supervisor_status("cache_sup", "timeout: busy restarting a child")
    assert busy.children == [] and busy.error == "timeout: busy restarting a child"
