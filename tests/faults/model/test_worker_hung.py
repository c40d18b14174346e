"""A decode that runs past decode_timeout_ms is stopped under way (issue 21):
the abort check ends it between graph nodes before the heartbeat would judge
the tick hung, its request fails ``timeout``, and the same worker serves on
with a consistent context. A tick that cannot be stopped (a stopped process,
a call that never reaches a graph node) still silences the heartbeat: the
supervisor kills and restarts the worker (SPEC M15; ``test_worker_killed.py``'s
SIGSTOP case, ``tests/unit/model/test_worker_heartbeat.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamad.errors import RequestTimeout
from llamad.llama_ffi.build_info import compute_backend
from llamad.model.results import FinishReason
from llamad.supervisor.events import ChildHung
from worker_tree import WorkerTree, prompt_text

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(300)]

# One decode of this many prompt tokens on one CPU thread takes seconds (the
# default model runs ~2-9 ms per prompt token here), far past the timeout below.
LONG_PROMPT = 1000
DECODE_TIMEOUT_MS = 2000


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


def test_a_decode_past_decode_timeout_is_stopped_and_the_worker_serves_on(
    tree: WorkerTree,
) -> None:
    pid = tree.pid()
    seq = tree.sup.events.last_seq
    w = tree.client()
    prompt = w.tokenize(prompt_text(30, words=LONG_PROMPT))[:LONG_PROMPT]
    assert len(prompt) == LONG_PROMPT
    with pytest.raises(RequestTimeout) as exc:
        w.complete(prompt, max_tokens=1, temperature=0.0)
    assert exc.value.details["where"] == "decode"
    # The heartbeat never went silent: no restart, the same worker serves.
    assert [e for e in tree.sup.events.since(seq) if isinstance(e, ChildHung)] == []
    assert tree.pid() == pid
    short = w.tokenize(prompt_text(31, words=20))[:8]
    first = w.complete(short, max_tokens=4, temperature=0.0)
    assert first.finish_reason is FinishReason.LENGTH
    # Nothing of the stopped decode is left in the sequence it used.
    assert first.stats.prefill_tokens == len(short)
    snap = tree.status()
    assert snap is not None and snap.pid == pid
