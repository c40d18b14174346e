"""CURVE keys in the configuration: tcp beyond loopback only with them, key files checked."""

from __future__ import annotations

from pathlib import Path

import pytest

from config_helpers import Workspace, write_config
from llamad.actors.curve import CurveFiles, RemoteAccess, read_key_file, write_keypair
from llamad.config import ConfigError, client_curve, client_endpoint
from llamad.config.convert import curve_server

pytestmark = pytest.mark.timeout(60)

ENDPOINT = ("daemon", "endpoint")
SECRET = ("security", "curve_secret_key")
CLIENTS = ("security", "curve_client_keys")


class Keys:
    def __init__(self, root: Path) -> None:
        self.server_key, self.server_pub = write_keypair(root, "server")
        self.clients = root / "clients"
        self.clients.mkdir()
        self.alice_key, self.alice_pub = write_keypair(self.clients, "alice")
        self.alice_key = self.alice_key.rename(root / "alice.key")  # secrets stay out


@pytest.fixture
def keys(ws: Workspace) -> Keys:
    return Keys(ws.dir)


def test_tcp_beyond_loopback_without_keys_is_refused_naming_the_curve_keys(ws: Workspace) -> None:
    problems = ws.refused(ws.data({ENDPOINT: "tcp://0.0.0.0:7777"}))
    assert "not on a loopback address" in problems["daemon.endpoint"]
    assert "security.curve_secret_key" in problems["daemon.endpoint"]


def test_tcp_beyond_loopback_is_served_with_curve_keys(ws: Workspace, keys: Keys) -> None:
    config = ws.loaded(
        ws.data(
            {
                ENDPOINT: "tcp://0.0.0.0:7777",
                SECRET: str(keys.server_key),
                CLIENTS: [str(keys.clients)],
            }
        )
    )
    server = config.curve_server()
    assert server is not None
    assert server.public_key == read_key_file(keys.server_pub, "k")
    assert server.allowed == {read_key_file(keys.alice_pub, "k"): "alice"}
    # Every worker listens on the same host with the same keys (their files).
    spec = config.worker_spec("smol")
    assert spec.remote == RemoteAccess(
        "0.0.0.0", CurveFiles(str(keys.server_key), (str(keys.clients),))
    )
    assert type(spec).from_wire(spec.to_wire()).remote == spec.remote


def test_tcp_on_loopback_without_keys_gives_workers_plain_tcp_there(ws: Workspace) -> None:
    config = ws.loaded(ws.data({ENDPOINT: "tcp://127.0.0.1:7777"}))
    assert config.curve_server() is None
    assert config.worker_spec("smol").remote == RemoteAccess("127.0.0.1", None)


def test_an_ipc_daemon_gives_workers_no_tcp(ws: Workspace) -> None:
    assert ws.loaded(ws.data()).worker_spec("smol").remote is None


def test_a_secret_key_readable_by_others_is_refused_naming_the_key(
    ws: Workspace, keys: Keys
) -> None:
    keys.server_key.chmod(0o640)
    problems = ws.refused(ws.data({SECRET: str(keys.server_key), CLIENTS: [str(keys.clients)]}))
    assert "readable by other users" in problems["security.curve_secret_key"]


def test_a_malformed_client_key_is_refused_naming_the_key(ws: Workspace, keys: Keys) -> None:
    bad = keys.clients / "mallory.pub"
    bad.write_text("not a key at all\n")
    problems = ws.refused(ws.data({SECRET: str(keys.server_key), CLIENTS: [str(keys.clients)]}))
    assert problems == {
        "security.curve_client_keys": f"{bad} is not a CURVE key (40 Z85 characters)"
    }


def test_a_missing_key_file_is_refused_naming_the_key(ws: Workspace, keys: Keys) -> None:
    gone = ws.dir / "gone.key"
    problems = ws.refused(ws.data({SECRET: str(gone), CLIENTS: [str(keys.clients)]}))
    assert problems["security.curve_secret_key"].startswith(f"cannot read {gone}")


def test_curve_with_no_client_key_is_refused(ws: Workspace, keys: Keys) -> None:
    problems = ws.refused(ws.data({SECRET: str(keys.server_key)}))
    assert "no client could ever connect" in problems["security.curve_client_keys"]


def test_client_keys_without_a_secret_key_are_refused(ws: Workspace, keys: Keys) -> None:
    problems = ws.refused(ws.data({CLIENTS: [str(keys.clients)]}))
    assert "CURVE needs the daemon's secret key" in problems["security.curve_secret_key"]


def test_curve_server_names_the_key_of_a_file_that_went_bad(ws: Workspace, keys: Keys) -> None:
    config = ws.loaded(ws.data({SECRET: str(keys.server_key), CLIENTS: [str(keys.alice_pub)]}))
    keys.alice_pub.write_text("garbage\n")
    with pytest.raises(ConfigError) as info:
        curve_server(config)
    assert info.value.details["field"] == "security.curve_client_keys"


# -- the client's side ---------------------------------------------------------------


def _client_file(ws: Workspace, keys: Keys, endpoint: str, *, server: bool = True) -> Path:
    client = {"curve_secret_key": str(keys.alice_key)}
    if server:
        client["curve_server_key"] = str(keys.server_pub)
    return write_config(ws.dir, {"daemon": {"endpoint": endpoint}, "client": client})


def test_a_client_reaches_beyond_loopback_only_with_curve_keys(ws: Workspace, keys: Keys) -> None:
    path = _client_file(ws, keys, "tcp://10.1.2.3:7777")
    assert client_endpoint(path, env=ws.env) == "tcp://10.1.2.3:7777"
    curve = client_curve(path, env=ws.env)
    assert curve is not None
    assert curve.server_key == read_key_file(keys.server_pub, "k")
    assert curve.public_key == read_key_file(keys.alice_pub, "k")
    plain = write_config(ws.dir, {"daemon": {"endpoint": "tcp://10.1.2.3:7777"}})
    with pytest.raises(ConfigError) as info:
        client_endpoint(plain, env=ws.env)
    assert "client.curve_secret_key" in info.value.message
    assert client_curve(plain, env=ws.env) is None


def test_a_client_with_half_its_keys_is_refused_naming_the_missing_one(
    ws: Workspace, keys: Keys
) -> None:
    path = _client_file(ws, keys, "tcp://127.0.0.1:7777", server=False)
    with pytest.raises(ConfigError) as info:
        client_curve(path, env=ws.env)
    assert "client.curve_server_key" in info.value.message


def test_a_client_secret_key_readable_by_others_is_refused(ws: Workspace, keys: Keys) -> None:
    keys.alice_key.chmod(0o644)
    path = _client_file(ws, keys, "tcp://127.0.0.1:7777")
    with pytest.raises(ConfigError) as info:
        client_curve(path, env=ws.env)
    assert "client.curve_secret_key" in info.value.message
    assert "readable by other users" in info.value.message


def test_config_check_refuses_a_client_table_with_half_its_keys(ws: Workspace, keys: Keys) -> None:
    problems = ws.refused(ws.data({("client", "curve_secret_key"): str(keys.alice_key)}))
    assert problems == {
        "client.curve_server_key": "is not set, but curve_secret_key is: CURVE needs both"
    }
