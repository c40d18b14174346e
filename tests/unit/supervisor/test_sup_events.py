"""The supervisor's event vocabulary and its feed, without processes."""

from __future__ import annotations

import re
import threading
import typing
from typing import Any

import msgspec
import pytest

from llamad.supervisor.events import (
    ChildExited,
    ChildHung,
    ChildNotRestarted,
    ChildRestarted,
    ChildRestartFailed,
    ChildShutdownTimeout,
    ChildStarted,
    ChildStartFailed,
    ChildStopped,
    EventFeed,
    SupAutoShutdown,
    SupCrashed,
    SupervisorEvent,
    SupEscalated,
    SupRestarting,
    SupShuttingDown,
    SupStarted,
    SupStopped,
    event_kind,
    log_fields,
)
from llamad.supervisor.exits import ExitReason

pytestmark = pytest.mark.timeout(60)

#: One instance of every kind; the test below fails if a kind is added without one.
SAMPLES: list[Any] = [
    SupStarted(strategy="one_for_one", children=2, pid=10),
    ChildStarted(child="a", pid=11, dynamic=True),
    ChildStartFailed(child="a", reason="exit", exit="exit 2", pid=11),
    ChildExited(child="a", pid=11, reason=ExitReason.ABNORMAL, exit="signal SIGKILL", cause="hung"),
    ChildNotRestarted(child="a", removed=True),
    SupRestarting(
        trigger="a", strategy="rest_for_one", stop=("b",), start=("a", "b"), restarts_in_window=1
    ),
    ChildRestarted(child="a", pid=12, restarts=3, restarts_in_window=1),
    ChildRestartFailed(child="a", reason="spawn", error="[Errno 2] No such file"),
    ChildHung(child="a", pid=12, silent_for=1.5, liveness_timeout=1.0),
    ChildShutdownTimeout(child="a", pid=12, shutdown=5.0),
    ChildStopped(child="a", pid=12, exit="signal SIGTERM"),
    SupEscalated(trigger="a", restarts_in_window=2, intensity=1, period=5.0),
    SupAutoShutdown(trigger="a"),
    SupShuttingDown(reason="requested", children=2),
    SupStopped(reason="requested", exit_code=0),
    SupCrashed(error="RuntimeError: bug"),
]


def test_every_event_kind_has_a_sample() -> None:
    assert {type(e) for e in SAMPLES} == set(typing.get_args(SupervisorEvent))


def test_event_kinds_are_unique_log_style_names() -> None:
    kinds = [event_kind(e) for e in SAMPLES]
    assert len(set(kinds)) == len(kinds)
    assert all(re.fullmatch(r"(sup|child)\.[a-z_]+", k) for k in kinds)


@pytest.mark.parametrize("event", SAMPLES, ids=event_kind)
def test_published_event_round_trips_msgpack_as_the_union(event: Any) -> None:
    stamped = EventFeed("s", clock=lambda: 123.5).publish(event)
    wire = msgspec.msgpack.encode(stamped)
    assert msgspec.msgpack.decode(wire)["kind"] == event_kind(event)
    back = msgspec.msgpack.decode(wire, type=SupervisorEvent)
    assert back == stamped
    assert type(back) is type(event)


def test_publish_stamps_seq_time_and_supervisor() -> None:
    feed = EventFeed("model_sup", clock=lambda: 42.0)
    first = feed.publish(SupAutoShutdown(trigger="a"))
    second = feed.publish(SupAutoShutdown(trigger="b"), at=7.0)
    assert (first.seq, first.at, first.sup) == (1, 42.0, "model_sup")
    assert (second.seq, second.at) == (2, 7.0)
    assert feed.last_seq == 2


def test_since_returns_events_after_a_seq_in_order() -> None:
    feed = EventFeed("s")
    for i in range(5):
        feed.publish(SupAutoShutdown(trigger=str(i)))
    assert [e.seq for e in feed.since(0)] == [1, 2, 3, 4, 5]
    assert [e.seq for e in feed.since(3)] == [4, 5]
    assert feed.since(5) == []
    assert feed.since(99) == []


def test_feed_keeps_the_last_capacity_events_and_a_reader_sees_the_gap() -> None:
    feed = EventFeed("s", capacity=3)
    for i in range(7):
        feed.publish(SupAutoShutdown(trigger=str(i)))
    # A reader that had seen seq 2 gets 5..7: the jump says 3 and 4 are lost.
    assert [e.seq for e in feed.since(2)] == [5, 6, 7]
    assert [e.seq for e in feed.since(5)] == [6, 7]


def test_wait_returns_once_another_thread_publishes() -> None:
    feed = EventFeed("s")
    feed.publish(SupAutoShutdown(trigger="old"))
    publisher = threading.Timer(0.05, lambda: feed.publish(SupAutoShutdown(trigger="new")))
    publisher.start()
    try:
        got = feed.wait(1, timeout=30)
    finally:
        publisher.join()
    assert [e.trigger for e in got if isinstance(e, SupAutoShutdown)] == ["new"]


def test_wait_times_out_empty() -> None:
    assert EventFeed("s").wait(0, timeout=0.01) == []


def test_subscriber_is_woken_per_event_until_it_unsubscribes() -> None:
    feed = EventFeed("s")
    wakes: list[int] = []
    unsubscribe = feed.subscribe(lambda: wakes.append(feed.last_seq))
    feed.publish(SupAutoShutdown(trigger="a"))
    feed.publish(SupAutoShutdown(trigger="b"))
    unsubscribe()
    feed.publish(SupAutoShutdown(trigger="c"))
    assert wakes == [1, 2]
    unsubscribe()  # idempotent


def test_log_fields_are_the_event_fields_without_stamps_or_unset_values() -> None:
    event = EventFeed("s").publish(
        ChildExited(child="a", pid=3, reason=ExitReason.NORMAL, exit="exit 0")
    )
    assert log_fields(event) == {
        "seq": 1,
        "child": "a",
        "pid": 3,
        "reason": ExitReason.NORMAL,
        "exit": "exit 0",
        "restarts_in_window": 0,
    }


@pytest.mark.parametrize(
    ("reason", "level"),
    [(ExitReason.ABNORMAL, "warning"), (ExitReason.NORMAL, "info"), (ExitReason.SHUTDOWN, "info")],
)
def test_abnormal_exits_log_as_warnings(reason: ExitReason, level: str) -> None:
    assert ChildExited(child="a", pid=1, reason=reason, exit="x").log_level() == level


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        EventFeed("s", capacity=0)
