"""A running ``infer`` request as an async iterator of typed events.

The same events and terminal as :class:`llamad.client.stream.Stream`: the
``token`` / ``thinking`` / ``tool_call`` events, then one
:class:`~llamad.model.results.DoneEvent` with the
:class:`~llamad.model.results.Completion`, or the typed error raised.

Leaving early cancels the request on the worker: ``break`` out of
``async for`` (asyncio closes the abandoned iterator), an exception, the
consuming task being cancelled, the ``async with`` block's end,
:meth:`AsyncStream.close`, or the stream being garbage collected.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import msgspec

from llamad.actors.aio_client import AsyncStreamCall
from llamad.client.stream import StreamEvent
from llamad.errors import LlamadError
from llamad.model.results import Completion, DoneEvent

__all__ = ["AsyncStream"]


class AsyncStream:
    """A running ``infer`` request; ``async for`` its events (see the module doc)."""

    def __init__(
        self,
        call: AsyncStreamCall,
        *,
        model_id: str,
        request_id: str,
        idle_timeout: float | None,
        cancel: Callable[[str, str], Coroutine[Any, Any, bool]],
        on_end: Callable[[str], None],
    ) -> None:
        self._call = call
        self.model_id = model_id
        self.request_id = request_id
        self._idle_timeout = idle_timeout
        self._cancel = cancel
        self._on_end: Callable[[str], None] | None = on_end
        self._events_seen = 0
        self._own: AsyncIterator[StreamEvent] | None = None
        self.result: Completion | None = None
        self.error: LlamadError | None = None

    @property
    def finished(self) -> bool:
        """Whether the terminal (``done`` or an error) arrived, or the stream was closed."""
        return self._on_end is None

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def __anext__(self) -> StreamEvent:
        if self._own is None:
            self._own = self._events()
        return await anext(self._own)

    async def completion(self) -> Completion:
        """Consume the remaining events; the :class:`Completion` (or raise the error)."""
        async for _ in self._events():
            pass
        if self.result is None:
            assert self.error is not None, "a stream ends with a result or an error"
            raise self.error
        return self.result

    async def cancel(self) -> bool:
        """Ask the worker to stop; keep iterating for the ``done`` event
        (``finish_reason`` ``cancelled``). False when it had already ended."""
        if self.finished:
            return False
        return await self._cancel(self.request_id, self.model_id)

    def close(self) -> None:
        """Stop consuming: the worker cancels the request. Idempotent."""
        if not self.finished:
            self._call.cancel()
            self._ended()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> AsyncStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        # The stream call cancels itself on the worker when collected.
        if self._on_end is not None:
            self._ended()

    async def _events(self) -> AsyncIterator[StreamEvent]:
        try:
            while not self.finished:
                event = await self._pull()
                yield event
                if isinstance(event, DoneEvent):
                    return
        finally:
            self.close()

    async def _pull(self) -> StreamEvent:
        call = self._call
        try:
            event: StreamEvent = await call.__anext__()
        except StopAsyncIteration:
            assert call.result is not None
            self.result = msgspec.msgpack.decode(call.result, type=Completion)
            self._ended()
            return DoneEvent(result=self.result)
        except LlamadError as exc:
            self.error = exc
            self._ended()
            raise
        if self._events_seen == 0:
            call.timeout = self._idle_timeout
        self._events_seen += 1
        return event

    def _ended(self) -> None:
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end(self.request_id)
