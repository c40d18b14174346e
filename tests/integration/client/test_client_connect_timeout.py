"""The connect timeout is what it says (issue 17): an endpoint that accepts the
connection but never answers the handshake fails a call after about
``connect_timeout``, not twice that (the front op's retry and the worker's
re-route each waited the whole setting again).

Real sockets, no daemon: a "deaf" actor is started and registered but its loop
never runs; a fake front answers ``route`` with that actor's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llamad import AsyncClient, Client
from llamad.actors import Actor, Registry
from llamad.cli.errors import EXIT_UNAVAILABLE
from llamad.cli.main import main as llamad_main
from llamad.errors import Unavailable
from llamad.front.wire import OPS as FRONT_OPS
from llamad.front.wire import Route

pytestmark = pytest.mark.timeout(60)

CONNECT_TIMEOUT = 1.0
#: Generous for a loaded machine, and still well short of twice the setting.
LIMIT = 1.5 * CONNECT_TIMEOUT


@dataclass
class Endpoints:
    deaf: str  # registered, never answers
    front: str  # answers route with the deaf actor


@pytest.fixture
def endpoints() -> Iterator[Endpoints]:
    root = Path(tempfile.mkdtemp(prefix="lct-", dir="/tmp"))
    registry = Registry(root)
    deaf = Actor("model.deaf", registry=registry)
    deaf.start()
    front = Actor("front", registry=registry)
    route = Route(model_id="deaf", actor="model.deaf", registry_root=str(root), instance="x")
    front.add_op(FRONT_OPS["route"], lambda req: route)
    front.start()
    thread = threading.Thread(target=front.serve_forever, kwargs={"handle_signals": False})
    thread.start()
    try:
        yield Endpoints(deaf=deaf.endpoint, front=front.endpoint)
    finally:
        front.request_stop()
        thread.join(30)
        deaf.close()


def _elapsed(call: Callable[[], Any]) -> float:
    started = time.monotonic()
    with pytest.raises(Unavailable):
        call()
    return time.monotonic() - started


def _elapsed_async(call: Callable[[], Awaitable[Any]]) -> float:
    async def run() -> float:
        started = time.monotonic()
        with pytest.raises(Unavailable):
            await call()
        return time.monotonic() - started

    return asyncio.run(run())


def test_a_front_that_never_answers_fails_after_the_connect_timeout(
    endpoints: Endpoints,
) -> None:
    with Client(endpoint=endpoints.deaf, connect_timeout=CONNECT_TIMEOUT) as c:
        assert CONNECT_TIMEOUT * 0.9 <= _elapsed(c.status) < LIMIT


def test_a_worker_that_never_answers_fails_after_the_connect_timeout(
    endpoints: Endpoints,
) -> None:
    with Client(endpoint=endpoints.front, connect_timeout=CONNECT_TIMEOUT) as c:
        elapsed = _elapsed(lambda: c.complete("deaf", "hi", max_tokens=1))
        assert CONNECT_TIMEOUT * 0.9 <= elapsed < LIMIT


def test_the_async_client_keeps_the_connect_timeout_too(endpoints: Endpoints) -> None:
    async def front() -> Any:
        async with AsyncClient(endpoint=endpoints.deaf, connect_timeout=CONNECT_TIMEOUT) as c:
            return await c.status()

    async def worker() -> Any:
        async with AsyncClient(endpoint=endpoints.front, connect_timeout=CONNECT_TIMEOUT) as c:
            return await c.complete("deaf", "hi", max_tokens=1)

    assert CONNECT_TIMEOUT * 0.9 <= _elapsed_async(front) < LIMIT
    assert CONNECT_TIMEOUT * 0.9 <= _elapsed_async(worker) < LIMIT


def test_the_cli_says_unavailable_in_one_line_after_the_connect_timeout(
    endpoints: Endpoints,
) -> None:
    err = io.StringIO()
    started = time.monotonic()
    with contextlib.redirect_stderr(err):
        status = llamad_main(["status", "--endpoint", endpoints.deaf, "--connect-timeout", "1"])
    elapsed = time.monotonic() - started
    assert status == EXIT_UNAVAILABLE, err.getvalue()
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("llamad: unavailable: "), lines
    assert CONNECT_TIMEOUT * 0.9 <= elapsed < LIMIT
