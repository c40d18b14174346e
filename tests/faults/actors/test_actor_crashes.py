"""SIGKILL on either side of a conversation: callers and streams fail at once, then recover."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from llamad.actors import Client, Registry
from llamad.errors import Unavailable, WorkerCrashed
from llamad.testing.toy_actor import ToyProcess, spawn_toy

pytestmark = pytest.mark.timeout(120)

CRASH_BOUND_S = 1.0  # SPEC A3


def kill_later(pid: int, delay: float) -> tuple[threading.Timer, list[float]]:
    """SIGKILL ``pid`` after ``delay``; the list receives the kill's monotonic time."""
    killed_at: list[float] = []

    def fire() -> None:
        killed_at.append(time.monotonic())
        os.kill(pid, signal.SIGKILL)

    timer = threading.Timer(delay, fire)
    timer.start()
    return timer, killed_at


def crash_latency(blocked: Callable[[], object], pid: int) -> tuple[BaseException, float]:
    timer, killed_at = kill_later(pid, 0.3)
    try:
        blocked()
    except BaseException as exc:
        raised_at = time.monotonic()
        timer.join()
        return exc, raised_at - killed_at[0]
    finally:
        timer.join()
    raise AssertionError("the blocked call returned normally")


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "reg")


@pytest.fixture
def toy(registry: Registry) -> Iterator[ToyProcess]:
    with spawn_toy("--name", "toy", "--registry", str(registry.root)) as proc:
        yield proc


@pytest.mark.parametrize(
    ("op", "body"), [("hang", {}), ("sleep", {"s": 30})], ids=["idle-actor", "busy-actor"]
)
def test_call_blocked_on_a_sigkilled_actor_gets_worker_crashed_within_1s(
    toy: ToyProcess, registry: Registry, op: str, body: dict[str, object]
) -> None:
    with Client(name="toy", registry=registry, timeout=60) as c:
        c.connect()
        exc, latency = crash_latency(lambda: c.call(op, body), toy.pid)
    assert isinstance(exc, WorkerCrashed), exc
    assert exc.details["pid"] == toy.pid
    assert latency <= CRASH_BOUND_S


def test_connection_watch_detects_a_sigkilled_remote_style_actor_within_1s() -> None:
    with (
        spawn_toy("--endpoint", "tcp://127.0.0.1:0", "--no-register") as toy,
        Client(toy.endpoint, timeout=60, watch="connection") as c,
    ):
        c.connect()
        exc, latency = crash_latency(lambda: c.call("hang"), toy.pid)
    assert isinstance(exc, WorkerCrashed), exc
    assert exc.details["reason"] == "connection lost"
    assert latency <= CRASH_BOUND_S


def test_stream_consumer_gets_a_terminal_worker_crashed(
    toy: ToyProcess, registry: Registry
) -> None:
    with Client(name="toy", registry=registry, timeout=60) as c:
        stream = c.stream("ticks", {"n": 1_000_000, "interval": 0.02})
        assert next(stream).body["i"] == 0
        exc, latency = crash_latency(lambda: [None for _ in stream], toy.pid)
        assert isinstance(exc, WorkerCrashed)
        assert stream.error is exc and stream.finished
        assert list(stream) == []  # exactly one terminal: nothing after it
    assert latency <= CRASH_BOUND_S


def test_after_a_crash_calls_fail_fast_until_the_actor_is_back(
    toy: ToyProcess, registry: Registry
) -> None:
    with Client(name="toy", registry=registry, timeout=60, connect_timeout=30) as c:
        assert c.call("pid") == toy.pid
        toy.kill()
        started = time.monotonic()
        with pytest.raises(Unavailable):
            c.call("echo", 1)
        # Far below connect_timeout: the registry knows nobody serves the name.
        assert time.monotonic() - started < 10
        with spawn_toy("--name", "toy", "--registry", str(registry.root)) as again:
            assert c.call("pid") == again.pid


def test_ipc_endpoint_client_fails_fast_while_nobody_listens(tmp_path: Path) -> None:
    endpoint = f"ipc://{tmp_path}/toy.sock"
    args = ("--endpoint", endpoint, "--no-register")
    with Client(endpoint, timeout=60, connect_timeout=30) as c:
        with spawn_toy(*args) as first:
            assert c.call("pid") == first.pid
        assert Path(endpoint[len("ipc://") :]).exists()  # a SIGKILLed actor leaves its file
        started = time.monotonic()
        with pytest.raises(Unavailable):
            c.call("echo", 1)
        assert time.monotonic() - started < 10
        with spawn_toy(*args) as second:
            assert c.call("pid") == second.pid


def test_a_crash_while_idle_is_noticed_before_the_next_call(
    toy: ToyProcess, registry: Registry
) -> None:
    with Client(name="toy", registry=registry, timeout=60) as c:
        c.connect()
        toy.kill()
        with spawn_toy("--name", "toy", "--registry", str(registry.root)) as again:
            # The new call must go to the new actor, not fail as if it had been
            # in flight when the old one died.
            assert c.call("pid") == again.pid


CLIENT_SCRIPT = """
import sys, time
from llamad.actors import Client, Registry
c = Client(name="toy", registry=Registry(sys.argv[1]))
s = c.stream("ticks", {"n": 1000000, "interval": 0.02})
next(s)
print("STREAMING", flush=True)
time.sleep(120)
"""


def test_a_killed_client_process_has_its_streams_cancelled(
    toy: ToyProcess, registry: Registry
) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CLIENT_SCRIPT, str(registry.root)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        # structlog's default output shares stdout: skip log lines.
        while (line := child.stdout.readline()) and line.strip() != "STREAMING":
            pass
        assert line.strip() == "STREAMING"
        child.kill()
        child.wait()
        with Client(name="toy", registry=registry, timeout=30) as c:
            deadline = time.monotonic() + 30
            while c.call("cancels") != ["peer_died"]:
                assert time.monotonic() < deadline, c.call("cancels")
                time.sleep(0.02)
            assert c.call("$info")["peers"] == 1
    finally:
        child.kill()
        child.wait()
