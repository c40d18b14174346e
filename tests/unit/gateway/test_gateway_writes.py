"""How an OpenAI stream is written: what arrived together leaves in one
write, and no chunk waits for an event still to come.

The app is driven as uvicorn drives it (ASGI ``receive`` / ``send``), over a
fake client whose events the test releases one at a time; ``buffered()``
says how many were released and not yet taken, as
:meth:`llamad.client.aio_stream.AsyncStream.buffered` does. Waits are
bounded by a deadline on what was sent, never a sleep then a check.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any, cast

import msgspec
import pytest

from llamad.client.aio import AsyncClient
from llamad.config.sections import HttpSection
from llamad.gateway.app import build_app
from llamad.gateway.gate import Gate
from llamad.model.results import (
    CacheHitKind,
    Completion,
    DoneEvent,
    Event,
    FinishReason,
    Stats,
    TokenEvent,
)

pytestmark = pytest.mark.timeout(60)

DEADLINE_S = 20.0  # far beyond a loaded machine's delay; a write that never comes fails


def _completion(reply: str) -> Completion:
    return Completion(
        reply=reply,
        generated=[5, 7],
        context_tokens=[1, 2],
        committed_tokens=2,
        cache_hit_kind=CacheHitKind.COLD,
        finish_reason=FinishReason.LENGTH,
        stats=Stats(prompt_tokens=2, completion_tokens=2),
    )


class _Feed:
    """An ``infer`` stream whose events come when the test puts them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.closed = False

    def put(self, *events: Event) -> None:
        for event in events:
            self.queue.put_nowait(event)

    def buffered(self) -> int:
        return self.queue.qsize()

    def __aiter__(self) -> AsyncIterator[Event]:
        return self._events()

    async def _events(self) -> AsyncIterator[Event]:
        while True:
            event = await self.queue.get()
            yield event
            if isinstance(event, DoneEvent):
                return

    async def aclose(self) -> None:
        self.closed = True


class _Client:
    def __init__(self, feed: _Feed) -> None:
        self.feed = feed

    async def infer(self, model_id: str, prompt: Any = None, **kw: Any) -> _Feed:
        return self.feed


