"""Server-sent events for every protocol: a stream response that watches its client.

:class:`EventStream` sends each ``bytes`` its iterator yields as one body
chunk (the protocol frames them: OpenAI's ``data: {...}\\n\\n``, Anthropic's
``event: ...\\ndata: ...\\n\\n``, Ollama's NDJSON lines) and, beside it,
waits for the connection's ``http.disconnect``: the moment the client goes,
the iterator's task is cancelled, which cancels the llamad stream inside it
(CANCEL to the worker). uvicorn sends nothing to a closed connection and
raises nothing either, so without that watch a stream whose client left
would run to its end.

**Keep-alive.** With ``ping_s``, a stream that sent nothing for that long
gets ``ping`` (an SSE comment, ``: ping``, which every SSE reader skips), so
a proxy with a read timeout keeps a long prefill or a held tool call open.
One task sleeps beside the stream until the last write is ``ping_s`` old;
the stream itself only notes the time of each write.

Leaner than sse-starlette's response (one task beside the stream, no
shutdown poller, no task group): it keeps the gateway's cost to the first
token and per token small (``docs/internals/gateway.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["PING", "EventStream", "gathered", "wait_disconnect"]

PING = b": ping\n\n"
"""An SSE comment line: ignored by SSE readers, seen as traffic by proxies."""


async def gathered(frames: AsyncIterator[bytes | None], last: bytes = b"") -> AsyncIterator[bytes]:
    """``frames`` joined into writes, one ending at each ``None`` (the next
    event has not arrived: write what is here now), ``last`` with the final
    one. So what arrived together leaves together, and no frame waits for an
    event still to come (a protocol yields ``None`` when its stream's
    ``OpenStream.ready()`` says so; ``docs/internals/gateway.md``)."""
    out: list[bytes] = []
    async for frame in frames:
        if frame is not None:
            out.append(frame)
        elif out:
            joined, out = b"".join(out), []
            yield joined
    if last:
        out.append(last)
    if out:
        yield b"".join(out)


async def wait_disconnect(receive: Receive) -> None:
    """Return once the client has gone (after the request's body)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStream(StreamingResponse):
    """A ``text/event-stream`` (or ``media_type``) response of ``chunks``."""

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        *,
        media_type: str = "text/event-stream",
        headers: Mapping[str, str] | None = None,
        ping_s: float | None = None,
        ping: bytes = PING,
    ) -> None:
        super().__init__(
            chunks,
            200,
            {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
            media_type,
        )
        self.chunks = chunks
        self.ping_s = ping_s
        self.ping = ping
        self._last = 0.0  # the loop's time of the last write
        self._ended = False  # the last body message is sent: no ping after it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        self._last = asyncio.get_running_loop().time()
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(wait_disconnect(receive))
        tasks = [pump, gone]
        if self.ping_s:
            tasks.append(asyncio.ensure_future(self._pings(send, self.ping_s)))
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            for task in tasks[1:]:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if pump.cancelled():
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            return
        pump.result()

    async def _pump(self, send: Send) -> None:
        loop = asyncio.get_running_loop()
        async for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            self._last = loop.time()
        self._ended = True
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pings(self, send: Send, every: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            wait = self._last + every - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            if self._ended:
                return
            self._last = loop.time()
            await send({"type": "http.response.body", "body": self.ping, "more_body": True})
