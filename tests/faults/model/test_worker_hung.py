"""A tick longer than decode_timeout_ms silences the worker's heartbeat: the
supervisor kills and restarts it, and the client of the hung request gets
``worker_crashed`` (SPEC M15)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamad.errors import WorkerCrashed
from llamad.llama_ffi.build_info import compute_backend
from llamad.supervisor.events import ChildHung
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

# One decode of this many prompt tokens on one CPU thread takes seconds (the
# default model runs ~2-9 ms per prompt token here), far past the timeout below.
LONG_PROMPT = 1000
DECODE_TIMEOUT_MS = 300


@pytest.fixture(scope="module")
def tree() -> Iterator[WorkerTree]:
    if compute_backend() != "cpu":
        pytest.skip("a GPU decodes the long prompt within the timeout")
    t = WorkerTree(
        n_ctx=2048,
        n_batch=1024,
        prefill_chunk_size=1024,
        n_seq_max=1,
        decode_timeout_ms=DECODE_TIMEOUT_MS,
        liveness_s=1.0,
        prefix="lmh",
    ).start()
    try:
        yield t
    finally:
        t.close()


def test_tick_past_decode_timeout_gets_the_worker_restarted(tree: WorkerTree) -> None:
    pid = tree.pid()
    seq = tree.sup.events.last_seq
    w = tree.client()
    prompt = w.tokenize(prompt_text(30, words=LONG_PROMPT))[:LONG_PROMPT]
    assert len(prompt) == LONG_PROMPT
    with pytest.raises(WorkerCrashed):
        w.complete(prompt, max_tokens=1, temperature=0.0)
    hung = [e for e in tree.sup.events.since(seq) if isinstance(e, ChildHung)]
    assert [e.pid for e in hung] == [pid]
    new = tree.wait_restarted(pid)
    # The restarted worker serves (an op that runs no decode).
    assert w.tokenize("still here") != []
    snap = tree.status()
    assert snap is not None and snap.pid == new
