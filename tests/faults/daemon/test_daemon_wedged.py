"""Wedged parts of a running daemon (issue 17): SIGSTOP a child of each kind, then
detection (``child.hung`` from its supervisor), restart (a new pid) and service.

One daemon for the module with short liveness windows from its config
(``[cache] liveness_s``, the model's ``liveness_s``; the front's window is
the tree's fixed 15 s). The supervisors themselves (``cache_sup``,
``model_sup``) are not signalled here.

While cache-meta is stopped, a worker's lookups must not wait on it: the
first one times out (``lookup_timeout_s``), the view takes the cache for
down and the requests after it run cold without asking. The tests assert
that mechanism (replies cold, the worker's ``model.cache_down`` and
``model.cache_back``), not how fast the replies came.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from daemon_harness import EVENTUALLY, GREEDY, Daemon, prompt_text, wait_until
from llamad.actors import Registry
from llamad.front.wire import ModelState
from llamad.model.results import CacheHitKind, FinishReason

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

META_LIVENESS_S = 6.0  # the three requests below run well within it
WORKER_LIVENESS_S = 5.0  # the worker template's floor: a model cannot ask for less


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    # No live reuse: every request asks the cache, so a reply says where its KV came from.
    d = Daemon({"a": {"liveness_s": WORKER_LIVENESS_S, "live_reuse": False}})
    text = d.config.read_text()
    assert text.count("[cache]\n") == 1
    d.config.write_text(text.replace("[cache]\n", f"[cache]\nliveness_s = {META_LIVENESS_S}\n"))
    try:
        d.start(wait_for=["a"])
        yield d
    finally:
        d.cleanup()


def _events(d: Daemon, name: str, **fields: Any) -> list[dict[str, Any]]:
    """The daemon's log events called ``name`` whose fields include ``fields``."""
    found = []
    for line in d.log_events():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if (
            isinstance(event, dict)
            and event.get("event") == name
            and all(event.get(k) == v for k, v in fields.items())
        ):
            found.append(event)
    return found


def _stopped(pid: int) -> None:
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, "SIGSTOP", 10)


def _pid_of(d: Daemon, child: str) -> int | None:
    """The pid of the root's child ``child``, or ``None`` while it has none."""
    try:
        return d.child_pid(child)
    except AssertionError:  # between the kill and the restart
        return None


def _row(d: Daemon, sup: str, child: str) -> Any:
    (s,) = [s for s in d.status().supervisors if s.name == sup]
    (row,) = [c for c in s.children if c.id == child]
    return row


