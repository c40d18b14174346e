"""Clients whose process the actor cannot watch are released once gone (issue 17).

A toy actor child with a short idle window (``--peer-idle-s``), reached over
ipc and over tcp. Clients introduce themselves as processes of another host
(a boot id that is not this machine's), so no pidfd watches them: what
releases them is the idle check (``actors/peers.py``), a ``PING`` the socket
can no longer route once their connection closed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq

from llamad.actors import Client
from llamad.actors.connection import Slot
from llamad.actors.testing import ToyProcess, spawn_toy
from llamad.actors.wire import PROTOCOL_VERSION, Hello, Kind, encode_envelope
from llamad.testing import wait_until

pytestmark = pytest.mark.timeout(180)

IDLE_S = 0.3
CHURN = 300
OTHER_HOST = "0e5c1d9a-0000-4000-8000-another-host"
ANY = msgspec.msgpack.Decoder()


@pytest.fixture(params=["ipc", "tcp"])
def toy(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ToyProcess]:
    endpoint = f"ipc://{tmp_path}/toy.sock" if request.param == "ipc" else "tcp://127.0.0.1:0"
    with spawn_toy("--endpoint", endpoint, "--no-register", "--peer-idle-s", str(IDLE_S)) as proc:
        yield proc


class ForeignClient(Client):
    """The real client, introducing itself as a process of another host."""

    def _hello(self) -> tuple[int, Slot, bytes]:
        cid, slot, _ = super()._hello()
        hello = Hello(os.getpid(), 1, OTHER_HOST, 1, "remote")
        return cid, slot, encode_envelope(Kind.HELLO, cid, "", hello)


def foreign_dealer(ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, tag: int) -> Any:
    """A bare DEALER that has completed a handshake as a process of another host."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, 30_000)
    sock.connect(endpoint)
    hello = Hello(100_000 + tag, tag, OTHER_HOST, 1, f"churn-{tag}")
    sock.send(msgspec.msgpack.encode([PROTOCOL_VERSION, Kind.HELLO, 1, "", hello]))
    version, kind, cid, _, _ = ANY.decode(sock.recv())
    assert (version, kind, cid) == (PROTOCOL_VERSION, Kind.REPLY, 1)
    return sock


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
