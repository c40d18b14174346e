"""The gateway process: the root's child that serves HTTP (``docs/internals/gateway.md``).

:func:`run_gateway` is its supervised entry point (:mod:`llamad.daemon.tree`
starts it after the front and stops it first). On a uvloop event loop it:

1. binds ``http.host`` and the port the root chose (``http.port``, or the free
   port the root picked for ``port = 0``), with ``SO_REUSEADDR``. The root
   checked at start that the port was free, so a bind that fails here is a
   restart whose port another program took meanwhile: the gateway reports
   ready anyway, logs ``gateway.port_in_use`` and tries again every second
   (with ``port = 0`` it takes another free port), beating all along, so a
   taken port never crash-loops the root into giving the daemon up;
2. publishes what it bound in ``<runtime_dir>/http.json``
   (:data:`llamad.paths.HTTP_ADDRESS_FILE`), removed when it stops;
3. serves the app (:func:`llamad.gateway.app.build_app`) with uvicorn
   (httptools), heartbeating from the loop, until SIGTERM; then it stops
   accepting, gives open requests :data:`GRACE_S` and cancels the rest.

Its only way to the daemon is one :class:`llamad.AsyncClient` on the daemon's
endpoint, so its crash or restart is invisible to the workers: a request it
had open is cancelled like any client's that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import importlib.machinery
import importlib.util
import json
import os
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Final

import msgspec
import structlog
import uvloop

from llamad import logs
from llamad.client.aio import AsyncClient
from llamad.gateway.app import build_app
from llamad.gateway.gate import Gate
from llamad.gateway.settings import GatewaySettings
from llamad.paths import HTTP_ADDRESS_FILE
from llamad.supervisor.child import heartbeat, heartbeat_interval, notifies_ready, notify_ready


def _bare_uvicorn() -> None:
    """uvicorn's package, its ``Config`` and ``Server`` imported without its
    ``__init__``: that imports ``uvicorn.main``, the command line, which brings
    click, watchfiles (``--reload``) and multiprocessing (``--workers``),
    ~2.4 MB resident the gateway never uses (SPEC P9). The package module is
    made bare, with the two names its own modules read from it
    (``uvicorn.lifespan.off`` does ``from uvicorn import Config``). Pinned
    uvicorn (0.54): a later one that moved them fails the gateway's tests."""
    if "uvicorn" not in sys.modules:
        spec = importlib.util.find_spec("uvicorn")
        assert spec is not None and spec.submodule_search_locations is not None
        package = importlib.util.module_from_spec(
            importlib.machinery.ModuleSpec("uvicorn", None, is_package=True)
        )
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["uvicorn"] = package
        config = importlib.import_module("uvicorn.config")
        server = importlib.import_module("uvicorn.server")
        package.Config, package.Server = config.Config, server.Server  # type: ignore[attr-defined]


_bare_uvicorn()

from uvicorn.config import Config  # noqa: E402  (after the bare package)
from uvicorn.server import Server  # noqa: E402

__all__ = ["GRACE_S", "listen", "run_gateway"]

log = structlog.get_logger("llamad.gateway")

GRACE_S: Final = 3
"""How long a stopping gateway lets open requests finish before cancelling them
(within the tree's shutdown window for it)."""
_RETRY_S: Final = 1.0
DATE_EVERY_S: Final = 1.0
"""How often the server's loop wakes while idle: the ``Date`` header's resolution."""


@notifies_ready
def run_gateway(settings: Mapping[str, Any]) -> None:
    """Supervised entry point: bind, publish, serve until SIGTERM."""
    logs.configure()
    uvloop.run(_serve(msgspec.convert(settings, GatewaySettings)))


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` (``SO_REUSEADDR``: a port left in
    TIME_WAIT by a previous gateway is taken again at once)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except BaseException:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


async def _bind(host: str, port: int, any_port: bool) -> socket.socket:
    warned = False
    while True:
        try:
            return listen(host, port)
        except OSError as exc:
            if any_port and exc.errno == errno.EADDRINUSE:
                port = 0
                continue
            if not warned:
                warned = True
                notify_ready()  # not ready to serve, but alive: no restart can help
                log.error(
                    "gateway.port_in_use",
                    host=host,
                    port=port,
                    error=str(exc),
                    hint="http.port: another program holds it; retrying every second",
                )
            heartbeat()
            await asyncio.sleep(_RETRY_S)


async def _beat() -> None:
    interval = heartbeat_interval()
    if interval is None:
        return
    while True:
        heartbeat()
        await asyncio.sleep(interval / 2)


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _publish(runtime_dir: str, host: str, port: int) -> Path:
    path = Path(runtime_dir, HTTP_ADDRESS_FILE)
    tmp = path.with_name(f".{HTTP_ADDRESS_FILE}.{os.getpid()}")
    address = {"url": _url(host, port), "host": host, "port": port, "pid": os.getpid()}
    # 0600 at creation, as every file of the runtime directory (security.md).
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(address))
    tmp.replace(path)
    return path


def _unpublish(path: Path) -> None:
    # Only our own: a newer gateway may have replaced it already.
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


async def _serve(settings: GatewaySettings) -> None:
    http = settings.http
    beat = asyncio.create_task(_beat())
    sock = await _bind(http.host, settings.port, http.port == 0)
    host, port = sock.getsockname()[:2]
    client = AsyncClient(
        settings.endpoint,
        timeout=http.request_timeout_s,
        idle_timeout=http.idle_timeout_s,
        name=f"llamad-gateway-{os.getpid()}",
    )
    config = Config(
        build_app(Gate(http, client, state_dir=settings.state_dir)),
        http="httptools",
        ws="none",
        lifespan="off",
        log_config=None,
        access_log=False,
        server_header=False,
        # No X-Forwarded-* rewriting: a middleware on every request for a
        # client address nothing reads (keys, not addresses, admit callers).
        proxy_headers=False,
        timeout_graceful_shutdown=GRACE_S,
    )
    server = _Server(config)
    ready = asyncio.create_task(_ready_when_started(server, settings.runtime_dir, host, port))
    published: Path | None = None
    try:
        await server.serve(sockets=[sock])
    finally:
        published = ready.result() if ready.done() and not ready.cancelled() else None
        ready.cancel()
        beat.cancel()
        if published is not None:
            _unpublish(published)
        client.close()
        sock.close()
        log.info("gateway.stopped")


async def _ready_when_started(server: Server, runtime_dir: str, host: str, port: int) -> Path:
    while not server.started:
        await asyncio.sleep(0.01)
    path = _publish(runtime_dir, host, port)
    notify_ready()
    log.info("gateway.serving", url=_url(host, port))
    return path


class _Server(Server):
    """uvicorn's server without its re-raise of the stopping signal once it has
    served (the process would die by it before its ``finally`` removes the
    address file): SIGTERM and SIGINT only ask it to exit.

    Nor its tick: uvicorn's loop wakes every 0.1 s to look for that exit
    (10 wakeups a second of an idle gateway, each a core taken from a decode
    beside it). This one sleeps until the ``Date`` header is a second old or
    the exit is asked for, whichever comes first."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    async def main_loop(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = wake = asyncio.Event()
        # Counter 0: uvicorn refreshes the Date header at each multiple of 10.
        while not await self.on_tick(0):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), DATE_EVERY_S)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._wake is not None:
            # A signal handler: the set must run on the loop, and wake it.
            self._loop.call_soon_threadsafe(self._wake.set)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {
            sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
