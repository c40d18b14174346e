"""A model worker killed (SIGKILL) or stopped (SIGSTOP) mid-request: its clients get
``worker_crashed`` at once, the supervisor restarts it, the next request is served,
and every published row is intact (SPEC M15, ARCHITECTURE "Process topology")."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator

import pytest

from llamad.errors import WorkerCrashed
from llamad.model.results import CacheHitKind, TokenEvent
from llamad.supervisor.events import ChildHung
from worker_tree import WorkerTree, prompt_text, wait_until

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY = {"temperature": 0.0}
ENDLESS = 'root ::= "la " root'


@pytest.fixture(scope="module")
def tree() -> Iterator[WorkerTree]:
    t = WorkerTree(n_seq_max=2, liveness_s=2.0, prefix="lmk").start()
    try:
        yield t
    finally:
        t.close()


def saved_row(tree: WorkerTree, i: int) -> tuple[str, bytes, list[int]]:
    """A prompt whose finish row is published; its key and the reply."""
    w = tree.client()
    prompt = prompt_text(i)
    done = w.complete(prompt, max_tokens=4, **GREEDY)
    assert done.finish_key is not None
    tree.wait_saved(done.finish_key)
    return prompt, done.finish_key, done.generated


def test_killed_worker_fails_its_stream_within_a_second_and_comes_back_with_rows_intact(
    tree: WorkerTree,
) -> None:
    prompt, key, reply = saved_row(tree, 20)
    pid = tree.pid()
    w = tree.client()
    stream = w.infer(prompt_text(21), max_tokens=10_000, grammar=ENDLESS, **GREEDY)
    events = iter(stream)
    assert isinstance(next(events), TokenEvent)
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    with pytest.raises(WorkerCrashed):
        for _ in events:
            pass
    assert time.monotonic() - killed_at < 1.0
    tree.wait_restarted(pid)
    with tree.cache() as cache:
        ref = cache.lookup_exact(key)
        assert ref is not None, "a row published before the crash was lost"
        cache.checkin(ref.pin)
    # The same client follows the restart; the row restores and replays.
    again = w.complete(prompt, max_tokens=4, **GREEDY)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.generated == reply


def test_stopped_worker_is_killed_by_its_silent_heartbeat_and_restarted(
    tree: WorkerTree,
) -> None:
    pid = tree.pid()
    seq = tree.sup.events.last_seq
    w = tree.client()
    stream = w.infer(prompt_text(22), max_tokens=10_000, grammar=ENDLESS, **GREEDY)
    events = iter(stream)
    assert isinstance(next(events), TokenEvent)
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerCrashed):
            for _ in events:
                pass
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    hung = [e for e in tree.sup.events.since(seq) if isinstance(e, ChildHung)]
    assert [e.pid for e in hung] == [pid]
    assert hung[0].child == tree.spec.actor_name
    tree.wait_restarted(pid)
    done = w.complete(prompt_text(23), max_tokens=2, **GREEDY)
    assert done.stats.completion_tokens >= 1


def test_meta_killed_mid_request_the_request_ends_cleanly_and_hits_resume(
    tree: WorkerTree,
) -> None:
    prompt, _, reply = saved_row(tree, 24)
    worker_pid = tree.pid()
    meta = tree.meta_pid()
    w = tree.client()
    stream = w.infer(prompt_text(25), max_tokens=12, **GREEDY)
    events = iter(stream)
    assert isinstance(next(events), TokenEvent)
    os.kill(meta, signal.SIGKILL)
    for _ in events:  # completes (its saves fail quietly) or raises a typed error
        pass
    assert stream.result is not None
    assert tree.pid() == worker_pid  # the worker did not go down with cache-meta
    tree.wait_restarted(meta, "cache-meta")

    # A request during the outage runs cold; once cache-meta is back (its index
    # rebuilt from the tiers) the saved row is found again.
    def hit() -> bool:
        done = w.complete(prompt, max_tokens=4, **GREEDY)
        assert done.generated == reply
        return done.cache_hit_kind is CacheHitKind.EXACT

    wait_until(hit, "a cache hit after cache-meta's restart")
    assert tree.pid() == worker_pid
