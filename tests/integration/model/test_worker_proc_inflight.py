"""A save still in flight is never passed by silently (SPEC M18), through real processes.

Two workers of the default model (one thread each) share one cache-meta: the
same model file and context, hence one namespace. Worker ``a`` answers a
prompt and hands its finish row to its writer; the test stops ``a``
(SIGSTOP) while that row is still reserved and unwritten, so the save is
held in flight for as long as the test wants, and sends the same prompt to
worker ``b``, which holds no live KV of it. ``b``'s lookup finds the row in
flight: it waits for it (bounded by ``session_resume_wait_ms``) and says so
in its stats, or, when the bound passes first, runs cold and names the row it
went without in ``cache_miss``.

A publish that had already left ``a`` when the stop landed reaches cache-meta
while ``a`` is stopped (a race the CI hit once): that try is void, and the test
takes a fresh prompt; a try in which ``b`` answers while the row is still
reserved, without waiting, fails.

Nothing waits for a save to be published: the test holds one back on purpose
and polls cache-meta's own tables (the reservation, a parked waiter), with
deadlines.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from typing import Any

import pytest

from llamad.cache.client import CacheClient
from llamad.cache.policy import CachePolicy
from llamad.model.results import CacheHitKind, Completion
from llamad.model.worker_client import WorkerClient
from worker_tree import EVENTUALLY, WorkerTree, prompt_text, wait_until

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

WAIT_MS = 3_000
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 1}


TREE_POLICY = CachePolicy(
    min_tokens=16,
    cold_min_tokens=30_000,  # no cold save: the finish row is the only one
    session_resume_wait_ms=WAIT_MS,
    evict_save_timeout_ms=10_000,
)


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    model_id="a",
    n_ctx=2048,
    n_batch=256,
    n_seq_max=2,
    policy=TREE_POLICY,
    liveness_s=60.0,  # ``a`` is stopped for seconds on purpose
    siblings={"b": {}},
    prefix="lwif",
)


def _reserved(cache: CacheClient, key: bytes) -> bool | None:
    """True while ``key`` is reserved and unpublished, False once published,
    None while cache-meta knows nothing of it yet."""
    for entry in cache.dump():
        if entry["key"] == key.hex():
            return bool(entry["status"] == "reserved")
    return None


def _save_held_in_flight(tree: WorkerTree, a: WorkerClient, base: int) -> tuple[str, Completion]:
    """A prompt whose finish row ``a`` is writing, with ``a`` stopped (SIGSTOP)
    before it could publish it; a fresh prompt is tried when the row was
    published before the stop landed."""
    pid = tree.pid(tree.specs["a"].actor_name)
    with tree.cache() as cache:
        for attempt in range(8):
            # ~900 tokens: a row of ~20 MB, written in tens of milliseconds.
            text = prompt_text(base + attempt, words=400)
            first = a.complete(text, **GREEDY)
            key = first.finish_key
            assert key is not None
            deadline = time.monotonic() + EVENTUALLY
            # No sleep between polls: the save is in flight for milliseconds.
            while (state := _reserved(cache, key)) is None:
                assert time.monotonic() < deadline, "the finish save was never reserved"
            if state:
                os.kill(pid, signal.SIGSTOP)
                if _reserved(cache, key):
                    return text, first
                os.kill(pid, signal.SIGCONT)
    pytest.fail("every finish save was published before the worker could be stopped")


#: Prompts tried per test: a row whose publish had already left ``a`` when
#: the stop landed is published while ``a`` is stopped, and the try is void.
TRIES = 4


def _ask(client: WorkerClient, text: str, got: list[Completion]) -> None:
    got.append(client.complete(text, **GREEDY))


def _parked_or_published(cache: CacheClient, key: bytes, got: list[Completion]) -> str | None:
    """'parked' once a lookup waits on the row in flight, 'published' once the
    row landed anyway (its publish had left ``a`` before the stop), 'done' when
    ``b`` answered while the row was still reserved; None while none is so."""
    if cache.status()["waiters"] >= 1:
        return "parked"
    if _reserved(cache, key) is False:
        return "published"
    return "done" if got else None


def test_a_request_waits_for_a_row_still_being_written_and_says_so(tree: WorkerTree) -> None:
    a, b = tree.client("a"), tree.client("b")
    pid = tree.pid(tree.specs["a"].actor_name)
    for attempt in range(TRIES):
        text, first = _save_held_in_flight(tree, a, 300 + 8 * attempt)
        key = first.finish_key
        assert key is not None
        got: list[Completion] = []
        try:
            waiter = threading.Thread(target=_ask, args=(b, text, got))
            waiter.start()
            with tree.cache() as cache:
                # b's lookup is parked on the save in flight inside cache-meta.
                state = wait_until(
                    functools.partial(_parked_or_published, cache, key, got),
                    "b to wait for the row",
                )
        finally:
            os.kill(pid, signal.SIGCONT)
        waiter.join(EVENTUALLY)
        if state == "published":
            continue
        assert state == "parked", "b answered without waiting for the row in flight"
        [result] = got
        assert result.cache_hit_kind is CacheHitKind.EXACT
        assert result.cache_delta.sources.computed == 0  # the row keeps the prompt's logits
        assert result.cache_delta.sources.live == 0
        assert result.stats.wait_ms > 0.0
        assert result.generated == first.generated
        return
    pytest.fail("every row in flight was published while its writer was stopped")


def test_a_row_that_does_not_land_within_the_bound_is_named_in_the_miss(
    tree: WorkerTree,
) -> None:
    a, b = tree.client("a"), tree.client("b")
    pid = tree.pid(tree.specs["a"].actor_name)
    for attempt in range(TRIES):
        text, first = _save_held_in_flight(tree, a, 400 + 8 * attempt)
        key = first.finish_key
        assert key is not None
        try:
            result = b.complete(text, **GREEDY)
            with tree.cache() as cache:
                landed = _reserved(cache, key) is False
        finally:
            os.kill(pid, signal.SIGCONT)
        if landed:
            continue
        # It went on without the row: nothing came from a tier (a few leading
        # tokens may be b's own live KV of the previous test's prompt).
        sources = result.cache_delta.sources
        assert result.cache_hit_kind is not CacheHitKind.EXACT
        assert sources.ram == sources.ram_file == sources.disk == 0
        miss = result.cache_miss
        assert miss is not None
        assert miss.inflight_key == first.finish_key
        assert miss.inflight_tokens == first.stats.prompt_tokens
        assert miss.waited_ms >= WAIT_MS * 0.9
        assert result.generated == first.generated
        return
    pytest.fail("every row in flight was published while its writer was stopped")
