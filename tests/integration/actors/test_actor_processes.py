"""The runtime between real processes: a toy actor child, clients in this and other processes."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from llamad.actors import Client, Registry
from llamad.errors import LlamadError, Unavailable
from llamad.testing.toy_actor import ToyProcess, client_workload, spawn_toy
from wakeups import voluntary_switches

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(params=["ipc", "tcp"])
def toy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ToyProcess]:
    endpoint = f"ipc://{tmp_path}/toy.sock" if request.param == "ipc" else "tcp://127.0.0.1:0"
    with spawn_toy("--endpoint", endpoint, "--no-register") as proc:
        yield proc


def test_call_cast_and_stream_between_processes(toy: ToyProcess) -> None:
    with Client(toy.endpoint, timeout=30) as c:
        assert c.connect().pid == toy.pid
        assert c.call("echo", {"x": [1, "two", b"3"]}) == {"x": [1, "two", b"3"]}
        with pytest.raises(LlamadError, match="boom"):
            c.call("fail")
        assert c.call("pid") == toy.pid
        stream = c.stream("count", {"n": 1000})
        assert [m.body["i"] for m in stream] == list(range(1000))
        assert stream.result == {"n": 1000}
        with Client(toy.endpoint, timeout=30) as other:
            timer = threading.Timer(0.1, other.cast, ("publish", {"key": "k", "value": "v"}))
            timer.start()
            assert c.call("wait", {"key": "k", "timeout": 30}) == {"hit": True, "value": "v"}
            timer.join()


def test_a_long_wait_sleeps_until_its_answer_instead_of_waking_every_tick(
    tmp_path: Path,
) -> None:
    """A call the actor holds for 1.5 s: the waiting thread wakes a few times
    (the first tick's recv, then one poll over the socket and the actor's
    pidfd), not once per ``CRASH_CHECK_S`` (15 times; voluntary context
    switches, which the load beside the test does not add to). What a held
    wait costs a machine decoding beside it (the front's supervisor watch
    woke 10 times a second); the actor's death still ends such a wait at
    once (tests/faults/actors/test_actor_crashes.py kills it 0.3 s in)."""
    with (
        spawn_toy("--endpoint", f"ipc://{tmp_path}/toy.sock", "--no-register") as toy,
        Client(toy.endpoint, timeout=30) as c,
        Client(toy.endpoint, timeout=30) as other,
    ):
        c.connect()
        other.connect()
        timer = threading.Timer(1.5, other.cast, ("publish", {"key": "k", "value": "v"}))
        # Started before the count: starting a thread waits for it to run and
        # hands it the GIL, a few more switches on a loaded machine (up to 6
        # with a hog per core) that say nothing about the wait.
        timer.start()
        before = voluntary_switches(tid=threading.get_native_id())
        try:
            assert c.call("wait", {"key": "k", "timeout": 30}) == {"hit": True, "value": "v"}
            woken = voluntary_switches(tid=threading.get_native_id()) - before
        finally:
            timer.join()
    assert woken <= 6, f"the waiting thread woke {woken} times in 1.5 s"


def test_large_blobs_cross_intact(toy: ToyProcess) -> None:
    payload = os.urandom(8 << 20)
    with Client(toy.endpoint, timeout=60) as c:
        reply = c.request("echo", None, blobs=[payload, b""])
        assert bytes(reply.blobs[0]) == payload
        assert bytes(reply.blobs[1]) == b""


@pytest.mark.slow
def test_sixteen_client_processes_call_and_stream_concurrently(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with (
        spawn_toy("--endpoint", f"ipc://{tmp_path}/toy.sock", "--no-register") as toy,
        ProcessPoolExecutor(16, mp_context=ctx) as pool,
    ):
        futures = [pool.submit(client_workload, toy.endpoint, 100, 300, tag) for tag in range(16)]
        results = [f.result(timeout=100) for f in futures]
        for result in results:
            assert result["echoed"] == list(range(100))
            assert result["seen"] == list(range(300))
            assert result["result"] == {"n": 300}
        with Client(toy.endpoint, timeout=30) as c:
            info = c.call("$info")
            assert info["stats"]["handler_failures"] == 0
            assert info["peers"] == 1  # the pool's clients said goodbye


def test_registered_actor_restart_is_followed_by_name(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "reg")
    args = ("--name", "toy", "--registry", str(registry.root))
    client = Client(name="toy", registry=registry, timeout=30, connect_timeout=10)
    try:
        with spawn_toy(*args) as first:
            before = client.connect()
            assert before.pid == first.pid
            assert first.stop() == 0
        assert registry.lookup("toy") is None
        with pytest.raises(Unavailable):
            client.call("echo", 1)
        with spawn_toy(*args) as second:
            assert client.call("echo", "again") == "again"
            after = client.server
            assert after is not None
            assert after.pid == second.pid and after.instance != before.instance
    finally:
        client.close()


def test_sigterm_stops_cleanly_and_fails_open_calls_with_unavailable(tmp_path: Path) -> None:
    registry = Registry(tmp_path / "reg")
    with spawn_toy("--name", "toy", "--registry", str(registry.root)) as toy:
        errors: list[BaseException] = []
        with Client(name="toy", registry=registry, timeout=30) as c:
            c.connect()

            def call() -> None:
                try:
                    c.call("hang")
                except BaseException as exc:
                    errors.append(exc)

            caller = threading.Thread(target=call)
            caller.start()
            deadline = time.monotonic() + 30
            with Client(name="toy", registry=registry, timeout=30) as probe:
                while probe.call("$info")["open"] < 1:
                    assert time.monotonic() < deadline
                    time.sleep(0.01)
            assert toy.stop() == 0
            caller.join(30)
        assert [type(e) for e in errors] == [Unavailable]
        assert registry.read("toy") is None


def test_sigterm_right_after_ready_stops_the_toy_cleanly(tmp_path: Path) -> None:
    # READY is printed only once SIGTERM is wired to a clean stop.
    registry = Registry(tmp_path / "reg")
    for _ in range(3):
        with spawn_toy("--name", "toy", "--registry", str(registry.root)) as toy:
            assert toy.stop() == 0
