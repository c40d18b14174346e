"""CURVE for actors reached over TCP: keys, the server's allow-list (ZAP), the client's keys.

ZeroMQ's CURVE (CurveZMQ: a Curve25519 key exchange, then every frame
encrypted and authenticated) is what makes a TCP endpoint beyond loopback
safe to serve (SPEC D5). How llamad uses it:

- **Keys** are Z85 text, 40 characters for 32 bytes. A key file holds one
  key on its first line (``llamad keys generate`` writes ``NAME.key``, the
  secret key, mode 0600, and ``NAME.pub``, the public key). A server's public
  key is derived from its secret key, so a daemon is configured with one file.
- **Per endpoint.** libzmq copies a socket's security options into each
  listener when it binds: an actor binds its ``ipc://`` endpoint first, with
  the NULL mechanism (the 0700 runtime directory and 0600 socket files guard
  it, and local calls pay nothing), then sets CURVE (:func:`secure_server`)
  and binds its ``tcp://`` endpoint.
- **ZAP** (ZeroMQ RFC 27). For every CURVE handshake libzmq asks the handler
  bound at ``inproc://zeromq.zap.01`` in the socket's context; with *no*
  handler it lets in any client that knows the server's public key. So the
  :class:`ZapHandler` binds its socket on the caller's thread before any TCP
  endpoint is bound, and its thread only answers: should that thread die,
  its socket stays bound and handshakes stall instead of passing (fail
  closed). It allows exactly the configured client public keys.
- **The client** names the server's public key and its own keypair
  (:func:`secure_client`). A refused handshake would make ZeroMQ retry
  silently forever; the client reads its socket monitor's
  ``HANDSHAKE_FAILED_*`` events instead and fails at once with
  :class:`~llamad.errors.PermissionDenied` (:func:`handshake_refusal`).
"""

from __future__ import annotations

import os
import re
import struct
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
import zmq
import zmq.utils.z85

from llamad.actors.errors import ActorConfigError
from llamad.errors import PermissionDenied

__all__ = [
    "HANDSHAKE_FAILED",
    "ZAP_DOMAIN",
    "ZAP_ENDPOINT",
    "CurveClient",
    "CurveFiles",
    "CurveServer",
    "RemoteAccess",
    "ZapHandler",
    "generate_keypair",
    "handshake_refusal",
    "parse_key",
    "public_key_of",
    "read_key_file",
    "secure_client",
    "secure_server",
    "write_keypair",
]

log = structlog.get_logger("llamad.actors")

ZAP_ENDPOINT: Final = "inproc://zeromq.zap.01"
"""Where libzmq looks for the ZAP handler of a context (fixed by RFC 27)."""
ZAP_DOMAIN: Final = "llamad"
HANDSHAKE_FAILED: Final = int(
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
"""Monitor events of a handshake the peer refused (or that could not agree)."""

_KEY: Final = re.compile(r"[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}")
_PUBLIC_SUFFIX: Final = ".pub"
_POLL_MS: Final = 50  # how long the ZAP thread sleeps between looks at its stop flag
_LOG_EVERY_S: Final = 1.0  # refusals are logged at most this often (a scan must not flood)


def parse_key(text: str, field_name: str = "key") -> str:
    """``text`` (surrounding whitespace ignored) if it is a Z85 CURVE key, else
    :class:`ActorConfigError` naming ``field_name``."""
    key = text.strip() if isinstance(text, str) else ""
    if not _KEY.fullmatch(key):
        raise ActorConfigError(field_name, "is not a CURVE key (40 Z85 characters)")
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, struct.error):  # five characters above 2**32
        raise ActorConfigError(field_name, "is not a CURVE key (not valid Z85)") from None
    return key


def public_key_of(secret_key: str, field_name: str = "secret_key") -> str:
    """The public key of a CURVE secret key."""
    try:
        return zmq.curve_public(parse_key(secret_key, field_name).encode()).decode()
    except zmq.ZMQError as exc:
        raise ActorConfigError(field_name, f"is not a CURVE secret key: {exc}") from None


def read_key_file(path: str | os.PathLike[str], field_name: str, *, secret: bool = False) -> str:
    """The key in ``path`` (its first line). A ``secret`` key file must not be
    readable by group or others: a copy readable by other users is no secret."""
    p = Path(path)
    try:
        st = p.stat()
        text = p.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ActorConfigError(field_name, f"cannot read {p}: {reason}") from None
    if secret and st.st_mode & 0o077:
        raise ActorConfigError(
            field_name,
            f"{p} is readable by other users (mode {st.st_mode & 0o777:o}): chmod 600 it",
        )
    first = text.splitlines()[0] if text.strip() else ""
    try:
        return parse_key(first, field_name)
    except ActorConfigError as exc:
        problem = exc.message.removeprefix(f"{field_name}: ")
        raise ActorConfigError(field_name, f"{p} {problem}") from None


def generate_keypair() -> tuple[str, str]:
    """A new ``(public, secret)`` CURVE keypair, Z85 text."""
    public, secret = zmq.curve_keypair()
    return public.decode(), secret.decode()


