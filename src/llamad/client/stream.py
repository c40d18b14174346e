"""A running ``infer`` request as an iterator of typed events (SPEC D3, M7).

Iterating a :class:`Stream` yields, in order, the request's ``token``,
``thinking`` and ``tool_call`` events (:mod:`llamad.model.results`), then
exactly one :class:`~llamad.model.results.DoneEvent` carrying the
:class:`~llamad.model.results.Completion`; the iteration stops after it. A
request that fails raises its typed error from the iteration instead (and
keeps it in :attr:`Stream.error`): every stream ends with exactly one
terminal, the ``done`` event or the exception.

Leaving early cancels the request on the worker, which frees its sequence:
``break`` (the loop's iterator is closed), an exception out of the loop, the
``with`` block's end, :meth:`Stream.close`, or the stream being garbage
collected. :meth:`Stream.cancel` instead asks the worker to stop and lets the
iteration run on to a ``done`` whose ``finish_reason`` is ``cancelled`` (the
partial reply included). :meth:`Stream.completion` on a stream left early
raises :class:`~llamad.errors.Cancelled`: it has no result.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from llamad.actors.client import StreamCall
from llamad.client.base import StreamBase, StreamEvent
from llamad.errors import LlamadError
from llamad.model.results import Completion, DoneEvent

if TYPE_CHECKING:
    from llamad.client.sync import Client

__all__ = ["Stream", "StreamEvent"]


class Stream(StreamBase):
    """A running ``infer`` request; iterate it for events (see the module doc).

    ``request_id`` names it for :meth:`Client.cancel` from any thread;
    ``model_id`` is the model serving it. :attr:`result` is the
    :class:`Completion` once the ``done`` event has arrived.
    """

    def __init__(
        self,
        client: Client,
        call: StreamCall,
        *,
        model_id: str,
        request_id: str,
        idle_timeout: float | None,
        on_end: Callable[[str], None],
        on_error: Callable[[LlamadError], None] | None = None,
        endpoint: str = "",
        reopen: Callable[[LlamadError], tuple[str, StreamCall] | None] | None = None,
    ) -> None:
        super().__init__(
            model_id=model_id,
            request_id=request_id,
            idle_timeout=idle_timeout,
            on_end=on_end,
            on_error=on_error,
            endpoint=endpoint,
        )
        self._client = client
        self._call: StreamCall | None = call
        self._reopen = reopen
        self._thread = threading.get_ident()
        self._own: Iterator[StreamEvent] | None = None

    def __iter__(self) -> Iterator[StreamEvent]:
        return self._events()

    def __next__(self) -> StreamEvent:
        self._check_thread()
        if self._own is None:
            self._own = self._events()
        return next(self._own)

    def completion(self) -> Completion:
        """Consume the remaining events; the :class:`Completion` (or raise the error).

        On a stream already closed (a ``break`` out of its loop, :meth:`close`,
        the ``with`` block's end) it raises :class:`~llamad.errors.Cancelled`
        (``details["reason"] == "closed"``): the request was cancelled when the
        stream was left and no :class:`Completion` came. For the partial reply,
        :meth:`cancel` instead and read on.
        """
        for _ in self._events():
            pass
        return self._outcome()

    def cancel(self) -> bool:
        """Ask the worker to stop the request; keep iterating for the ``done``
        event (``finish_reason`` ``cancelled``). False when it had already ended."""
        if self.finished:
            return False
        return self._client.cancel(self.request_id, model_id=self.model_id)

    def close(self) -> None:
        """Stop consuming: the worker cancels the request. Idempotent."""
        if self.finished:
            return
        call, self._call = self._call, None
        if call is not None and threading.get_ident() == self._thread:
            call.cancel()
        # Elsewhere (a collection on another thread) the socket is not ours to
        # touch: dropping the StreamCall makes the actor client cancel it at
        # its owner thread's next operation.
        self._ended()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _events(self) -> Iterator[StreamEvent]:
        self._check_thread()
        try:
            while not self.finished:
                event = self._pull()
                yield event
                if isinstance(event, DoneEvent):
                    return
        finally:
            # A consumer that left the loop (break, an exception, the
            # iterator collected) abandons the request.
            self.close()

    def _pull(self) -> StreamEvent:
        call = self._call
        assert call is not None, "an open stream holds its call"
        try:
            message = next(call)
        except StopIteration:
            return self._done(call.result)
        except LlamadError as exc:
            if self._events_seen == 0 and self._reopen is not None:
                # Nothing was streamed: a client of several daemons sends it
                # again elsewhere when its daemon died (``reopen`` says).
                again = self._reopen(exc)
                if again is not None:
                    self.endpoint, self._call = again
                    return self._pull()
            self._failed(exc)
            raise
        return self._arrived(call, message.body)

    def _check_thread(self) -> None:
        if threading.get_ident() != self._thread:
            # Its socket belongs to the opening thread's connection, which is
            # not thread-safe; cancel() and Client.cancel() work from anywhere.
            # Refused before the iteration starts, so the stream stays usable.
            raise RuntimeError("a Stream is consumed on the thread that opened it")
