"""A worker hands the C heap's free pages back after its load and once each
time it falls idle (``IDLE_TRIM_S``), never while a request is in flight
(SPEC P9: what a load or a request freed stays resident otherwise)."""

from __future__ import annotations

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
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_proc import IDLE_TRIM_S, WorkerProcess
from llamad.model.worker_spec import WorkerSpec
from llamad.testing.launcher import wait_until

pytestmark = pytest.mark.timeout(60)

BOUND_S = 30.0


class Trims:
    """Counts the trims, and notes any that ran while a request was in flight."""

    def __init__(self) -> None:
        self.proc: WorkerProcess | None = None
        self.times: list[float] = []
        self.busy = 0

    def __call__(self) -> None:
        assert self.proc is not None
        if self.proc.core.requests:
            self.busy += 1
        self.times.append(time.monotonic())


@pytest.fixture
def served() -> Iterator[tuple[WorkerProcess, WorkerClient, Trims]]:
    root = Path(tempfile.mkdtemp(prefix="lwt-", dir="/tmp"))
    sizes = {"n_ctx": 256, "n_batch": 32, "n_seq_max": 1}
    spec = WorkerSpec(
        model_id="stub",
        model_path="/nonexistent/stub.gguf",
        context=ContextOptions(**sizes, n_ubatch=32, kv_unified=True, n_threads=1),
        worker=WorkerConfig(**sizes, max_queue=4, policy=CachePolicy(min_tokens=4)),
        registry_root=str(root),
        parts="stub_worker_parts:stub_parts",
    )
    trims = Trims()
    proc = WorkerProcess(spec, release_heap=trims)
    trims.proc = proc
    client = WorkerClient("stub", registry=Registry(root))
    ready = threading.Event()
    thread = threading.Thread(target=proc.serve, kwargs={"ready": ready.set})
    thread.start()
    try:
        assert ready.wait(BOUND_S), "the worker never reported ready"
        yield proc, client, trims
    finally:
        client.close()
        proc.actor.request_stop()
        thread.join(BOUND_S)


def test_a_worker_trims_after_its_load_and_again_after_each_idle_spell(
    served: tuple[WorkerProcess, WorkerClient, Trims],
) -> None:
    _, client, trims = served
    wait_until(lambda: len(trims.times) == 1, "the trim after the load", BOUND_S)
    client.status_from_loop()  # answered by the loop, not a request: no new spell
    asked = time.monotonic()
    client.complete("abcdefgh", max_tokens=4, temperature=0.0)
    wait_until(lambda: len(trims.times) == 2, "the trim once the request ended", BOUND_S)
    # After an idle moment since the request's last tick, not at once.
    assert trims.times[1] >= asked + IDLE_TRIM_S
    client.complete("abcdefgh", max_tokens=4, temperature=0.0)
    wait_until(lambda: len(trims.times) == 3, "the trim after the next request", BOUND_S)
    assert trims.busy == 0