def write_keypair(directory: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Write a new keypair as ``NAME.key`` (secret, 0600) and ``NAME.pub``
    (public, 0644) in ``directory``; return ``(secret_path, public_path)``.

    Refuses to replace an existing file (``FileExistsError``): a key that
    clients or the daemon already trust must not change under them.
    """
    public, secret = generate_keypair()
    folder = Path(directory)
    secret_path = folder / f"{name}.key"
    public_path = folder / f"{name}{_PUBLIC_SUFFIX}"
    for p in (secret_path, public_path):
        if p.exists() or p.is_symlink():
            raise FileExistsError(f"{p} exists (remove it first to replace the key)")
    # O_EXCL and the mode at creation: the secret is never readable by
    # others, not even between a write and a chmod.
    fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(secret + "\n")
    os.chmod(secret_path, 0o600)  # the umask may have narrowed it further; never widened
    fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(public + "\n")
    return secret_path, public_path


@dataclass(frozen=True)
class CurveServer:
    """A server's keys and the clients it allows: ``allowed`` maps each client
    public key to a name for the logs (its key file's stem)."""

    secret_key: str = field(repr=False)
    allowed: Mapping[str, str]
    public_key: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "public_key", public_key_of(self.secret_key))
        if not self.allowed:
            raise ActorConfigError("allowed", "no client key: no client could ever connect")
        for key in self.allowed:
            parse_key(key, "allowed")
        object.__setattr__(self, "allowed", dict(self.allowed))


@dataclass(frozen=True)
class CurveClient:
    """A client's keypair and the server public key it trusts."""

    secret_key: str = field(repr=False)
    server_key: str
    public_key: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "public_key", public_key_of(self.secret_key))
        parse_key(self.server_key, "server_key")

    def for_server(self, server_key: str) -> CurveClient:
        """The same keypair, trusting ``server_key`` instead."""
        return CurveClient(self.secret_key, server_key)

    @classmethod
    def from_files(
        cls, secret_key: str | os.PathLike[str], server_key: str | os.PathLike[str]
    ) -> CurveClient:
        """Read the client's secret key file and the server's public key file."""
        return cls(
            read_key_file(secret_key, "curve_secret_key", secret=True),
            read_key_file(server_key, "curve_server_key"),
        )


@dataclass(frozen=True)
class CurveFiles:
    """Where a server's keys are: its secret key file and the client public key
    files it allows (a directory stands for every ``*.pub`` file in it).

    This, not the keys, is what travels between processes (a worker's spec
    is sent to its supervisor and kept in the front's table): paths never
    put a secret into a message or a log.
    """

    secret_key: str
    client_keys: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "client_keys", tuple(self.client_keys))
        for name, value in (
            ("secret_key", self.secret_key),
            *(("client_keys", p) for p in self.client_keys),
        ):
            if not isinstance(value, str) or not value.startswith("/"):
                raise ActorConfigError(name, f"must be an absolute path, got {value!r}")

    def client_key_files(self) -> list[Path]:
        """Every client public key file named, directories expanded (sorted)."""
        out: list[Path] = []
        for entry in self.client_keys:
            p = Path(entry)
            if p.is_dir():
                out += sorted(q for q in p.iterdir() if q.name.endswith(_PUBLIC_SUFFIX))
            else:
                out.append(p)
        return out

    def load(self) -> CurveServer:
        """Read and check every key (:class:`ActorConfigError` naming the file)."""
        secret = read_key_file(self.secret_key, "curve_secret_key", secret=True)
        allowed: dict[str, str] = {}
        for p in self.client_key_files():
            allowed[read_key_file(p, "curve_client_keys")] = p.name.removesuffix(_PUBLIC_SUFFIX)
        if not allowed:
            raise ActorConfigError(
                "curve_client_keys", "names no client public key: no client could ever connect"
            )
        return CurveServer(secret, allowed)

    def to_wire(self) -> dict[str, Any]:
        return {"secret_key": self.secret_key, "client_keys": list(self.client_keys)}

    @classmethod
    def from_wire(cls, data: object) -> CurveFiles:
        if not isinstance(data, Mapping) or set(data) != {"secret_key", "client_keys"}:
            raise ActorConfigError("curve", "must be a mapping of secret_key and client_keys")
        keys = data["client_keys"]
        if not isinstance(keys, Sequence) or isinstance(keys, str):
            raise ActorConfigError("client_keys", "must be a list of paths")
        return cls(data["secret_key"], tuple(keys))


@dataclass(frozen=True)
class RemoteAccess:
    """How clients on other hosts reach a registered actor: a second endpoint,
    ``tcp://<host>:<ephemeral port>``, with CURVE when ``curve`` is set
    (``Actor(tcp_host=host, curve=curve.load())``)."""

    host: str
    curve: CurveFiles | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ActorConfigError("host", f"must be a host name or address, got {self.host!r}")
        if self.curve is not None and not isinstance(self.curve, CurveFiles):
            raise ActorConfigError("curve", "must be CurveFiles or None")

    def to_wire(self) -> dict[str, Any]:
        return {"host": self.host, "curve": None if self.curve is None else self.curve.to_wire()}

    @classmethod
    def from_wire(cls, data: object) -> RemoteAccess:
        if not isinstance(data, Mapping) or set(data) != {"host", "curve"}:
            raise ActorConfigError("remote", "must be a mapping of host and curve")
        curve = None if data["curve"] is None else CurveFiles.from_wire(data["curve"])
        return cls(data["host"], curve)


