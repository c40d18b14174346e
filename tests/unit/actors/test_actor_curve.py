"""CURVE on an actor's tcp endpoint: allowed keys in, everyone else refused at once.

Real ZeroMQ sockets, an actor on a thread of the test process (its ZAP
handler is a thread of that actor's context), real CURVE handshakes.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import zmq

from actor_thread import running
from llamad.actors import Actor, Client, Registry
from llamad.actors.aio_client import AsyncActorClient
from llamad.actors.aio_link import AsyncLink
from llamad.actors.curve import (
    CurveClient,
    CurveFiles,
    CurveServer,
    ZapHandler,
    generate_keypair,
    parse_key,
    read_key_file,
    write_keypair,
)
from llamad.actors.errors import ActorConfigError
from llamad.errors import PermissionDenied
from llamad.testing.toy_actor import build_toy

pytestmark = pytest.mark.timeout(60)

#: A refusal must come from the handshake, not from waiting out the connect timeout.
# A refusal must come at once, not after the connect timeout. The bound
# between the two is half the timeout, so a loaded machine (a refusal took
# over 2 s once while two builds ran beside the suite) cannot fail a correct
# refusal, and a client that waits for the timeout still fails.
CONNECT_TIMEOUT = 20.0
FAST = CONNECT_TIMEOUT / 2


class Keys:
    def __init__(self) -> None:
        self.server_public, self.server_secret = generate_keypair()
        self.alice_public, self.alice_secret = generate_keypair()
        self.mallory_public, self.mallory_secret = generate_keypair()

    def server(self) -> CurveServer:
        return CurveServer(self.server_secret, {self.alice_public: "alice"})

    def alice(self) -> CurveClient:
        return CurveClient(self.alice_secret, self.server_public)


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@contextmanager
def serving(actor: Actor) -> Iterator[Actor]:
    """Serve the toy ops on ``actor`` from a thread that owns its sockets."""
    toy = build_toy(actor)
    with running(actor, toy.tick):
        yield actor


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return Registry(tmp_path / "reg")


@pytest.fixture
def secured(registry: Registry, keys: Keys) -> Iterator[Actor]:
    """An actor on ipc (registered) that also listens on loopback tcp with CURVE."""
    with serving(Actor("toy", registry=registry, curve=keys.server(), tcp_host="127.0.0.1")) as a:
        yield a


def refused_fast(connect: Callable[[], Any]) -> PermissionDenied:
    started = time.monotonic()
    with pytest.raises(PermissionDenied) as info:
        connect()
    elapsed = time.monotonic() - started
    assert elapsed < FAST, f"refused only after {elapsed:.2f}s: it waited instead of failing"
    return info.value


def call_once(endpoint: str, curve: CurveClient | None) -> Any:
    with Client(endpoint, curve=curve, connect_timeout=CONNECT_TIMEOUT, timeout=10) as c:
        return c.call("echo", {"n": 1})


# -- who gets in ---------------------------------------------------------------------


def test_an_allowed_key_calls_over_tcp_while_ipc_stays_plain(secured: Actor, keys: Keys) -> None:
    assert secured.tcp_endpoint.startswith("tcp://127.0.0.1:")
    assert call_once(secured.tcp_endpoint, keys.alice()) == {"n": 1}
    # The ipc endpoint of the same socket was bound before CURVE was set: a
    # local client needs no key (the runtime directory's mode guards it).
    assert call_once(secured.endpoint, None) == {"n": 1}
    with Client(secured.tcp_endpoint, curve=keys.alice(), connect_timeout=CONNECT_TIMEOUT) as c:
        events = [m.body["i"] for m in c.stream("count", {"n": 5})]
    assert events == [0, 1, 2, 3, 4]


def test_the_registry_records_the_tcp_endpoint(secured: Actor, registry: Registry) -> None:
    entry = registry.lookup("toy")
    assert entry is not None
    assert entry.endpoint == secured.endpoint and entry.endpoint.startswith("ipc://")
    assert entry.tcp_endpoint == secured.tcp_endpoint


def test_an_unknown_key_is_refused_at_once(secured: Actor, keys: Keys) -> None:
    mallory = CurveClient(keys.mallory_secret, keys.server_public)
    err = refused_fast(lambda: call_once(secured.tcp_endpoint, mallory))
    assert err.details["reason"] == "curve_key_refused"
    assert err.code == "permission_denied"


def test_a_plain_client_is_refused_at_once(secured: Actor) -> None:
    err = refused_fast(lambda: call_once(secured.tcp_endpoint, None))
    # Which of the two the client sees first depends on the race between the
    # server's greeting and its close.
    assert err.details["reason"] in ("security_mismatch", "handshake_failed")


#: How long a client is held before its HELLO, and how many tries a test
#: makes. The server ends a plain client's handshake either with a protocol
#: error (the pipe is gone for good: the case under test) or by closing the
#: connection (the client reconnects and keeps its pipe); which one comes
#: first is the kernel's race, so a try that never loses its pipe is tried
#: again, and the test fails only if no try ever reached the case.
HOLD_S = 2.0
TRIES = 8


def _until_the_pipe_is_gone(sock: zmq.Socket[bytes]) -> bool:
    """Hold a client before its HELLO, as a loaded machine does, until the
    refused handshake has taken its socket's only pipe away (from then on a
    send cannot go out); ``False`` if it kept it for :data:`HOLD_S`."""
    deadline = time.monotonic() + HOLD_S
    while sock.getsockopt(zmq.EVENTS) & zmq.POLLOUT:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _refused_after_losing_the_pipe(call: Callable[[], Any], held: list[bool]) -> None:
    for _ in range(TRIES):
        held.clear()
        err = refused_fast(call)
        assert err.details["reason"] in ("security_mismatch", "handshake_failed")
        if held[:1] == [True]:
            return
    pytest.fail(f"in {TRIES} tries the refused handshake never took the client's pipe away")


def test_a_plain_client_refused_before_it_sends_its_hello_is_refused_at_once(
    secured: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    rebuild = Client._rebuild_items
    held: list[bool] = []

    def late(self: Client) -> None:
        rebuild(self)
        if not held and self._sock is not None:
            held.append(_until_the_pipe_is_gone(self._sock))

    monkeypatch.setattr(Client, "_rebuild_items", late)
    _refused_after_losing_the_pipe(lambda: call_once(secured.tcp_endpoint, None), held)


def test_the_asyncio_client_refused_before_it_sends_its_hello_is_refused_at_once(
    secured: Actor, monkeypatch: pytest.MonkeyPatch
) -> None:
    init = AsyncLink.__init__
    held: list[bool] = []

    def late(self: AsyncLink, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        held.append(_until_the_pipe_is_gone(self._sock))

    monkeypatch.setattr(AsyncLink, "__init__", late)

    async def call() -> Any:
        client = AsyncActorClient(secured.tcp_endpoint, connect_timeout=CONNECT_TIMEOUT, timeout=10)
        try:
            return await client.call("echo", {"n": 2})
        finally:
            client.close()

    _refused_after_losing_the_pipe(lambda: asyncio.run(call()), held)


def test_a_client_trusting_another_server_key_is_refused_at_once(
    secured: Actor, keys: Keys
) -> None:
    fooled = CurveClient(keys.alice_secret, keys.mallory_public)
    err = refused_fast(lambda: call_once(secured.tcp_endpoint, fooled))
    assert err.details["reason"] == "handshake_failed"


def test_the_asyncio_client_is_refused_at_once_and_an_allowed_key_calls(
    secured: Actor, keys: Keys
) -> None:
    async def call(curve: CurveClient | None) -> Any:
        client = AsyncActorClient(
            secured.tcp_endpoint, curve=curve, connect_timeout=CONNECT_TIMEOUT, timeout=10
        )
        try:
            return await client.call("echo", {"n": 2})
        finally:
            client.close()

    assert asyncio.run(call(keys.alice())) == {"n": 2}
    mallory = CurveClient(keys.mallory_secret, keys.server_public)
    err = refused_fast(lambda: asyncio.run(call(mallory)))
    assert err.details["reason"] == "curve_key_refused"
    err = refused_fast(lambda: asyncio.run(call(None)))
    assert err.details["reason"] in ("security_mismatch", "handshake_failed")


def test_a_tcp_endpoint_of_its_own_is_served_with_curve(registry: Registry, keys: Keys) -> None:
    # The daemon's front: its one endpoint is tcp.
    actor = Actor("front", endpoint="tcp://127.0.0.1:0", registry=registry, curve=keys.server())
    with serving(actor):
        assert call_once(actor.endpoint, keys.alice()) == {"n": 1}
        refused_fast(lambda: call_once(actor.endpoint, None))


def test_a_failing_zap_handler_refuses_rather_than_allows(
    registry: Registry, keys: Keys, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: ZapHandler, frames: list[bytes]) -> list[bytes]:
        raise RuntimeError("bug in the policy")

    monkeypatch.setattr(ZapHandler, "_answer", broken)
    with serving(Actor("toy", registry=registry, curve=keys.server(), tcp_host="127.0.0.1")) as a:
        err = refused_fast(lambda: call_once(a.tcp_endpoint, keys.alice()))
    assert err.details["reason"] == "curve_key_refused"


def test_curve_counts_who_it_let_in_and_who_it_refused(secured: Actor, keys: Keys) -> None:
    call_once(secured.tcp_endpoint, keys.alice())
    mallory = CurveClient(keys.mallory_secret, keys.server_public)
    refused_fast(lambda: call_once(secured.tcp_endpoint, mallory))
    zap = secured._zap
    assert zap is not None
    assert (zap.allowed, zap.refused) == (1, 1)


# -- keys and key files --------------------------------------------------------------


def test_a_keypair_is_written_secret_0600_public_0644_and_never_replaced(tmp_path: Path) -> None:
    secret_path, public_path = write_keypair(tmp_path, "alice")
    assert (secret_path.name, public_path.name) == ("alice.key", "alice.pub")
    assert secret_path.stat().st_mode & 0o777 == 0o600
    assert public_path.stat().st_mode & 0o777 == 0o644
    secret = read_key_file(secret_path, "k", secret=True)
    public = read_key_file(public_path, "k")
    assert CurveClient(secret, public).public_key == public
    with pytest.raises(FileExistsError):
        write_keypair(tmp_path, "alice")
    assert read_key_file(secret_path, "k", secret=True) == secret


def test_a_secret_key_readable_by_others_is_refused(tmp_path: Path) -> None:
    secret_path, _ = write_keypair(tmp_path, "server")
    secret_path.chmod(0o644)
    with pytest.raises(ActorConfigError, match="readable by other users"):
        read_key_file(secret_path, "curve_secret_key", secret=True)


@pytest.mark.parametrize("text", ["", "short", "x" * 39, "x" * 41, "~" * 40, "#" * 40, "é" * 40])
def test_a_malformed_key_is_refused(text: str) -> None:
    with pytest.raises(ActorConfigError, match="not a CURVE key"):
        parse_key(text, "key")


def test_curve_files_expand_a_directory_of_public_keys(tmp_path: Path) -> None:
    server_secret, _ = write_keypair(tmp_path, "server")
    clients = tmp_path / "clients"
    clients.mkdir()
    _, alice = write_keypair(clients, "alice")
    _, bob = write_keypair(clients, "bob")
    (clients / "alice.key").unlink()  # a secret that strayed here is not a client key
    (clients / "bob.key").unlink()
    server = CurveFiles(str(server_secret), (str(clients),)).load()
    assert sorted(server.allowed.values()) == ["alice", "bob"]
    assert read_key_file(alice, "k") in server.allowed
    assert CurveFiles.from_wire(CurveFiles(str(server_secret), (str(bob),)).to_wire()).load()


def test_curve_files_naming_no_client_key_are_refused(tmp_path: Path) -> None:
    server_secret, _ = write_keypair(tmp_path, "server")
    empty = tmp_path / "clients"
    empty.mkdir()
    with pytest.raises(ActorConfigError, match="no client could ever connect"):
        CurveFiles(str(server_secret), (str(empty),)).load()


def test_the_secret_key_never_shows_in_a_repr(keys: Keys) -> None:
    assert keys.server_secret not in repr(keys.server())
    assert keys.alice_secret not in repr(keys.alice())


# -- ipc: file modes and other users -------------------------------------------------


def test_an_ipc_socket_file_is_0600(registry: Registry) -> None:
    with serving(Actor("toy", registry=registry)) as actor:
        path = actor.endpoint.removeprefix("ipc://")
        assert os.stat(path).st_mode & 0o777 == 0o600
    assert registry.root.stat().st_mode & 0o777 == 0o700


def test_a_registry_record_is_0600_whatever_the_umask(registry: Registry) -> None:
    old = os.umask(0o022)
    try:
        with serving(Actor("toy", registry=registry)):
            record = registry.root / "toy.json"
            assert record.stat().st_mode & 0o777 == 0o600
            assert registry.lookup("toy") is not None
    finally:
        os.umask(old)


def _as_nobody(target: Callable[[], str]) -> str:
    """Run ``target`` in a forked child as uid/gid 65534; its one-line result."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            result = target()
        except BaseException as exc:
            result = f"raised {type(exc).__name__}: {exc}"
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return b"".join(chunks).decode()