def test_a_stopped_cache_meta_is_replaced_and_requests_meanwhile_run_cold(daemon: Daemon) -> None:
    worker = daemon.worker("a")
    warm = prompt_text(31)
    first = worker.complete(warm, max_tokens=3, **GREEDY)
    daemon.wait_saved(first.finish_key)
    assert worker.complete(warm, max_tokens=3, **GREEDY).cache_hit_kind is CacheHitKind.EXACT
    registry = Registry(daemon.registry_root)
    meta = daemon.child_pid("cache-meta")
    downs = len(_events(daemon, "model.cache_down"))
    failed_before = len(_events(daemon, "model.lookup_failed"))

    _stopped(meta)
    try:
        # The saved prompt is answered, cold: the first lookup times out and
        # takes the cache for down, the next ones do not ask. A cold reply is
        # only certain while the stopped cache-meta is still the registered one.
        while_stopped = 0
        for i in range(3):
            reply = worker.complete(warm, max_tokens=3, **GREEDY)
            assert reply.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
            entry = registry.lookup("cache-meta")
            if entry is not None and entry.pid == meta:
                assert reply.cache_hit_kind is CacheHitKind.COLD, i
                while_stopped += 1
        assert while_stopped >= 1  # the first lookup waits out its timeout
        assert len(_events(daemon, "model.cache_down")) == downs + 1
        # One lookup waited (and timed out); the others were skipped at once.
        # Every reply that ended while the stopped cache-meta was still the
        # registered one looked up while it was stopped; on a loaded machine
        # cache_sup may replace it before the last request, whose lookup then
        # reaches the new one.
        failed = [e["error"] for e in _events(daemon, "model.lookup_failed")[failed_before:]]
        assert while_stopped <= len(failed) <= 3, (while_stopped, failed)
        assert "RequestTimeout" in failed[0], failed
        assert all("taken for down" in e for e in failed[1:]), failed

        # cache_sup finds it silent past its window, kills it and starts another.
        (hung,) = wait_until(
            lambda: _events(daemon, "child.hung", child="cache-meta", pid=meta),
            "cache-meta to be found hung",
        )
        assert hung["liveness_timeout"] == META_LIVENESS_S
        wait_until(
            lambda: (e := registry.lookup("cache-meta")) is not None and e.pid != meta,
            "a new cache-meta",
        )
    finally:
        if psutil.pid_exists(meta):
            os.kill(meta, signal.SIGCONT)
    assert not psutil.pid_exists(meta) or psutil.Process(meta).status() == psutil.STATUS_ZOMBIE

    # Warm again: the worker hears from the new cache-meta, whose index holds
    # the ram row saved before the wedge.
    wait_until(
        lambda: worker.complete(warm, max_tokens=3, **GREEDY).cache_hit_kind is CacheHitKind.EXACT,
        "a warm reply from the new cache-meta",
    )
    assert _events(daemon, "model.cache_back")
    row = _row(daemon, "cache_sup", "cache-meta")
    assert row.pid == registry.lookup("cache-meta").pid  # type: ignore[union-attr]
    assert row.restarts == 1 and row.last_exit == "signal SIGKILL (hung)"


def test_a_stopped_worker_is_replaced_and_serves_again(daemon: Daemon) -> None:
    before = daemon.info("a")
    assert before.pid is not None
    _stopped(before.pid)
    try:
        (hung,) = wait_until(
            lambda: _events(daemon, "child.hung", child="model.a", pid=before.pid),
            "a's worker to be found hung",
        )
        assert hung["liveness_timeout"] == WORKER_LIVENESS_S
        after = wait_until(
            lambda: (
                (i := daemon.info("a")).state is ModelState.READY
                and i.pid not in (None, before.pid)
                and i
            ),
            "a's worker to be restarted",
            EVENTUALLY,
        )
    finally:
        if psutil.pid_exists(before.pid):
            os.kill(before.pid, signal.SIGCONT)
    reply = daemon.worker("a").complete(prompt_text(32), max_tokens=3, **GREEDY)
    assert reply.stats.completion_tokens == 3
    assert after.restarts == before.restarts + 1
    assert after.last_exit == "signal SIGKILL (hung)"
    row = _row(daemon, "model_sup", "model.a")
    assert row.pid == after.pid and row.last_exit == "signal SIGKILL (hung)"


def test_a_stopped_front_is_replaced_and_routes_again(daemon: Daemon) -> None:
    front = daemon.child_pid("front")
    worker_pid = daemon.info("a").pid
    _stopped(front)
    try:
        (hung,) = wait_until(
            lambda: _events(daemon, "child.hung", child="front", pid=front),
            "the front to be found hung",
            60,
        )
        assert hung["liveness_timeout"] == 15.0  # FRONT_LIVENESS_S: not configurable
        wait_until(lambda: _pid_of(daemon, "front") not in (None, front), "a new front")
    finally:
        if psutil.pid_exists(front):
            os.kill(front, signal.SIGCONT)
    route = daemon.route("a")  # the same client: it reconnects to the new front
    assert route.actor == "model.a"
    assert daemon.info("a").pid == worker_pid  # the workers served on
    reply = daemon.worker("a").complete(prompt_text(33), max_tokens=3, **GREEDY)
    assert reply.stats.completion_tokens == 3
    row = _row(daemon, "llamad", "front")
    assert row.restarts == 1 and row.last_exit == "signal SIGKILL (hung)"
