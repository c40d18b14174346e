"""A running ``infer`` request as an async iterator of typed events.

The same events and terminal as :class:`llamad.client.stream.Stream`: the
``token`` / ``thinking`` / ``tool_call`` events, then one
:class:`~llamad.model.results.DoneEvent` with the
:class:`~llamad.model.results.Completion`, or the typed error raised.

Leaving early cancels the request on the worker: ``break`` out of
``async for`` (asyncio closes the abandoned iterator), an exception, the
consuming task being cancelled, the ``async with`` block's end,
:meth:`AsyncStream.close`, or the stream being garbage collected. Then
:meth:`AsyncStream.completion` raises :class:`~llamad.errors.Cancelled`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from llamad.actors.aio_client import AsyncStreamCall
from llamad.client.base import StreamBase, StreamEvent
from llamad.errors import LlamadError
from llamad.model.results import Completion, DoneEvent

__all__ = ["AsyncStream"]


class AsyncStream(StreamBase):
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
        on_error: Callable[[LlamadError], None] | None = None,
        endpoint: str = "",
        reopen: Callable[[LlamadError], Awaitable[tuple[str, AsyncStreamCall] | None]]
        | None = None,
    ) -> None:
        super().__init__(
            model_id=model_id,
            request_id=request_id,
            idle_timeout=idle_timeout,
            on_end=on_end,
            on_error=on_error,
            endpoint=endpoint,
        )
        self._call = call
        self._cancel = cancel
        self._reopen = reopen
        self._own: AsyncIterator[StreamEvent] | None = None

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._events()

    async def __anext__(self) -> StreamEvent:
        if self._own is None:
            self._own = self._events()
        return await anext(self._own)

    async def completion(self) -> Completion:
        """Consume the remaining events; the :class:`Completion` (or raise the error).

        As :meth:`llamad.client.stream.Stream.completion`: on a stream already
        closed (``break``, :meth:`close`, the ``async with`` block's end) it
        raises :class:`~llamad.errors.Cancelled` (``details["reason"] ==
        "closed"``).
        """
        async for _ in self._events():
            pass
        return self._outcome()

    def buffered(self) -> int:
        """How many of the next events (the ``done`` one included) have arrived
        already: that many ``anext`` calls return without waiting. A consumer
        that forwards events (the HTTP gateway) writes those together."""
        return 0 if self.finished else self._call.buffered()

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
            return self._done(call.result)
        except LlamadError as exc:
            if self._events_seen == 0 and self._reopen is not None:
                # As the blocking Stream: sent again elsewhere, nothing streamed.
                again = await self._reopen(exc)
                if again is not None:
                    self.endpoint, self._call = again
                    return await self._pull()
            self._failed(exc)
            raise
        return self._arrived(call, event)