def _nobody_calls(endpoint: str) -> str:
    started = time.monotonic()
    try:
        with Client(endpoint, connect_timeout=CONNECT_TIMEOUT, timeout=5) as c:
            c.call("echo", {})
    except PermissionDenied as exc:
        return f"permission_denied {time.monotonic() - started:.3f} {exc.details['reason']}"
    except Exception as exc:
        return f"other {type(exc).__name__}: {exc}"
    return "connected"


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another uid needs root")
def test_another_user_is_refused_at_once_by_the_socket_mode(tmp_path: Path) -> None:
    # Even with the directories open to everyone, the 0600 socket file refuses.
    tmp_path.chmod(0o755)
    root = tmp_path / "reg"
    registry = Registry(root)
    root.chmod(0o755)
    with serving(Actor("toy", registry=registry)) as actor:
        outcome = _as_nobody(lambda: _nobody_calls(actor.endpoint))
    kind, elapsed, reason = outcome.split()
    assert (kind, reason) == ("permission_denied", "ipc_permission"), outcome
    assert float(elapsed) < FAST


@pytest.mark.skipif(os.getuid() != 0, reason="switching to another uid needs root")
def test_another_user_is_refused_at_once_by_the_private_directory(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    with serving(Actor("toy", registry=Registry(tmp_path / "reg"))) as actor:
        path = actor.endpoint.removeprefix("ipc://")
        os.chmod(path, 0o666)  # only the 0700 directory stands in the way now
        outcome = _as_nobody(lambda: _nobody_calls(actor.endpoint))
    assert outcome.split()[0] == "permission_denied", outcome
