"""Server-sent events for every protocol: a stream response that watches its client.

:class:`EventStream` sends each ``bytes`` its iterator yields as one body
chunk (the protocol frames them: OpenAI's ``data: {...}\\n\\n``, Anthropic's
``event: ...\\ndata: ...\\n\\n``, Ollama's NDJSON lines) and, beside it,
waits for the connection's ``http.disconnect``: the moment the client goes,
the iterator's task is cancelled, which cancels the llamad stream inside it
(CANCEL to the worker). uvicorn sends nothing to a closed connection and
raises nothing either, so without that watch a stream whose client left
would run to its end.

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

__all__ = ["EventStream", "wait_disconnect"]


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
    ) -> None:
        super().__init__(
            chunks,
            200,
            {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
            media_type,
        )
        self.chunks = chunks

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        pump = asyncio.ensure_future(self._pump(send))
        gone = asyncio.ensure_future(wait_disconnect(receive))
        try:
            await asyncio.wait((pump, gone), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, gone):
                if not task.done():
                    task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        if pump.cancelled():
            with contextlib.suppress(asyncio.CancelledError):
                await pump
            return
        pump.result()

    async def _pump(self, send: Send) -> None:
        async for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
