"""SSE keep-alive: ``: ping`` comments on an idle stream, and a late first token
that starts the response early so its prefill is pinged too (``http.keepalive_s``).

Short intervals, and waits bounded by deadlines on what was sent (never a
sleep then a check that a slow machine could fail).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from llamad.client.aio import AsyncClient
from llamad.config.sections import HttpSection
from llamad.errors import ContextOverflow
from llamad.gateway.gate import Caller, Gate
from llamad.gateway.sse import PING, EventStream
from llamad.model.results import (
    CacheHitKind,
    Completion,
    DoneEvent,
    Event,
    FinishReason,
    Stats,
    TokenEvent,
)
from llamad.testing.launcher import EVENTUALLY


def _completion(reply: str) -> Completion:
    return Completion(
        reply=reply,
        generated=[1],
        context_tokens=[1, 2],
        committed_tokens=1,
        cache_hit_kind=CacheHitKind.COLD,
        finish_reason=FinishReason.STOP,
        stats=Stats(prompt_tokens=1, completion_tokens=1),
    )


async def _until(what: str, check: Any) -> None:
    """Wait (bounded) for ``check()`` to hold, yielding to the loop."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + EVENTUALLY
    while not check():
        assert loop.time() < deadline, what
        await asyncio.sleep(0.005)


async def _never() -> dict[str, Any]:
    await asyncio.Event().wait()  # the client never leaves
    raise AssertionError


def _bodies(sent: list[dict[str, Any]]) -> list[bytes]:
    return [m["body"] for m in sent if m["type"] == "http.response.body"]


def test_an_idle_stream_is_pinged_and_never_after_its_end() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: a\n\n"
        # Idle (a held tool call, a slow token) until a ping went out.
        await _until("a ping while idle", lambda: PING in _bodies(sent))
        yield b"data: b\n\n"

    async def run() -> None:
        stream = EventStream(chunks(), ping_s=0.01)
        await stream({"type": "http"}, _never, send)

    asyncio.run(run())
    bodies = _bodies(sent)
    assert bodies[0] == b"data: a\n\n"
    b = bodies.index(b"data: b\n\n")
    assert set(bodies[1:b]) == {PING}
    assert bodies[b + 1 :] == [b""]  # the end, and nothing after it
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}


def test_without_an_interval_nothing_but_the_chunks_is_sent() -> None:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x\n"
        await asyncio.sleep(0.1)
        yield b"y\n"

    asyncio.run(EventStream(chunks(), ping_s=None)({"type": "http"}, _never, send))
    assert _bodies(sent) == [b"x\n", b"y\n", b""]


class _Request:
    """What the gate reads of a starlette request."""

    class url:  # noqa: N801
        path = "/v1/chat/completions"

    async def receive(self) -> dict[str, Any]:
        return await _never()


class _SlowClient:
    """``infer`` whose first event waits for ``release`` (a long prefill)."""

    def __init__(self, first: Event | Exception) -> None:
        self.release = asyncio.Event()
        self.first = first
        self.closed = False

    async def infer(self, model: str, prompt: Any = None, **kw: Any) -> Any:
        client = self

        class Stream:
            def __aiter__(self) -> AsyncIterator[Event]:
                return self.events()

            async def events(self) -> AsyncIterator[Event]:
                await client.release.wait()
                if isinstance(client.first, Exception):
                    raise client.first
                yield client.first

            async def aclose(self) -> None:
                client.closed = True

        return Stream()


def _gate(client: _SlowClient, keepalive_s: float | None) -> Gate:
    return Gate(HttpSection(keepalive_s=keepalive_s), cast(AsyncClient, client))


async def _drain(events: AsyncIterator[Event]) -> list[Event]:
    return [e async for e in events]


def test_a_late_first_token_starts_the_stream_before_it_comes() -> None:
    done = DoneEvent(_completion("Hi"))

    async def run() -> None:
        client = _SlowClient(done)
        gate = _gate(client, 0.01)
        # Returns although the first event cannot come yet (release is unset).
        opened = await asyncio.wait_for(
            gate.stream(cast(Any, _Request()), Caller(""), "m", "p", keepalive=True), EVENTUALLY
        )
        assert opened.pending is not None and opened.keepalive_s == 0.01
        assert gate.running() == {"": 1}
        client.release.set()
        assert await _drain(opened.events()) == [done]
        assert gate.running() == {} and client.closed

    asyncio.run(run())


def test_a_refusal_after_the_stream_started_comes_out_of_its_events() -> None:
    async def run() -> None:
        client = _SlowClient(ContextOverflow("the prompt is past the context"))
        gate = _gate(client, 0.01)
        opened = await asyncio.wait_for(
            gate.stream(cast(Any, _Request()), Caller(""), "m", "p", keepalive=True), EVENTUALLY
        )
        client.release.set()
        with pytest.raises(ContextOverflow):
            await _drain(opened.events())
        assert gate.running() == {}

    asyncio.run(run())


@pytest.mark.parametrize(("keepalive", "interval"), [(False, 0.01), (True, None)])
def test_without_keepalive_the_first_token_is_awaited(
    keepalive: bool, interval: float | None
) -> None:
    """Ollama's NDJSON streams (no comments) and ``keepalive_s = 0``: the
    status waits for the first event, as before."""
    token = TokenEvent("Hi", 1)

    async def run() -> None:
        client = _SlowClient(token)
        gate = _gate(client, interval)
        task = asyncio.ensure_future(
            gate.stream(cast(Any, _Request()), Caller(""), "m", "p", keepalive=keepalive)
        )
        await asyncio.sleep(0.05)
        assert not task.done()
        client.release.set()
        opened = await task
        assert opened.pending is None and opened.first == token
        assert opened.keepalive_s is None
        await opened.events().aclose()

    asyncio.run(run())
