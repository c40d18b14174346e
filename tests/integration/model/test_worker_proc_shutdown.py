"""SIGTERM: the worker saves what it holds, ends its requests ``cancelled``, tells
their clients, and exits 0; a restarted worker finds the shutdown saves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamad.model.results import CacheHitKind, FinishReason, TokenEvent
from worker_tree import WorkerTree, prompt_text, wait_until

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

ENDLESS = 'root ::= "la " root'


@pytest.fixture
def tree() -> Iterator[WorkerTree]:
    t = WorkerTree(n_seq_max=2, prefix="lmt").start()
    try:
        yield t
    finally:
        t.close()


def test_sigterm_saves_ends_requests_cancelled_and_exits_zero(tree: WorkerTree) -> None:
    w = tree.client()
    stream = w.infer(prompt_text(50), max_tokens=100_000, grammar=ENDLESS, temperature=0.0)
    events = iter(stream)
    for _ in range(3):
        assert isinstance(next(events), TokenEvent)
    name = tree.spec.actor_name
    tree.sup.terminate_child(name)  # SIGTERM, then the shutdown allowance
    list(events)
    result = stream.result
    assert result is not None and result.finish_reason is FinishReason.CANCELLED
    (info,) = [c for c in tree.sup.which_children() if c.id == name]
    assert info.last_exit is not None and info.last_exit.exit == "exit 0"
    assert not tree.board.exists()  # a clean stop removes its board

    tree.sup.restart_child(name)
    held = result.context_tokens[: result.committed_tokens]
    # The shutdown save holds the sequence as it stood: its tokens hit whole.
    again = wait_until(lambda: w.complete(held, max_tokens=1, temperature=0.0), "a reply")
    assert again.cache_hit_kind is CacheHitKind.EXACT
