"""SPEC D5 over TCP: a real daemon on tcp://127.0.0.1 with CURVE keys.

One daemon for the module (the default model, one thread) whose front and
worker listen on loopback TCP as CURVE servers allowing one client key
(alice's, from a directory of ``*.pub`` files, as ``llamad keys generate``
writes them). Clients use the public :class:`llamad.Client` and the actors
client straight at the worker's TCP port. Beside it, a daemon asked to serve
TCP beyond loopback without keys refuses to start.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from daemon_harness import EVENTUALLY, GREEDY, Daemon, prompt_text
from llamad import AsyncClient, Client
from llamad.actors import Client as ActorClient
from llamad.actors.curve import CurveClient, read_key_file, write_keypair
from llamad.cli import main as cli
from llamad.daemon.main import EXIT_CONFIG
from llamad.errors import PermissionDenied
from llamad.front.wire import Route
from llamad.model.results import TokenEvent
from llamad.testing import daemon_command, scrubbed_env

pytestmark = [pytest.mark.model, pytest.mark.timeout(240)]

# Long enough that a client retrying a refused handshake would be seen
# hanging (pytest's timeout), never the reason a refusal arrives.
CONNECT_TIMEOUT = 120.0


@dataclass(frozen=True)
class Keys:
    server_secret: Path
    server_public: Path
    clients: Path
    alice_secret: Path
    mallory_secret: Path

    def client(self, secret: Path) -> CurveClient:
        return CurveClient.from_files(secret, self.server_public)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> Keys:
    base = tmp_path_factory.mktemp("keys")
    (base / "clients").mkdir()
    (base / "strangers").mkdir()
    server_secret, server_public = write_keypair(base, "server")
    alice_secret, _ = write_keypair(base / "clients", "alice")
    mallory_secret, _ = write_keypair(base / "strangers", "mallory")
    return Keys(server_secret, server_public, base / "clients", alice_secret, mallory_secret)


@pytest.fixture(scope="module")
def daemon(keys: Keys) -> Iterator[Daemon]:
    d = Daemon({"smol": {}})
    endpoint = f"tcp://127.0.0.1:{_free_port()}"
    text = d.config.read_text()
    text = text.replace("[daemon]\n", f'[daemon]\nendpoint = "{endpoint}"\n', 1)
    text = text.replace(
        "[security]\n",
        f'[security]\ncurve_secret_key = "{keys.server_secret}"\n'
        f'curve_client_keys = ["{keys.clients}"]\n',
        1,
    )
    # The same file is the client's configuration ([client] is read only by clients).
    text += (
        f'\n[client]\ncurve_secret_key = "{keys.alice_secret}"\n'
        f'curve_server_key = "{keys.server_public}"\n'
    )
    d.config.write_text(text)
    d.endpoint = endpoint
    # The harness's own front client, with alice's keys.
    d._front = ActorClient(
        endpoint, timeout=EVENTUALLY, connect_timeout=5.0, curve=keys.client(keys.alice_secret)
    )
    try:
        d.start(wait_for=["smol"])
        yield d
        assert d.stop() == 0
    finally:
        d.cleanup()


@pytest.fixture(scope="module")
def route(daemon: Daemon, keys: Keys) -> Route:
    route = daemon.route("smol")
    assert route.tcp_port is not None, "a tcp daemon's worker listens on tcp too"
    assert route.server_key == read_key_file(keys.server_public, "server")
    return route


@pytest.fixture(autouse=True)
def _no_user_config(monkeypatch: pytest.MonkeyPatch) -> None:
    # A plain client must be plain: no [client] keys from the environment.
    for key in [k for k in os.environ if k.startswith("LLAMAD_")]:
        monkeypatch.delenv(key)


def _worker_endpoint(route: Route) -> str:
    return f"tcp://127.0.0.1:{route.tcp_port}"


def _tcp_peers(pid: int, port: int) -> set[tuple[str, int]]:
    """The remote addresses of ``pid``'s established connections on local ``port``."""
    return {
        (c.raddr.ip, c.raddr.port)
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED and c.laddr.port == port and c.raddr
    }


def _my_tcp_ends() -> set[tuple[str, int]]:
    return {
        (c.laddr.ip, c.laddr.port)
        for c in psutil.Process().net_connections(kind="tcp")
        if c.status == psutil.CONN_ESTABLISHED
    }


def test_the_front_and_the_worker_listen_on_loopback_tcp_only(daemon: Daemon, route: Route) -> None:
    front_port = int(daemon.endpoint.rpartition(":")[2])
    listening = {
        (c.laddr.ip, c.laddr.port)
        for pid in (daemon.child_pid("llamad.front"), daemon.child_pid("model.smol"))
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    }
    assert listening == {("127.0.0.1", front_port), ("127.0.0.1", route.tcp_port)}


