"""``sse.EventStream``: pumped in the request's own task, ended (not failed) when
the client leaves, and cancelled like any task when the server stops it.

Driven by ASGI calls on a bare event loop (no uvicorn): ``send`` records,
``receive`` says when the client goes. Waits are bounded by deadlines on what
was sent, never a sleep then a check.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llamad.gateway.sse import EventStream
from llamad.testing.launcher import EVENTUALLY


def _bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()  # the client never leaves
    raise AssertionError


class _Chunks:
    """One chunk, then nothing until the stream is closed; notes its closing."""

    def __init__(self) -> None:
        self.closed = False

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            yield b"data: a\n\n"
            await asyncio.Event().wait()  # a token that never comes
            yield b"data: b\n\n"
        finally:
            self.closed = True


def test_the_first_chunk_is_written_before_the_loop_runs_anything_else() -> None:
    # A chunk that is there when the response starts leaves in the same loop
    # turn as the status line: no task of its own to be scheduled first.
    sent: list[dict[str, Any]] = []
    turned: list[bool] = []
    at_first_body: list[bool] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and not at_first_body:
            at_first_body.append(bool(turned))
        sent.append(message)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: a\n\n"

    async def run() -> None:
        asyncio.get_running_loop().call_soon(turned.append, True)
        await EventStream(chunks())({"type": "http"}, _never, send)

    asyncio.run(run())
    assert _bodies(sent) == [b"data: a\n\n", b""]
    assert at_first_body == [False]  # the loop had not turned yet


def test_a_client_leaving_ends_the_response_and_closes_its_stream() -> None:
    sent: list[dict[str, Any]] = []
    source = _Chunks()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> int:
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def leave_after_the_first_chunk() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + EVENTUALLY
            while not _bodies(sent):
                assert loop.time() < deadline, "the first chunk was never sent"
                await asyncio.sleep(0.005)
            gone.set()

        leaving = asyncio.create_task(leave_after_the_first_chunk())
        # Ends normally: the cancel the watch made is the stream's own, spent.
        await asyncio.wait_for(
            EventStream(source.chunks())({"type": "http"}, receive, send), EVENTUALLY
        )
        await leaving
        here = asyncio.current_task()
        assert here is not None
        return here.cancelling()

    assert asyncio.run(run()) == 0
    assert source.closed  # the llamad stream inside was closed (CANCEL)
    assert _bodies(sent) == [b"data: a\n\n"]  # nothing after the client left


def test_a_cancel_from_outside_is_not_taken_for_the_client_leaving() -> None:
    sent: list[dict[str, Any]] = []
    source = _Chunks()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def run() -> None:
        response = asyncio.create_task(
            EventStream(source.chunks(), ping_s=10.0)({"type": "http"}, _never, send)
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + EVENTUALLY
        while not _bodies(sent):
            assert loop.time() < deadline, "the first chunk was never sent"
            await asyncio.sleep(0.005)
        response.cancel()  # the server stopping, say
        with pytest.raises(asyncio.CancelledError):
            await response
        # Its watch and its pinger went with it.
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        assert others == []

    asyncio.run(run())
    assert source.closed
