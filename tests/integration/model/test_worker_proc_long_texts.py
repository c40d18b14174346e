"""Long texts against a real supervised worker and the real model (issue 17):
a prompt that cannot fit is refused by the vocabulary's bound before it is
tokenized, and a long text is tokenized off the loop while others are served."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from llamad.errors import ContextOverflow
from llamad.model.results import FinishReason
from llamad.model.worker_client import WorkerClient
from llamad.testing.launcher import wait_until
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

N_CTX = 512
#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(n_ctx=N_CTX, n_batch=128, n_seq_max=2, prefix="lml")

#: SmolLM2's longest token: a newline and 80 spaces.
LONGEST_TOKEN = 81


@pytest.fixture
def worker(tree: WorkerTree) -> Iterator[WorkerClient]:
    pid = tree.pid()
    w = tree.client()
    yield w
    # Still the same process, and it still serves.
    assert tree.pid() == pid
    ok = w.complete(prompt_text(1, words=8), max_tokens=2, temperature=0.0)
    assert ok.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)


def test_a_prompt_that_cannot_fit_is_refused_by_the_vocabulary_bound(
    worker: WorkerClient,
) -> None:
    too_long = N_CTX * LONGEST_TOKEN + 1
    for prompt in ["x" * too_long, "é" * (too_long // 2 + 1), "word " * ((16 << 20) // 5 - 1)]:
        with pytest.raises(ContextOverflow) as exc:
            worker.complete(prompt, max_tokens=2)
        # The bound's refusal (counted tokens would say "tokens", not "min_tokens").
        assert exc.value.details["min_tokens"] > N_CTX, exc.value.details
    with pytest.raises(ContextOverflow) as exc:
        worker.complete(messages=[{"role": "user", "content": "x" * too_long}], max_tokens=2)
    assert exc.value.details["min_tokens"] > N_CTX
    # Text the bound lets through is tokenized and counted.
    with pytest.raises(ContextOverflow) as exc:
        worker.complete("word " * 1000, max_tokens=2)
    assert "min_tokens" not in exc.value.details
    assert exc.value.details["tokens"] > N_CTX


def test_a_long_text_is_tokenized_while_others_are_served(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    text = "word " * ((8 << 20) // 5)  # seconds of tokenizing
    long_client, watcher = tree.client(), tree.client()
    with ThreadPoolExecutor(1) as pool:
        long: Future[list[int]] = pool.submit(long_client.tokenize, text)
        # The loop answers status while the text thread tokenizes...
        wait_until(lambda: watcher.status_from_loop().tokenizing == 1, "the text is tokenized")
        # ... and another client's generation, all before the long text is done.
        reply = worker.complete(prompt_text(2, words=8), max_tokens=2, temperature=0.0)
        assert reply.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert watcher.status_from_loop().tokenizing == 1
        assert not long.done()
        tokens = long.result(240)
    assert len(tokens) > 1_000_000
    assert watcher.status_from_loop().tokenizing == 0