def test_an_allowed_key_streams_a_completion_over_tcp_from_the_worker(
    daemon: Daemon, keys: Keys, route: Route
) -> None:
    worker = daemon.child_pid("model.smol")
    with Client(
        daemon.endpoint, curve=keys.client(keys.alice_secret), connect_timeout=CONNECT_TIMEOUT
    ) as client:
        stream = client.infer("smol", prompt_text(1), max_tokens=4, **GREEDY)
        events = [e for e in stream if isinstance(e, TokenEvent)]
        assert len(events) == 4
        # The tokens came straight from the worker's CURVE endpoint to this process.
        assert _tcp_peers(worker, route.tcp_port) & _my_tcp_ends()
        assert [m.model_id for m in client.list_models()] == ["smol"]


def test_the_client_config_keys_are_used_by_the_cli(daemon: Daemon) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["--config", str(daemon.config), "models", "--json"])
    assert status == 0, err.getvalue()
    assert '"smol"' in out.getvalue()


def _refused(call: object) -> PermissionDenied:
    assert callable(call)
    with pytest.raises(PermissionDenied) as info:
        call()
    assert info.value.code == "permission_denied"
    return info.value


def test_an_unknown_key_is_refused_by_the_front_and_the_worker(
    daemon: Daemon, keys: Keys, route: Route
) -> None:
    mallory = keys.client(keys.mallory_secret)
    client = Client(daemon.endpoint, curve=mallory, connect_timeout=CONNECT_TIMEOUT)
    with client:
        _refused(client.list_models)
    actor = ActorClient(
        _worker_endpoint(route), curve=mallory, connect_timeout=CONNECT_TIMEOUT, timeout=60
    )
    with actor:
        _refused(lambda: actor.call("status", {}))
    _still_serving(daemon, keys)


def test_a_plain_client_is_refused_by_the_front_and_the_worker(
    daemon: Daemon, keys: Keys, route: Route
) -> None:
    client = Client(daemon.endpoint, connect_timeout=CONNECT_TIMEOUT)
    assert client.curve is None
    with client:
        _refused(client.list_models)
    actor = ActorClient(_worker_endpoint(route), connect_timeout=CONNECT_TIMEOUT, timeout=60)
    with actor:
        _refused(lambda: actor.call("status", {}))
    _still_serving(daemon, keys)


def test_an_allowed_key_trusting_another_server_is_refused(
    daemon: Daemon, keys: Keys, tmp_path: Path
) -> None:
    _, impostor = write_keypair(tmp_path, "impostor")
    wrong = CurveClient.from_files(keys.alice_secret, impostor)
    with Client(daemon.endpoint, curve=wrong, connect_timeout=CONNECT_TIMEOUT) as client:
        _refused(client.list_models)
    _still_serving(daemon, keys)


def test_the_asyncio_client_is_served_with_an_allowed_key_and_refused_without(
    daemon: Daemon, keys: Keys
) -> None:
    async def run() -> None:
        alice = keys.client(keys.alice_secret)
        async with AsyncClient(daemon.endpoint, curve=alice) as client:
            reply = await client.complete("smol", prompt_text(5), max_tokens=2, **GREEDY)
            assert reply.stats.completion_tokens == 2
        mallory = keys.client(keys.mallory_secret)
        async with AsyncClient(
            daemon.endpoint, curve=mallory, connect_timeout=CONNECT_TIMEOUT
        ) as client:
            with pytest.raises(PermissionDenied):
                await client.list_models()

    asyncio.run(run())


def _still_serving(daemon: Daemon, keys: Keys) -> None:
    with Client(daemon.endpoint, curve=keys.client(keys.alice_secret)) as client:
        reply = client.complete("smol", prompt_text(2), max_tokens=2, **GREEDY)
        assert reply.stats.completion_tokens == 2
    assert daemon.proc is not None and daemon.proc.poll() is None


def test_tcp_beyond_loopback_without_keys_is_refused_at_start(tmp_path: Path) -> None:
    config = tmp_path / "llamad.toml"
    config.write_text(
        f"""
[daemon]
endpoint = "tcp://0.0.0.0:{_free_port()}"
runtime_dir = "{tmp_path / "run"}"
state_dir = "{tmp_path / "state"}"
"""
    )
    proc = subprocess.run(
        daemon_command(config),
        capture_output=True,
        text=True,
        timeout=100,
        env=scrubbed_env(),
        check=False,
    )
    assert proc.returncode == EXIT_CONFIG, proc.stderr
    assert "daemon.endpoint" in proc.stderr
    assert "not on a loopback address" in proc.stderr
    assert "security.curve_secret_key" in proc.stderr
    assert not (tmp_path / "run").exists(), "refused before anything started"
