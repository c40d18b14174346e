"""What the daemon's front reads from a worker without asking it: when it last had
a request (``WorkerSnapshot.last_request_at``, for keep_alive) and how far its
model load has got (the load progress file, for ``load_model``'s stream)."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.actors import Registry
from llamad.cache.policy import CachePolicy
from llamad.llama_ffi import ContextOptions
from llamad.model.config import WorkerConfig
from llamad.model.status_board import (
    LoadProgressWriter,
    WorkerSnapshot,
    load_progress_path,
    read_load_progress,
    read_status,
    status_path,
)
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_proc import WorkerProcess
from llamad.model.worker_spec import WorkerSpec

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def served() -> Iterator[tuple[WorkerProcess, WorkerClient, Path]]:
    root = Path(tempfile.mkdtemp(prefix="lwi-", dir="/tmp"))
    sizes = {"n_ctx": 256, "n_batch": 32, "n_seq_max": 1}
    spec = WorkerSpec(
        model_id="stub",
        model_path="/nonexistent/stub.gguf",
        context=ContextOptions(**sizes, n_ubatch=32, kv_unified=True, n_threads=1),
        worker=WorkerConfig(**sizes, max_queue=4, policy=CachePolicy(min_tokens=4)),
        registry_root=str(root),
        parts="stub_worker_parts:stub_parts",
    )
    proc = WorkerProcess(spec)
    client = WorkerClient("stub", registry=Registry(root))
    ready = threading.Event()
    thread = threading.Thread(target=proc.serve, kwargs={"ready": ready.set})
    thread.start()
    try:
        assert ready.wait(30), "the worker never reported ready"
        yield proc, client, status_path(root, spec.actor_name)
    finally:
        client.close()
        proc.actor.request_stop()
        thread.join(30)


def _board(path: Path) -> WorkerSnapshot:
    snapshot = read_status(path)
    assert snapshot is not None
    return snapshot


def _stamp(client: WorkerClient) -> float | None:
    # The status op is answered between ticks with the snapshot the loop
    # publishes on the board; it is not a request itself.
    return client.status_from_loop().last_request_at


def test_last_request_at_is_none_until_a_request_then_follows_requests(
    served: tuple[WorkerProcess, WorkerClient, Path],
) -> None:
    _, client, board = served
    assert _board(board).last_request_at is None
    assert _stamp(client) is None  # status is not a request: keep_alive must not see it
    before = time.monotonic()
    client.complete("abcdefgh", max_tokens=4, temperature=0.0)
    first = _stamp(client)
    assert first is not None and first >= before
    assert _stamp(client) == first
    client.tokenize("abc")  # any op but status counts
    second = _stamp(client)
    assert second is not None and second > first
    deadline = time.monotonic() + 10
    while _board(board).last_request_at != second:  # the board shows the same
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_last_request_at_advances_while_a_request_runs(
    served: tuple[WorkerProcess, WorkerClient, Path],
) -> None:
    _, client, _ = served
    for _ in range(20):
        with client.infer("abcdefgh", max_tokens=240, temperature=0.0) as stream:
            events = iter(stream)
            next(events)
            during = client.status_from_loop()
            for _ in events:
                pass
        if during.status.pending_len == 0:
            continue  # answered after the request ended: says nothing, try again
        after = _stamp(client)
        assert during.last_request_at is not None and after is not None
        # The ticks that ran the request after `during` moved it on.
        assert after > during.last_request_at
        return
    pytest.fail("the status op was never answered while the request ran")


def test_load_progress_is_replaced_whole_and_removed_on_close(tmp_path: Path) -> None:
    path = load_progress_path(tmp_path, "model.x")
    assert read_load_progress(path) is None
    writer = LoadProgressWriter(path)
    assert writer(0.0) is True
    assert writer(0.004) is True  # under a 1 % step: not written
    progress = read_load_progress(path)
    assert progress is not None and progress.fraction == 0.0 and progress.pid == os.getpid()
    writer(0.5)
    writer(1.0)
    progress = read_load_progress(path)
    assert progress is not None and progress.fraction == 1.0
    assert [p.name for p in tmp_path.iterdir()] == ["model.x.load"]  # no temp file left
    writer.close()
    assert read_load_progress(path) is None


def test_load_progress_never_fails_the_load(tmp_path: Path) -> None:
    writer = LoadProgressWriter(tmp_path / "gone" / "model.x.load")
    assert writer(0.5) is True