class _Exchange:
    """One POST to the app; ``sent``: what it sent, in order."""

    def __init__(
        self, feed: _Feed, path: str, body: dict[str, Any], keepalive_s: float | None = None
    ) -> None:
        gate = Gate(HttpSection(keepalive_s=keepalive_s), cast(AsyncClient, _Client(feed)))
        self.app = build_app(gate)
        self.path = path
        self.raw = json.dumps(body).encode()
        self.sent: list[MutableMapping[str, Any]] = []
        self._request = [{"type": "http.request", "body": self.raw, "more_body": False}]

    async def _receive(self) -> dict[str, Any]:
        if self._request:
            return self._request.pop()
        await asyncio.Event().wait()  # the client never leaves
        raise AssertionError

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        self.sent.append(message)

    def start(self) -> asyncio.Task[None]:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": self.path,
            "raw_path": self.path.encode(),
            "root_path": "",
            "query_string": b"",
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(self.raw)).encode()),
            ],
            "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8470),
        }
        return asyncio.ensure_future(self.app(scope, self._receive, self._send))

    def writes(self) -> list[bytes]:
        """Each body write's bytes (the closing empty one included)."""
        return [m["body"] for m in self.sent if m["type"] == "http.response.body"]

    async def until(self, what: str, check: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while not check():
            assert loop.time() < deadline, f"{what}; written so far: {self.writes()}"
            await asyncio.sleep(0.002)


def _events(write: bytes) -> list[Any]:
    """The SSE events of one write, each ``data:`` line decoded (``[DONE]`` as is)."""
    out: list[Any] = []
    for frame in write.split(b"\n\n"):
        if frame:
            assert frame.startswith(b"data: "), frame
            data = frame[6:]
            out.append(data.decode() if data == b"[DONE]" else msgspec.json.decode(data))
    return out


def _texts(write: bytes) -> list[str | None]:
    return [
        e["choices"][0].get("text", e["choices"][0].get("delta", {}).get("content"))
        if isinstance(e, dict) and e["choices"]
        else None
        for e in _events(write)
    ]


TEXT = {
    "model": "m",
    "prompt": [1, 2],
    "max_tokens": 2,
    "stream": True,
    "stream_options": {"include_usage": True},
}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_a_completions_first_token_is_written_before_the_next_event_comes() -> None:
    """The first token once waited for the next event (the second token, or
    the ``done`` the worker sends after the finish save): HTTP's first token
    carried a decode step or the save's packing."""

    async def run() -> None:
        feed = _Feed()
        feed.put(TokenEvent("Hel", 5))
        ex = _Exchange(feed, "/v1/completions", TEXT)
        task = ex.start()
        await ex.until("the first token written alone", lambda: len(ex.writes()) >= 1)
        assert _texts(ex.writes()[0]) == ["Hel"]
        feed.put(TokenEvent("lo", 7))
        await ex.until("the second token written", lambda: len(ex.writes()) >= 2)
        assert _texts(ex.writes()[1]) == ["lo"]
        feed.put(DoneEvent(_completion("Hello")))
        await asyncio.wait_for(task, DEADLINE_S)
        last, end = ex.writes()[2:]
        finish, usage, done = _events(last)  # the finish, the usage and [DONE]: one write
        assert finish["choices"][0]["finish_reason"] == "length"
        assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2
        assert done == "[DONE]"
        assert end == b"" and feed.closed

    asyncio.run(run())


def test_events_that_arrived_together_leave_in_one_write_every_one_its_own_chunk() -> None:
    async def run() -> None:
        feed = _Feed()
        feed.put(TokenEvent("Hel", 5), TokenEvent("lo", 7), DoneEvent(_completion("Hello")))
        ex = _Exchange(feed, "/v1/completions", TEXT)
        await asyncio.wait_for(ex.start(), DEADLINE_S)
        assert ex.writes()[1:] == [b""]
        events = _events(ex.writes()[0])
        assert _texts(ex.writes()[0]) == ["Hel", "lo", "", None, None]
        assert events[-1] == "[DONE]"

    asyncio.run(run())


def test_a_chats_role_chunk_leaves_with_its_first_token_and_nothing_waits_for_more() -> None:
    async def run() -> None:
        feed = _Feed()
        feed.put(TokenEvent("Hel", 5))
        ex = _Exchange(feed, "/v1/chat/completions", CHAT)
        task = ex.start()
        await ex.until("the role and first token written", lambda: len(ex.writes()) >= 1)
        first = _events(ex.writes()[0])
        assert [e["choices"][0]["delta"] for e in first] == [
            {"role": "assistant", "content": ""},
            {"content": "Hel"},
        ]
        feed.put(TokenEvent("lo", 7))
        await ex.until("the second token written", lambda: len(ex.writes()) >= 2)
        assert _texts(ex.writes()[1]) == ["lo"]
        feed.put(DoneEvent(_completion("Hello")))
        await asyncio.wait_for(task, DEADLINE_S)
        assert _events(ex.writes()[2])[-1] == "[DONE]" and ex.writes()[3:] == [b""]

    asyncio.run(run())


def test_a_chat_whose_first_token_is_late_begins_with_its_role_chunk() -> None:
    """A first token later than ``keepalive_s``: the response starts, and its
    role chunk goes out at once (it once waited for the token, behind pings)."""

    async def run() -> None:
        feed = _Feed()
        ex = _Exchange(feed, "/v1/chat/completions", CHAT, keepalive_s=0.01)
        task = ex.start()
        await ex.until("a first write", lambda: len(ex.writes()) >= 1)
        (role,) = _events(ex.writes()[0])
        assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        feed.put(TokenEvent("Hel", 5))
        await ex.until("the token written", lambda: b"Hel" in b"".join(ex.writes()))
        feed.put(DoneEvent(_completion("Hel")))
        await asyncio.wait_for(task, DEADLINE_S)
        # Whatever pings came between, every chunk came once and in order.
        data = b"".join(w for w in ex.writes() if not w.startswith(b": ping"))
        deltas = [e["choices"][0]["delta"] for e in _events(data)[:-1]]
        assert deltas == [{"role": "assistant", "content": ""}, {"content": "Hel"}, {}]

    asyncio.run(run())


def _anthropic(write: bytes) -> list[str]:
    """The event names of one write of an Anthropic stream."""
    names = []
    for frame in write.split(b"\n\n"):
        if frame:
            head, _, data = frame.partition(b"\n")
            assert head.startswith(b"event: ") and data.startswith(b"data: "), frame
            names.append(head[7:].decode())
    return names


def test_an_anthropic_stream_gathers_what_is_here_and_waits_for_nothing() -> None:
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }

    async def run() -> None:
        feed = _Feed()
        feed.put(TokenEvent("Hel", 5))
        ex = _Exchange(feed, "/v1/messages", body)
        task = ex.start()
        await ex.until("the start and first token written", lambda: len(ex.writes()) >= 1)
        assert _anthropic(ex.writes()[0]) == [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
        ]
        feed.put(TokenEvent("lo", 7))
        await ex.until("the second token written", lambda: len(ex.writes()) >= 2)
        assert _anthropic(ex.writes()[1]) == ["content_block_delta"]
        feed.put(TokenEvent("!", 8), DoneEvent(_completion("Hello!")))
        await asyncio.wait_for(task, DEADLINE_S)
        assert _anthropic(ex.writes()[2]) == [
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
        assert ex.writes()[3:] == [b""]

    asyncio.run(run())


def _lines(write: bytes) -> list[dict[str, Any]]:
    """The NDJSON lines of one write of an Ollama stream."""
    assert write.endswith(b"\n"), write
    return [msgspec.json.decode(line) for line in write.split(b"\n") if line]


def test_an_ollama_stream_gathers_what_is_here_and_waits_for_nothing() -> None:
    """Ollama's NDJSON once went out one line per write; now as the OpenAI
    stream: what arrived together leaves in one write, nothing waits."""
    body = {"model": "m", "prompt": "hi", "stream": True}

    async def run() -> None:
        feed = _Feed()
        feed.put(TokenEvent("Hel", 5))
        ex = _Exchange(feed, "/api/generate", body)
        task = ex.start()
        await ex.until("the first token written alone", lambda: len(ex.writes()) >= 1)
        assert [line["response"] for line in _lines(ex.writes()[0])] == ["Hel"]
        feed.put(TokenEvent("lo", 7), TokenEvent("!", 8), DoneEvent(_completion("Hello!")))
        await asyncio.wait_for(task, DEADLINE_S)
        last, end = ex.writes()[1:]
        lines = _lines(last)  # two tokens and the done line: one write
        assert [line["response"] for line in lines] == ["lo", "!", ""]
        assert [line["done"] for line in lines] == [False, False, True]
        assert end == b""

    asyncio.run(run())


def _named(write: bytes) -> list[str]:
    """The event types of one write of a Responses stream."""
    return [
        e["type"]
        for e in (
            msgspec.json.decode(f.partition(b"\ndata: ")[2]) for f in write.split(b"\n\n") if f
        )
    ]


def test_a_responses_stream_gathers_what_is_here_and_waits_for_nothing() -> None:
    body = {"model": "m", "input": "hi", "stream": True, "store": False}

    async def run() -> None:
        feed = _Feed()
        feed.put(TokenEvent("Hel", 5))
        ex = _Exchange(feed, "/v1/responses", body)
        task = ex.start()
        await ex.until("the opening and first token written", lambda: len(ex.writes()) >= 1)
        assert _named(ex.writes()[0]) == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
        ]
        feed.put(TokenEvent("lo", 7))
        await ex.until("the second token written", lambda: len(ex.writes()) >= 2)
        assert _named(ex.writes()[1]) == ["response.output_text.delta"]
        feed.put(TokenEvent("!", 8), DoneEvent(_completion("Hello!")))
        await asyncio.wait_for(task, DEADLINE_S)
        last, end = ex.writes()[2:]
        assert _named(last) == [
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.incomplete",  # max_tokens reached (finish_reason length)
        ]
        assert end == b""

    asyncio.run(run())
