"""Server-sent events for every protocol: a stream response that watches its client.

:class:`EventStream` sends each ``bytes`` its iterator yields as one body
chunk (the protocol frames them: OpenAI's ``data: {...}\\n\\n``, Anthropic's
``event: ...\\ndata: ...\\n\\n``, Ollama's NDJSON lines) and, beside it,
waits for the connection's ``http.disconnect``: the moment the client goes,
the task pumping the iterator (the request's own) is cancelled, which
cancels the llamad stream inside it (CANCEL to the worker). uvicorn sends
nothing to a closed connection and raises nothing either, so without that
watch a stream whose client left would run to its end.

**Keep-alive.** With ``ping_s``, a stream that sent nothing for that long
gets ``ping`` (an SSE comment, ``: ping``, which every SSE reader skips), so
a proxy with a read timeout keeps a long prefill or a held tool call open.
One task sleeps beside the stream until the last write is ``ping_s`` old;
the stream itself only notes the time of each write.

Leaner than sse-starlette's response (the stream pumped in the request's
task, a watch beside it, no shutdown poller, no task group): it keeps the
gateway's cost to the first token and per token small
(``docs/internals/gateway.md``).
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
        self._gone = False  # the client left: the pump was cancelled for it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        loop = asyncio.get_running_loop()
        self._last = loop.time()
        # The stream is pumped in the request's own task, so its first chunk
        # (here already when the response starts) is written now, not a loop
        # turn later from a task of its own; the watch cancels this task the
        # moment the client goes.
        here = asyncio.current_task()
        assert here is not None
        watchers = [loop.create_task(self._watch(receive, here))]
        if self.ping_s:
            watchers.append(loop.create_task(self._pings(send, self.ping_s)))
        try:
            await self._pump(send)
        except asyncio.CancelledError:
            if not self._gone:
                raise  # cancelled from outside (the server stopping): not ours to end
            here.uncancel()  # the watch's cancel, spent: the response just ends
        finally:
            for task in watchers:
                task.cancel()
            for task in watchers:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _watch(self, receive: Receive, pumping: asyncio.Task[None]) -> None:
        await wait_disconnect(receive)
        if not self._ended:
            self._gone = True
            pumping.cancel()

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
