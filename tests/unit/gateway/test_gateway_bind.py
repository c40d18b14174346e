"""The gateway's bind: a port another program holds is retried, never a crash
(the root would restart it until it gave the whole daemon up)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from llamad.gateway import proc

pytestmark = pytest.mark.timeout(30)


def test_a_held_port_is_retried_until_it_is_free(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proc, "_RETRY_S", 0.01)
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen()
    port = other.getsockname()[1]

    async def scenario() -> int:
        task = asyncio.create_task(proc._bind("127.0.0.1", port, False))
        await asyncio.sleep(0.2)
        assert not task.done()  # still trying, not failed
        other.close()
        sock = await asyncio.wait_for(task, 10)
        with sock:
            bound: int = sock.getsockname()[1]
            return bound

    assert asyncio.run(scenario()) == port


def test_with_port_0_a_held_port_is_traded_for_a_free_one() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        sock = asyncio.run(asyncio.wait_for(proc._bind("127.0.0.1", port, True), 10))
        with sock:
            assert sock.getsockname()[1] not in (0, port)
