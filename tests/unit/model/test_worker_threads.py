"""The worker's thread governance, without a model (SPEC M14): the spec's
ThreadPolicy (validated, defaulted, carried as msgpack), the board's place,
and the status snapshot that reports the governor and the spin setting."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest

from llamad.actors import Registry
from llamad.errors import ConfigError
from llamad.llama_ffi.options import ContextOptions
from llamad.llama_ffi.spin import SpinSetting, spin_setting
from llamad.model.config import WorkerConfig
from llamad.model.results import WorkerPhase, WorkerStatus
from llamad.model.status_board import StatusBoard, WorkerSnapshot, read_status
from llamad.model.thread_board import ThreadBoard
from llamad.model.threads import ThreadGovernor, ThreadPolicy, available_cores
from llamad.model.worker_client import WorkerClient
from llamad.model.worker_parts import WorkerParts, thread_board_path
from llamad.model.worker_proc import WorkerProcess
from llamad.model.worker_spec import WorkerSpec
from llamad.testing import wait_until
from stub_worker_parts import stub_parts

pytestmark = pytest.mark.timeout(60)

SIZES: dict[str, int] = {"n_ctx": 256, "n_batch": 32, "n_seq_max": 1}


def spec(*, n_threads: int = 1, n_threads_batch: int = 1, **kw: Any) -> WorkerSpec:
    fields: dict[str, Any] = {
        "model_id": "smol",
        "model_path": "/models/smol.gguf",
        "context": ContextOptions(
            **SIZES,
            n_ubatch=32,
            kv_unified=True,
            n_threads=n_threads,
            n_threads_batch=n_threads_batch,
        ),
        "worker": WorkerConfig(**SIZES),
        **kw,
    }
    return WorkerSpec(**fields)


def over_the_wire(s: WorkerSpec) -> WorkerSpec:
    wire = msgpack.unpackb(msgpack.packb(s.to_wire(), use_bin_type=True), raw=False)
    return WorkerSpec.from_wire(wire)


# -- the spec's policy ----------------------------------------------------------------


def test_without_a_policy_the_worker_governs_up_to_the_contexts_threads_on_its_cores() -> None:
    s = spec(n_threads=1, n_threads_batch=2)
    assert s.threads is None
    policy = s.thread_policy()
    assert policy.max_threads == 2  # the larger of the context's two counts
    assert policy.cores == available_cores()
    assert policy == ThreadPolicy(max_threads=2)
    # "No policy" travels as such: the worker makes the default on its own CPUs.
    assert over_the_wire(s).threads is None


def test_a_thread_policy_round_trips_through_msgpack_with_the_spec() -> None:
    policy = ThreadPolicy(
        max_threads=2,
        cores=3,
        collapse_factor=4.0,
        window=16,
        settle_steps=0,
        explore_first_s=600.0,
        busy_linger_s=0.25,
    )
    original = spec(n_threads=2, n_threads_batch=2, threads=policy)
    back = over_the_wire(original)
    assert back == original
    assert back.threads == policy
    assert back.thread_policy() is back.threads


def test_a_policy_that_disagrees_with_the_contexts_threads_is_refused() -> None:
    with pytest.raises(ConfigError) as exc:
        spec(n_threads=1, n_threads_batch=1, threads=ThreadPolicy(max_threads=2))
    assert exc.value.details["field"] == "threads.max_threads"
    with pytest.raises(ConfigError) as exc:
        spec(threads={"max_threads": 1})
    assert exc.value.details["field"] == "threads"


@pytest.mark.parametrize(
    ("expected", "threads"),
    [
        ("threads", 3),
        ("threads.max_threads", {}),
        ("threads.bogus", {"max_threads": 1, "bogus": 1}),
        ("threads.window", {"max_threads": 1, "window": 0}),
        ("threads.probe_gain", {"max_threads": 1, "probe_gain": 1.5}),
        ("threads.max_threads", {"max_threads": 2}),
    ],
)
def test_a_bad_policy_on_the_wire_is_refused_naming_the_field(
    expected: str, threads: object
) -> None:
    wire = spec().to_wire()
    wire["threads"] = threads
    with pytest.raises(ConfigError) as exc:
        WorkerSpec.from_wire(wire)
    assert exc.value.details["field"] == expected


# -- the board's place ------------------------------------------------------------------


def test_every_worker_of_a_registry_shares_one_board_file(tmp_path: Path) -> None:
    root = Registry(tmp_path / "reg").root
    a = spec(registry_root=str(root))
    b = spec(model_id="other", registry_root=str(root))
    assert thread_board_path(Registry(a.registry).root) == thread_board_path(
        Registry(b.registry).root
    )
    assert thread_board_path(root) == root / "threads.board"


# -- status -------------------------------------------------------------------------------


def test_a_snapshot_with_thread_status_and_spin_round_trips_through_the_board(
    tmp_path: Path,
) -> None:
    now = [100.0]
    policy = ThreadPolicy(max_threads=2, cores=2, explore_first_s=1e6)
    governor = ThreadGovernor(policy, clock=lambda: now[0])
    for _ in range(8):  # a baseline at 2 threads...
        governor.threads_for(1)
        governor.record(1, 0.010)
    for _ in range(2):  # ...and a collapse (a short step's, confirmed by the next)
        governor.threads_for(1)
        governor.record(1, 0.500)
    status = governor.status()
    assert status.fallback and status.last_collapse is not None
    snap = WorkerSnapshot(
        model_id="smol",
        pid=1,
        instance="i",
        seq=1,
        at=1.0,
        status=WorkerStatus(
            phase=WorkerPhase.IDLE,
            pending_len=0,
            queue_depth=0,
            active_sequences=0,
            free_sequences=1,
            sessions=0,
            kv_cells_used=0,
            ticks=9,
        ),
        threads=status,
        spin=SpinSetting.BOUNDED,
    )
    board = StatusBoard(tmp_path / "w.status")
    board.publish(snap)
    back = read_status(board.path)
    board.close()
    assert back == snap
    assert back is not None and back.threads is not None
    assert back.threads.fallbacks == 1 and back.threads.ceiling == 1
    assert back.spin is SpinSetting.BOUNDED


class Running:
    def __init__(self, proc: WorkerProcess, client: WorkerClient) -> None:
        self.proc = proc
        self.client = client
        ready = threading.Event()
        self.thread = threading.Thread(target=proc.serve, kwargs={"ready": ready.set})
        self.thread.start()
        assert ready.wait(30), "the worker never reported ready"

    def stop(self) -> None:
        self.client.close()
        self.proc.actor.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive()


def governed_stub_parts(spec: WorkerSpec) -> WorkerParts:
    """The stub parts with a governor on the registry's thread board (what
    ``llama_parts`` adds; the stub backend itself does not ask it)."""
    parts = stub_parts(spec)
    board = ThreadBoard(thread_board_path(Registry(spec.registry).root))
    parts.closers.append(board.close)
    parts.threads = ThreadGovernor(spec.thread_policy(), board=board)
    return parts


def run_governed(policy: ThreadPolicy) -> Running:
    root = Path(tempfile.mkdtemp(prefix="lwt-", dir="/tmp"))
    s = spec(
        model_id="stub",
        n_threads=2,
        n_threads_batch=2,
        threads=policy,
        registry_root=str(root),
        parts=f"{__name__}:governed_stub_parts",
    )
    return Running(WorkerProcess(s), WorkerClient("stub", registry=Registry(root)))


@pytest.fixture
def governed() -> Iterator[Running]:
    r = run_governed(ThreadPolicy(max_threads=2, cores=2))
    try:
        yield r
    finally:
        r.stop()


def test_a_worker_left_without_requests_gives_its_cores_back_at_once() -> None:
    # A linger far longer than the test: only the idle worker's own release
    # can clear its mark (another worker's next prefill would get 1 thread).
    r = run_governed(ThreadPolicy(max_threads=2, cores=2, busy_linger_s=600.0))
    try:
        governor = r.proc.parts.threads
        assert governor is not None
        with ThreadBoard(thread_board_path(r.proc.registry.root)) as other:
            governor.threads_for(1)  # the loop waits in poll: no request, no tick
            governor.record(1, 0.01)
            assert other.busy_workers(time.monotonic()) == 1
            r.client.status_from_loop()  # wakes the loop: one idle tick
            # The loop answers the call before its tick releases the mark: on a
            # loaded machine the reply can arrive first. Still far inside the
            # linger, which alone would clear it after 600 s.
            wait_until(
                lambda: other.busy_workers(time.monotonic()) == 0,
                "the idle worker's mark released",
                timeout=30,
            )
    finally:
        r.stop()


def test_status_reports_the_governor_and_the_spin_setting(governed: Running) -> None:
    governor = governed.proc.parts.threads
    assert governor is not None
    # A worker marked busy on the same board halves the budget.
    with ThreadBoard(thread_board_path(governed.proc.registry.root)) as other:
        other.mark_busy(1e12)
        governor.threads_for(1)
        governor.record(1, 0.01)
        snap = governed.client.status_from_loop()  # the op, through the actor
    assert snap.threads is not None
    assert snap.threads == governor.status()
    assert (snap.threads.busy_workers, snap.threads.budget, snap.threads.threads) == (2, 1, 1)
    assert (snap.threads.cores, snap.threads.max_threads) == (2, 2)
    assert snap.spin is spin_setting()
    # The loop publishes the same on its board once it has served the op.
    board = governed.proc.board
    assert board is not None
    deadline = time.monotonic() + 30
    while True:
        published = read_status(board.path)
        if published is not None and published.threads == snap.threads:
            break
        assert time.monotonic() < deadline, f"the board still shows {published}"
        time.sleep(0.01)
    assert published.spin is snap.spin
