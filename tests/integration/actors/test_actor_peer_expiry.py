"""Clients whose process the actor cannot watch are released once gone (issue 17).

A toy actor child with a short idle window (``--peer-idle-s``), reached over
ipc and over tcp. Clients introduce themselves as processes of another host
(a boot id that is not this machine's), so no pidfd watches them: what
releases them is the idle check (``actors/peers.py``), a ``PING`` the socket
can no longer route once their connection closed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import structlog
import zmq

from foreign_peers import ForeignClient, foreign_dealer
from llamad.actors import Client
from llamad.actors.aio_client import AsyncActorClient
from llamad.actors.wire import PROTOCOL_VERSION, Kind
from llamad.testing import wait_until
from llamad.testing.toy_actor import ToyProcess, spawn_toy

pytestmark = pytest.mark.timeout(180)

IDLE_S = 0.3
CHURN = 300
SUPPORT = Path(__file__).resolve().parents[2] / "support"


@pytest.fixture(params=["ipc", "tcp"])
def toy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ToyProcess]:
    endpoint = f"ipc://{tmp_path}/toy.sock" if request.param == "ipc" else "tcp://127.0.0.1:0"
    with spawn_toy("--endpoint", endpoint, "--no-register", "--peer-idle-s", str(IDLE_S)) as proc:
        yield proc


def test_gone_foreign_peers_are_released_and_a_live_idle_one_stays(toy: ToyProcess) -> None:
    with (
        Client(toy.endpoint, timeout=30) as watcher,
        ForeignClient(toy.endpoint, timeout=30, client_name="remote") as live,
    ):
        assert live.call("echo", "hello") == "hello"
        baseline = watcher.call("$info")["peers"]
        assert baseline == 2

        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            # One that leaves a call and a stream open, then goes without BYE.
            pending = foreign_dealer(ctx, toy.endpoint, 0)
            pending.send(msgspec.msgpack.encode([PROTOCOL_VERSION, Kind.CALL, 2, "hang", {}]))
            pending.send(msgspec.msgpack.encode([PROTOCOL_VERSION, Kind.STREAM, 3, "hold", {}]))
            wait_until(lambda: watcher.call("$info")["open"] == 2, "the open requests", 30)
            pending.close(0)
            # Churn: handshakes from another host, each closed without BYE.
            for tag in range(1, CHURN + 1):
                foreign_dealer(ctx, toy.endpoint, tag).close(0)
        finally:
            ctx.term()

        info = wait_until(
            lambda: (i := watcher.call("$info"))["peers"] == baseline and i,
            "the peer count back to its baseline",
            60,
        )
        assert info["stats"]["peers_expired"] == CHURN + 1
        assert info["stats"]["peers_down"] == CHURN + 1
        assert info["open"] == 0
        assert sorted(watcher.call("cancels")) == ["idle_expired", "idle_expired"]

        # The live client has sent nothing since its first call: it is
        # PINGed (the watcher keeps talking, so the PINGs are the live
        # client's), and it stays.
        pinged = info["stats"]["pings"]
        wait_until(
            lambda: watcher.call("$info")["stats"]["pings"] >= pinged + 2,
            "two more PINGs to the live client",
            30,
        )
        assert watcher.call("$info")["peers"] == baseline
        assert live.call("echo", "still here") == "still here"
        after = watcher.call("$info")["stats"]
        assert (after["peers_down"], after["peers_expired"]) == (CHURN + 1, CHURN + 1)


def test_both_clients_drop_pings_quietly_and_keep_working(toy: ToyProcess) -> None:
    async def idle_async_client(watcher: Client) -> str:
        aio = AsyncActorClient(toy.endpoint, timeout=30)
        try:
            assert await aio.call("echo", "first") == "first"
            pinged = watcher.call("$info")["stats"]["pings"]
            # The sync client and this one sit quiet: both are PINGed.
            while watcher.call("$info")["stats"]["pings"] < pinged + 4:
                await asyncio.sleep(0.05)
            answer: str = await aio.call("echo", "after")
            return answer
        finally:
            aio.close()

    with structlog.testing.capture_logs() as logs, Client(toy.endpoint, timeout=30) as quiet:
        assert quiet.call("echo", "first") == "first"
        with Client(toy.endpoint, timeout=30) as watcher:
            assert asyncio.run(asyncio.wait_for(idle_async_client(watcher), 60)) == "after"
            assert quiet.call("echo", "after") == "after"
            stats = watcher.call("$info")["stats"]
    assert stats["peers_down"] == 1  # the async client's BYE, nothing expired
    assert stats["peers_expired"] == 0
    assert not [e for e in logs if e["event"] == "actor.client.bad_response"]


def test_a_remote_client_that_stops_answering_heartbeats_is_released_and_can_come_back(
    tmp_path: Path,
) -> None:
    """SIGSTOP stands for a host that went away without a FIN: its libzmq stops
    answering ZMTP heartbeats, the actor's closes the connection (3 s), and
    the idle check's PING then finds it gone. Resumed, the same client's next
    call is refused as from an unknown peer (handshake_required), and the
    client introduces itself again and gets its answer."""
    with (
        spawn_toy(
            "--endpoint", "tcp://127.0.0.1:0", "--no-register", "--peer-idle-s", "0.3"
        ) as toy,
        Client(toy.endpoint, timeout=30) as watcher,
    ):
        child = subprocess.Popen(
            [sys.executable, str(SUPPORT / "foreign_peers.py"), toy.endpoint],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdin is not None and child.stdout is not None
            while (line := child.stdout.readline()) != "READY\n":
                assert line, "the remote client exited before its call was answered"
            assert watcher.call("$info")["peers"] == 2
            os.kill(child.pid, signal.SIGSTOP)
            info = wait_until(
                lambda: (i := watcher.call("$info"))["peers"] == 1 and i,
                "the stopped client released",
                60,
            )
            assert info["stats"]["peers_expired"] == 1
            os.kill(child.pid, signal.SIGCONT)
            child.stdin.write("call\n")
            child.stdin.flush()
            while (line := child.stdout.readline()) != "ANSWERED\n":
                assert line, "the remote client exited instead of calling again"
            info = watcher.call("$info")
            assert info["peers"] == 2
            assert info["stats"]["rejected"] == {"bad_request": 1}  # handshake_required
        finally:
            os.kill(child.pid, signal.SIGCONT)
            child.kill()
            child.wait()
