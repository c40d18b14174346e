"""llamad.daemon.readiness's rules, stepped without a daemon: readiness, status lines,
the start-timeout extension, STOPPING, and the watchdog's lateness rule."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest

from llamad.daemon.readiness import (
    EXTEND_BY_S,
    EXTEND_EVERY_S,
    LOADING_POLL_S,
    ModelView,
    Phase,
    Reports,
    Watchdog,
    late_children,
    readiness,
)
from llamad.front.wire import ModelState
from llamad.supervisor.events import (
    ChildExited,
    ChildRestarted,
    ChildStarted,
    ChildStopped,
    SupShuttingDown,
    SupStarted,
    SupStopped,
)
from llamad.supervisor.exits import ExitReason
from llamad.supervisor.supervisor_proc import ChildBeat

pytestmark = pytest.mark.timeout(10)

LOADING, READY, FAILED, UNLOADED = (
    ModelState.LOADING,
    ModelState.READY,
    ModelState.FAILED,
    ModelState.UNLOADED,
)


def views(**states: ModelState | tuple[ModelState, float | None]) -> dict[str, ModelView]:
    out = {}
    for mid, s in states.items():
        state, loaded_at = (s, 1.0) if isinstance(s, ModelState) else s
        out[mid] = ModelView(mid, state, loaded_at=loaded_at if state is not LOADING else None)
    return out


def started(reports: Reports) -> None:
    for child in ("cache_sup", "model_sup", "front"):
        reports.on_event(ChildStarted(child=child, pid=1))
    reports.on_event(SupStarted(strategy="one_for_one", children=3, pid=1))


def keys(notices: list[tuple[str, ...]]) -> list[str]:
    return [a.split("=", 1)[0] for n in notices for a in n]


def test_ready_waits_for_every_configured_model_to_load_or_fail() -> None:
    assert not readiness(["a", "b"], {}).ready  # the front has not written its table yet
    assert readiness(["a", "b"], views(a=LOADING, b=READY)).waiting == ("a",)
    done = readiness(["a", "b"], views(a=FAILED, b=READY))
    assert done.ready and done.failed == ("a",)
    # Unloaded after a load (keep_alive) counts; unloaded before any load does not.
    assert readiness(["a"], views(a=(UNLOADED, 5.0))).ready
    assert not readiness(["a"], views(a=(UNLOADED, None))).ready
    # A model loaded at run time is nobody's readiness.
    assert readiness(["a"], views(a=READY, extra=LOADING)).ready


def test_ready_is_sent_once_after_the_last_configured_model_settles() -> None:
    r = Reports(("a", "b"))
    started(r)
    assert r.phase is Phase.LOADING and r.poll_every() == LOADING_POLL_S
    assert "READY" not in keys(r.on_models(views(a=READY, b=LOADING), 0.0))
    sent = r.on_models(views(a=READY, b=FAILED), 1.0)
    assert keys(sent) == ["READY", "STATUS"]
    assert "Serving 1 model (a)" in sent[0][1] and "failed: b" in sent[0][1]
    assert r.phase is Phase.SERVING
    assert "READY" not in keys(r.on_models(views(a=READY, b=FAILED), 2.0))


def test_no_ready_before_the_tree_has_started() -> None:
    r = Reports(())
    assert r.on_models({}, 0.0) == []  # children still starting: nothing to judge
    r.on_event(ChildStarted(child="cache_sup", pid=1))
    assert r.phase is Phase.STARTING
    r.on_event(SupStarted(strategy="one_for_one", children=3, pid=1))
    assert keys(r.on_models({}, 0.0)) == ["READY", "STATUS"]  # no configured model


def test_loading_status_names_the_model_and_its_progress() -> None:
    r = Reports(("big", "small"))
    started(r)
    v = views(small=READY)
    v["big"] = ModelView("big", LOADING, progress=0.42)
    sent = r.on_models(v, 0.0)
    assert sent[0] == ("STATUS=Loading big 42% (1 of 2 configured models done)",)


def test_the_start_timeout_is_extended_every_few_seconds_while_a_model_loads() -> None:
    r = Reports(("a",))
    started(r)
    extends = []
    t = 0.0
    while t < 3 * EXTEND_EVERY_S:
        for notice in r.on_models(views(a=LOADING), t):
            extends += [(t, a) for a in notice if a.startswith("EXTEND_TIMEOUT_USEC=")]
        t += LOADING_POLL_S
    assert [a for _, a in extends] == [f"EXTEND_TIMEOUT_USEC={int(EXTEND_BY_S * 1e6)}"] * 3
    assert [round(at, 2) for at, _ in extends] == [0.0, EXTEND_EVERY_S, 2 * EXTEND_EVERY_S]
    assert EXTEND_BY_S > EXTEND_EVERY_S  # a late report never lets the start time out
    r.on_models(views(a=READY), t)
    assert "EXTEND_TIMEOUT_USEC" not in keys(r.on_models(views(a=READY), t + 60))


def test_status_is_sent_only_when_it_changes() -> None:
    r = Reports(("a",))
    started(r)
    r.on_models(views(a=READY), 0.0)
    v = views(a=READY)
    v["a"] = ModelView("a", READY, loaded_at=1.0, active=3)
    assert r.on_models(v, 1.0) == [("STATUS=Serving 1 model (a), 3 active requests",)]
    assert r.on_models(v, 2.0) == []


def test_a_restarting_child_is_named_until_it_is_back() -> None:
    r = Reports(("a",))
    started(r)
    r.on_models(views(a=READY), 0.0)
    r.on_event(
        ChildExited(
            child="front",
            pid=9,
            reason=ExitReason.ABNORMAL,
            exit="signal SIGKILL",
            restarts_in_window=1,
        )
    )
    assert "restarting: front" in r.on_models(views(a=READY), 1.0)[0][0]
    r.on_event(ChildRestarted(child="front", pid=10, restarts=1, restarts_in_window=1))
    assert "restarting" not in r.on_models(views(a=READY), 2.0)[0][0]


@pytest.mark.parametrize("phase", ["starting", "loading", "serving"])
def test_stopping_is_sent_as_soon_as_the_root_stops_its_tree(phase: str) -> None:
    r = Reports(("a",))
    if phase != "starting":
        started(r)
    if phase == "serving":
        r.on_models(views(a=READY), 0.0)
    sent = r.on_event(SupShuttingDown(reason="requested", children=3))
    assert keys(sent) == ["STOPPING", "STATUS"]
    assert r.phase is Phase.STOPPING and r.poll_every() is None
    assert r.on_event(SupShuttingDown(reason="requested", children=3)) == []
    assert r.on_event(ChildStopped(child="front", pid=3)) == [("STATUS=Stopping: front stopped",)]
    assert r.on_event(SupStopped(reason="requested", exit_code=0)) == [("STATUS=Stopped (exit 0)",)]


def beat(child: str, silent: float, liveness: float | None, killed: str | None = None) -> ChildBeat:
    return ChildBeat(child, 1, silent, liveness, killed)


def test_a_child_is_late_after_half_its_heartbeat_window_or_once_killed() -> None:
    assert late_children([beat("front", 7.4, 15.0), beat("model_sup", 1.0, 30.0)]) == []
    assert late_children([beat("front", 7.6, 15.0), beat("model_sup", 1.0, 30.0)]) == ["front"]
    assert late_children([beat("x", 1e6, None)]) == []  # no window, no beats to judge
    assert late_children([beat("front", 0.0, 15.0, killed="hung")]) == ["front"]


@dataclass
class FakeClock:
    now: float = 100.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeNotifier:
    pings: list[float] = field(default_factory=list)
    clock: FakeClock = field(default_factory=FakeClock)

    def watchdog(self) -> bool:
        self.pings.append(self.clock.now)
        return True


@dataclass
class FakeSupervisor:
    beats: list[ChildBeat] = field(default_factory=list)

    def child_beats(self) -> list[ChildBeat]:
        return self.beats


def test_the_watchdog_pings_every_period_while_every_child_is_on_time() -> None:
    clock = FakeClock()
    notifier = FakeNotifier(clock=clock)
    dog = Watchdog(notifier, 1.0, clock=clock)  # type: ignore[arg-type]
    sup = FakeSupervisor([beat("front", 0.1, 15.0)])
    for _ in range(40):  # the loop calls it at every turn, as often as it likes
        dog.beat(sup)  # type: ignore[arg-type]
        clock.now += dog.interval()
    assert notifier.pings[0] == 100.0
    gaps = [b - a for a, b in itertools.pairwise(notifier.pings)]
    assert gaps and all(1.0 <= g <= 1.25 for g in gaps), gaps
    assert 0 < dog.interval() <= 0.25


def test_the_watchdog_is_withheld_while_a_child_is_late_and_resumes() -> None:
    clock = FakeClock()
    notifier = FakeNotifier(clock=clock)
    dog = Watchdog(notifier, 1.0, clock=clock)  # type: ignore[arg-type]
    sup = FakeSupervisor([beat("front", 8.0, 15.0)])
    for _ in range(20):
        dog.beat(sup)  # type: ignore[arg-type]
        clock.now += 0.25
    assert notifier.pings == []
    sup.beats = [beat("front", 0.0, 15.0)]
    dog.beat(sup)  # type: ignore[arg-type]
    assert notifier.pings == [clock.now]
