"""The front's table of models as a plain object: model_sup's events, the per-model
restart intensity, keep_alive's idle rule."""

from __future__ import annotations

import pytest

from llamad.front.table import MODEL_PERIOD_S, MODEL_RESTARTS, GiveUp, ModelEntry, ModelTable
from llamad.front.wire import ModelState
from llamad.supervisor.events import ChildExited, ChildRestarted, ChildRestartFailed
from llamad.supervisor.exits import ExitReason

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _table() -> tuple[ModelTable, ModelEntry, Clock]:
    clock = Clock()
    table = ModelTable(clock=clock, wall=lambda: 5.0e8)
    entry = table.put(
        ModelEntry(
            model_id="m",
            spec={},
            path="/m.gguf",
            n_ctx=512,
            n_seq_max=1,
            keep_alive_s=10.0,
            configured=True,
        )
    )
    table.loaded(entry, pid=100)
    return table, entry, clock


def _crash(at: float, pid: int = 100) -> ChildExited:
    return ChildExited(
        child="model.m", pid=pid, reason=ExitReason.ABNORMAL, exit="signal SIGKILL", at=at
    )


def test_a_crash_marks_the_model_restarting_and_its_restart_ready_again() -> None:
    table, entry, _ = _table()
    assert table.on_event(_crash(1.0)) is None
    assert entry.state is ModelState.LOADING and entry.pid is None
    assert entry.last_exit == "signal SIGKILL"
    table.on_event(ChildRestarted(child="model.m", pid=101, restarts=1, restarts_in_window=1))
    assert entry.state is ModelState.READY and entry.pid == 101 and entry.restarts == 1


def test_more_restarts_than_the_intensity_within_the_period_give_the_model_up() -> None:
    table, entry, _ = _table()
    decisions = [table.on_event(_crash(1.0))]
    for i in range(MODEL_RESTARTS):
        event = ChildRestartFailed(child="model.m", reason="exit", exit="exit 1", at=2.0 + i)
        decisions.append(table.on_event(event))
    assert decisions[:-1] == [None] * MODEL_RESTARTS
    give_up = decisions[-1]
    assert isinstance(give_up, GiveUp) and give_up.model_id == "m"
    assert entry.state is ModelState.FAILED and entry.error == give_up.why
    assert f"{MODEL_RESTARTS + 1} restarts within" in give_up.why
    assert table.on_event(_crash(9.0)) is None  # given up once only


def test_restarts_older_than_the_period_do_not_count() -> None:
    table, entry, _ = _table()
    for i in range(MODEL_RESTARTS * 3):
        assert table.on_event(_crash(i * (MODEL_PERIOD_S / MODEL_RESTARTS + 0.1))) is None
    assert entry.state is ModelState.LOADING


def test_a_fresh_load_starts_a_fresh_window() -> None:
    table, entry, _ = _table()
    for i in range(MODEL_RESTARTS):
        table.on_event(_crash(1.0 + i))
    table.loaded(entry, pid=200)
    assert entry.restarts == 0
    assert table.on_event(_crash(10.0, pid=200)) is None


def test_events_of_other_children_are_ignored() -> None:
    table, entry, _ = _table()
    event = ChildExited(child="model.other", pid=5, reason=ExitReason.ABNORMAL, exit="x", at=1.0)
    assert table.on_event(event) is None
    assert entry.state is ModelState.READY


def test_keep_alive_expires_only_when_idle_that_long() -> None:
    table, entry, clock = _table()
    assert not table.expired(entry, board_pending=0, board_last=None)
    clock.now += 10.0
    assert table.expired(entry, board_pending=0, board_last=None)
    assert not table.expired(entry, board_pending=1, board_last=None)  # a request in flight
    assert not table.expired(entry, board_pending=0, board_last=clock.now - 2.0)  # a recent one
    entry.active_at = clock.now - 1.0  # a route
    assert not table.expired(entry, board_pending=0, board_last=None)
    entry.keep_alive_s = None
    clock.now += 100.0
    assert not table.expired(entry, board_pending=0, board_last=None)


def test_info_says_whether_the_worker_runs_deterministic() -> None:
    # The spec's wire form carries the option; the info `llamad models` shows follows it.
    def entry(spec: dict[str, object]) -> ModelEntry:
        return ModelEntry("m", spec, "/m.gguf", 512, 1, None, configured=True)

    assert entry({"deterministic": True}).info().deterministic is True
    assert entry({"deterministic": False}).info().deterministic is False
    assert entry({}).info().deterministic is False
