"""The same answer under any load (SPEC M19, issue 16), through the real worker process.

The worker runs as a daemon runs it: the default thread count (every core this
process may use) with the thread governor live, the default prefill chunk
size, live reuse on (finished requests leave idle entries holding cells), and
the ``deterministic`` model option. Each prompt is first run alone, one after
another; then all of them at once, under another cache salt (so every run is
cold), plain requests (each frees its cells when it ends, and later tokens of
the others land in freed cells), with a CPU hog per core beside the worker
(the governor moves between thread counts). Every greedy reply and every log-probability must be its
solo run's, bit for bit.

What each part of the guarantee rests on (docs/internals/model-worker.md,
"Numerics on the CPU"): llama.cpp patch 0001 keeps a sequence's cells in
position order; patch 0003 sums every attention row in groups of its own
cells, so neither the thread count the governor picks nor other sequences'
cells change a decode; ``deterministic`` turns off the tiled prompt path,
whose sums depend on the batch and on where cells sit.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import tolerances
from llamad.llama_ffi import default_threads
from llamad.model.results import CacheHitKind, Completion
from llamad.model.worker_client import WorkerClient
from worker_tree import WorkerTree

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(900)]

N_REQUESTS = 16
N_SEQ = 8  # 8 decode at once, the other 8 wait in the queue and take freed sequences
GREEDY: dict[str, Any] = {"temperature": 0.0, "max_tokens": 8, "logprobs": 2}

#: This module's worker tree (the ``tree`` fixture, conftest.py).
TREE: dict[str, Any] = dict(
    n_ctx=8192,
    n_batch=512,
    n_seq_max=N_SEQ,
    max_queue=32,
    n_threads=None,
    deterministic=True,
    prefix="lms",
)

TOPICS = [
    "the tides", "a lighthouse", "winter bread", "copper mines", "river boats", "paper lanterns",
    "mountain goats", "old clocks", "glass making", "salt marshes", "bee keeping", "stone bridges",
    "night trains", "kite flying", "wool dyeing", "tea gardens",
]  # fmt: skip


def _prompt(i: int) -> str:
    """Prompts of different lengths (~50 to ~280 tokens), so that prefills of
    several chunks interleave with other requests' decodes."""
    notes = (f"Note {j} about {TOPICS[i]}: it matters in town {j * 7 + i}." for j in range(2 + i))
    facts = " ".join(notes)
    return f"{facts}\nIn one sentence, what is {TOPICS[i]}?"


def _chat(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


@contextlib.contextmanager
def hogged() -> Iterator[None]:
    """A busy loop per core beside the worker, as the machine's other work."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(default_threads())
    ]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(10)


def _together(tree: WorkerTree, prompts: list[str], salt: str) -> list[Completion]:
    results: dict[int, Completion] = {}
    errors: list[BaseException] = []
    started = threading.Barrier(len(prompts))

    def run(i: int) -> None:
        try:
            # Queued behind 8 others on a loaded machine: the first event may be minutes away.
            with tree.client(timeout=600.0) as c:
                started.wait(60)
                results[i] = c.complete(
                    messages=_chat(prompts[i]), cache_salt=f"{salt}-{i}", **GREEDY
                )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(700)
    assert not errors, errors
    return [results[i] for i in range(len(prompts))]


def test_sixteen_concurrent_greedy_requests_under_load_reply_as_each_alone(
    tree: WorkerTree, worker: WorkerClient
) -> None:
    prompts = [_prompt(i) for i in range(N_REQUESTS)]
    # Alone, on a quiet machine, one after another.
    solo = [
        worker.complete(messages=_chat(p), cache_salt=f"solo-{i}", **GREEDY)
        for i, p in enumerate(prompts)
    ]
    with hogged():
        together = _together(tree, prompts, "together")
    assert all(r.cache_hit_kind is CacheHitKind.COLD for r in [*solo, *together])
    threads = worker.status().threads
    assert threads is not None and threads.max_threads == default_threads()  # the governor's pick
    if tolerances.exact():
        assert [r.generated for r in together] == [s.generated for s in solo]
        assert [r.logprobs for r in together] == [s.logprobs for s in solo]
    assert len({tuple(s.generated) for s in solo}) > N_REQUESTS // 2  # not one reply for all
