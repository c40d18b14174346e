"""Remote clients of a real daemon's front are released once gone (issue 17).

One daemon for the module whose front listens on loopback TCP as a CURVE
server, with a short ``[security] peer_idle_s``. Its clients introduce
themselves as processes of another host (``foreign_peers``), so the front has
no process of theirs to watch: before the idle check, 500 such handshakes
closed without ``BYE`` left it with 502 peers for good, and so did a remote
client that crashed while idle.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from daemon_harness import EVENTUALLY, Daemon
from foreign_peers import ForeignClient, foreign_dealer
from llamad.actors import Client as ActorClient
from llamad.actors.curve import CurveClient, write_keypair
from llamad.testing import wait_until

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

IDLE_S = 0.5
CHURN = 200
BASELINE = 1  # the harness's own client of the front
SUPPORT = Path(__file__).resolve().parents[2] / "support"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The server's secret and public key files, and alice's (allowed) secret."""
    base = tmp_path_factory.mktemp("keys")
    (base / "clients").mkdir()
    server_secret, server_public = write_keypair(base, "server")
    alice_secret, _ = write_keypair(base / "clients", "alice")
    return server_secret, server_public, alice_secret


@pytest.fixture(scope="module")
def daemon(keys: tuple[Path, Path, Path]) -> Iterator[Daemon]:
    server_secret, server_public, alice_secret = keys
    d = Daemon({"smol": {}})
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    text = d.config.read_text()
    text = text.replace("[daemon]\n", f'[daemon]\nendpoint = "{endpoint}"\n', 1)
    text = text.replace(
        "[security]\n",
        f'[security]\ncurve_secret_key = "{server_secret}"\n'
        f'curve_client_keys = ["{alice_secret.parent}"]\n'
        f"peer_idle_s = {IDLE_S}\n",
        1,
    )
    d.config.write_text(text)
    d.endpoint = endpoint
    d._front = ActorClient(
        endpoint,
        timeout=EVENTUALLY,
        connect_timeout=5.0,
        curve=CurveClient.from_files(alice_secret, server_public),
    )
    try:
        d.start(wait_for=["smol"])
        yield d
        assert d.stop() == 0
    finally:
        d.cleanup()


@pytest.fixture
def alice(keys: tuple[Path, Path, Path]) -> CurveClient:
    _, server_public, alice_secret = keys
    return CurveClient.from_files(alice_secret, server_public)


def _info(daemon: Daemon) -> dict[str, Any]:
    info: dict[str, Any] = daemon.front.call("$info")
    return info


def _back_to(daemon: Daemon, peers: int) -> dict[str, Any]:
    return wait_until(
        lambda: (i := _info(daemon))["peers"] == peers and i,
        f"the front's peer count back to {peers}",
        60,
    )


def test_the_front_takes_its_idle_window_from_the_config(daemon: Daemon) -> None:
    assert _info(daemon)["peer_idle_s"] == IDLE_S


def test_a_remote_client_that_crashes_while_idle_is_released(
    daemon: Daemon, keys: tuple[Path, Path, Path]
) -> None:
    _, server_public, alice_secret = keys
    before = _back_to(daemon, BASELINE)
    child = subprocess.Popen(
        [
            sys.executable,
            str(SUPPORT / "foreign_peers.py"),
            daemon.endpoint,
            str(alice_secret),
            str(server_public),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        # Its log lines come first on the same stdout; EOF means it died.
        while (line := child.stdout.readline()) != "READY\n":
            assert line, "the remote client exited before its call was answered"
        assert _info(daemon)["peers"] == BASELINE + 1
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        after = _back_to(daemon, BASELINE)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert after["stats"]["peers_expired"] == before["stats"]["peers_expired"] + 1


def test_churn_leaves_the_table_at_its_baseline_and_a_live_idle_client_stays(
    daemon: Daemon, alice: CurveClient
) -> None:
    _back_to(daemon, BASELINE)
    with ForeignClient(
        daemon.endpoint, curve=alice, timeout=60, connect_timeout=60, client_name="remote"
    ) as live:
        live.call("$ping")
        before = _info(daemon)
        assert before["peers"] == BASELINE + 1
        ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            for tag in range(CHURN):
                foreign_dealer(ctx, daemon.endpoint, tag, alice).close(0)
        finally:
            ctx.term()
        after = _back_to(daemon, before["peers"])
        expired = after["stats"]["peers_expired"] - before["stats"]["peers_expired"]
        assert expired == CHURN
        # The live client has sent nothing since before the churn; it is
        # PINGed, and it stays (the harness's client keeps talking).
        pinged = after["stats"]["pings"]
        wait_until(lambda: _info(daemon)["stats"]["pings"] >= pinged + 2, "two more PINGs", 30)
        assert live.call("$ping")["name"] == "llamad.front"
        final = _info(daemon)
        assert final["peers"] == before["peers"]
        assert final["stats"]["peers_expired"] == after["stats"]["peers_expired"]
