"""Threads on a shared machine through real worker processes (SPEC M14).

One supervisor runs cache-meta and two workers of the default model,
``smol`` and ``smol-b``, each with a context of 2 threads and the policy
"2 cores" (this machine's). Both worker processes share the daemon's thread
board (``<registry>/threads.board``), so:

- a worker alone decodes on both cores and its status says so (threads,
  budget, busy workers, fallbacks, the spin setting);
- with another worker marked busy on the board (this test process holding
  a slot through ThreadBoard's API, or the second worker in the middle of a
  long prefill) its budget drops to 1 thread: 2 cores, 2 busy workers,
  1 thread each.

The policy never explores and judges a step a collapse only at 50x its
median (and has a cool-down of its own, which status shows), so the
machine's other load cannot move the thread count: only the budget does.
The decodes at 2 threads are a few short ones and the first ticks of one
prefill (the spin is bounded, so they slow down on shared cores, never
collapse).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from llamad.cache.policy import CachePolicy
from llamad.llama_ffi.spin import SpinSetting
from llamad.model.thread_board import ThreadBoard
from llamad.model.threads import ThreadPolicy, ThreadStatus
from llamad.model.wire import WorkerSnapshot
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_parts import thread_board_path
from worker_tree import WorkerTree, prompt_text, wait_until

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY: dict[str, Any] = {"temperature": 0.0}
ENDLESS = 'root ::= "la " root'
MAIN = "smol"
OTHER = "smol-b"
# cooldown_s is not a default: status shows it, so the spec's policy is seen to arrive.
POLICY = ThreadPolicy(
    max_threads=2, cores=2, collapse_factor=50.0, explore_first_s=1e6, cooldown_s=7.0
)


#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    model_id=MAIN,
    n_ctx=2048,
    n_batch=64,
    n_seq_max=2,
    prefix="lmt",
    n_threads=2,
    threads=POLICY,
    # Nothing is saved (prompts stay under n_ctx): a short step that starts
    # beside the daemon's own save or copy runs on half the threads
    # (threads.py), and these tests read the count of steps that run alone.
    policy=CachePolicy(min_tokens=4096, cold_min_tokens=4096),
    siblings={OTHER: {}},
)


@pytest.fixture
def board(tree: WorkerTree) -> Iterator[ThreadBoard]:
    """This process on the daemon's board (a slot, not busy), once no worker
    counts as busy any more (an earlier test's marks linger a little)."""
    with ThreadBoard(thread_board_path(tree.registry.root)) as b:
        wait_until(lambda: b.busy_workers(time.monotonic()) == 0, "the board to be quiet")
        yield b


def threads_of(snap: WorkerSnapshot | None) -> ThreadStatus:
    assert snap is not None, "no status published"
    assert snap.threads is not None, "the worker reports no thread status"
    return snap.threads


def expected_spin() -> SpinSetting:
    # The workers inherit this environment: llamad's own bound unless the
    # operator chose a spin policy.
    env = os.environ
    ours = env.get("LLAMAD_GOMP_SPINCOUNT")
    if "OMP_WAIT_POLICY" in env or ("GOMP_SPINCOUNT" in env and env["GOMP_SPINCOUNT"] != ours):
        return SpinSetting.OPERATOR
    return SpinSetting.BOUNDED


def short_request(w: WorkerClient, i: int) -> ThreadStatus:
    """A request of a few decodes, then the worker's thread status after it
    (the status op: a snapshot taken between ticks, after the last one)."""
    got = w.complete(prompt_text(i, words=12), max_tokens=2, **GREEDY)
    assert got.generated
    return threads_of(w.status_from_loop())


def test_status_reports_threads_budget_and_fallbacks(tree: WorkerTree, board: ThreadBoard) -> None:
    w = tree.client(MAIN)
    t = short_request(w, 1)
    # The spec's policy reached the worker, and alone it decodes on both cores.
    assert (t.max_threads, t.cores, t.cooldown_s) == (2, 2, POLICY.cooldown_s)
    assert (t.busy_workers, t.budget, t.ceiling) == (1, 2, 2)
    assert t.threads == 2
    assert (t.fallback, t.fallbacks, t.collapses, t.last_collapse) == (False, 0, 0, None)
    # The board (read without asking the worker) says the same, and the spin.
    snap = wait_until(
        lambda: (s := w.status()) is not None and threads_of(s).threads == 2 and s,
        "the board to show the last step",
    )
    assert snap.spin is expected_spin()
    assert w.status_from_loop().spin is expected_spin()


def test_another_worker_marked_busy_on_the_board_halves_the_budget(
    tree: WorkerTree, board: ThreadBoard
) -> None:
    w = tree.client(MAIN)
    board.mark_busy(time.monotonic() + 600)
    t = short_request(w, 2)
    assert (t.busy_workers, t.budget, t.threads) == (2, 1, 1)
    assert (t.fallback, t.fallbacks) == (False, 0), "the budget is not a fallback"
    # The other worker is gone (its slot unlocked): both cores again.
    board.close()
    t = short_request(w, 3)
    assert (t.busy_workers, t.budget, t.threads) == (1, 2, 2)


def test_two_busy_workers_take_one_thread_each(tree: WorkerTree, board: ThreadBoard) -> None:
    main, other = tree.client(MAIN), tree.client(OTHER)
    # A long prefill keeps the other worker busy (about 30 ticks of 64 rows).
    long_prompt = other.tokenize(prompt_text(4, words=1500), add_special=False)[:1900]
    stream = other.infer(long_prompt, max_tokens=1, **GREEDY)

    def other_prefilling() -> bool:
        snap = tree.status(OTHER)
        return snap is not None and snap.busy_since is not None and snap.status.pending_len > 0

    wait_until(other_prefilling, "the other worker's prefill to start")
    mine = short_request(main, 5)
    theirs = tree.status(OTHER)
    assert theirs is not None and theirs.status.pending_len > 0, (
        "the other worker finished its prefill before this one decoded: make it longer"
    )
    assert (mine.busy_workers, mine.budget, mine.threads) == (2, 1, 1)

    # The other worker sees this one too while it decodes (a worker left with
    # no request clears its mark at once: this one keeps generating).
    def other_sees_two() -> ThreadStatus | None:
        t = threads_of(tree.status(OTHER))
        return t if t.busy_workers == 2 else None

    with main.infer(
        prompt_text(6, words=12), max_tokens=100_000, grammar=ENDLESS, **GREEDY
    ) as busy:
        seen = wait_until(other_sees_two, "the other worker to see two busy workers", timeout=30)
        busy.cancel()
    assert (seen.budget, seen.threads) == (1, 1)
    list(stream)
    assert stream.result is not None