def secure_server(sock: zmq.Socket[bytes], server: CurveServer) -> None:
    """Make the endpoints ``sock`` binds from now on CURVE servers checked by ZAP."""
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, server.secret_key.encode())
    sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())


def secure_client(sock: zmq.Socket[bytes], client: CurveClient) -> None:
    """Make the connections ``sock`` opens from now on CURVE clients."""
    sock.setsockopt(zmq.CURVE_SERVERKEY, client.server_key.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, client.public_key.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, client.secret_key.encode())


def handshake_refusal(event: int, value: int, endpoint: str) -> PermissionDenied | None:
    """The error a client raises for monitor event ``event`` (``None``: not a
    refused handshake)."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        reason, why = "curve_key_refused", f"the server refused this client's CURVE key ({value})"
    elif event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        reason = "security_mismatch"
        why = (
            "the security handshake failed: one side uses CURVE and the other does not "
            "(configure the client's curve_secret_key and curve_server_key)"
        )
    elif event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        # Also what a plain client may see of a CURVE server: it can find the
        # connection closed before it reads the server's greeting.
        reason = "handshake_failed"
        why = (
            "the security handshake failed: curve_server_key is not the daemon's public key, "
            "or one side uses CURVE and the other does not"
        )
    else:
        return None
    return PermissionDenied(
        f"{endpoint}: {why}", details={"endpoint": endpoint, "reason": reason, "event": value}
    )


class ZapHandler:
    """Answers libzmq's ZAP requests for one context: CURVE with an allowed key
    passes, anything else is refused (see the module doc).

    :meth:`start` binds on the calling thread (before any CURVE endpoint is
    bound); :meth:`stop` before the context is terminated.
    """

    def __init__(
        self, ctx: zmq.Context[zmq.Socket[bytes]], server: CurveServer, owner: str
    ) -> None:
        self.server = server
        self.owner = owner
        self.allowed = 0
        self.refused = 0
        self._ctx = ctx
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._orphan: zmq.Socket[bytes] | None = None
        self._last_log = 0.0
        self._suppressed = 0

    def start(self) -> None:
        sock = self._ctx.socket(zmq.REP)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(ZAP_ENDPOINT)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        # The socket moves to the thread; starting a thread is a full memory
        # barrier, which is what ZeroMQ asks of a socket changing threads.
        self._thread = threading.Thread(
            target=self._serve, args=(sock,), name=f"zap-{self.owner}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop answering and close the socket (within ~50 ms). Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._orphan is not None:  # its thread is gone: closing it here is safe
            self._orphan.close(linger=0)
            self._orphan = None

    def _serve(self, sock: zmq.Socket[bytes]) -> None:
        try:
            while not self._stop.is_set():
                if not sock.poll(_POLL_MS):
                    continue
                frames = sock.recv_multipart()
                try:
                    reply = self._answer(frames)
                except Exception:
                    log.exception("actor.curve.zap_failed", actor=self.owner)
                    rid = frames[1] if len(frames) > 1 else b""
                    reply = [b"1.0", rid, b"500", b"internal error", b"", b""]
                sock.send_multipart(reply)
        except BaseException:
            # Left bound, so handshakes stall rather than pass unchecked (with
            # no handler at all libzmq would let every client in).
            log.exception("actor.curve.zap_stopped", actor=self.owner)
            self._orphan = sock
        else:
            sock.close(linger=0)

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        # Request: version, request id, domain, address, identity, mechanism,
        # credentials...; reply: version, request id, status, text, user id, metadata.
        if len(frames) < 6 or frames[0] != b"1.0":
            return [b"1.0", frames[1] if len(frames) > 1 else b"", b"500", b"bad request", b"", b""]
        request_id, address, mechanism = frames[1], frames[3], frames[5]
        client = ""
        if mechanism == b"CURVE" and len(frames) == 7 and len(frames[6]) == 32:
            key = zmq.utils.z85.encode(frames[6]).decode()
            name = self.server.allowed.get(key)
            if name is not None:
                self.allowed += 1
                log.debug("actor.curve.allowed", actor=self.owner, client=name)
                return [b"1.0", request_id, b"200", b"OK", name.encode(), b""]
            client = key
        self.refused += 1
        self._log_refusal(
            address.decode(errors="replace"), mechanism.decode(errors="replace"), client
        )
        return [b"1.0", request_id, b"400", b"key not allowed", b"", b""]

    def _log_refusal(self, address: str, mechanism: str, key: str) -> None:
        now = time.monotonic()
        if now - self._last_log < _LOG_EVERY_S:
            self._suppressed += 1
            return
        log.warning(
            "actor.curve.refused",
            actor=self.owner,
            address=address,
            mechanism=mechanism,
            client_key=key,
            suppressed=self._suppressed,
        )
        self._last_log = now
        self._suppressed = 0
