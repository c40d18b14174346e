"""Where each request's events go: its client's stream or deferred reply (SPEC M7).

The core produces ``(request_id, event)`` pairs; the shell hands each to the
request's :class:`Delivery`. An ``infer`` stream gets every ``token``,
``thinking`` and ``tool_call`` event as an actor ``EVENT``, then its terminal:
``done`` becomes the stream's ``END`` with the :class:`Completion` as body,
``error`` becomes the stream's ``ERROR`` with the typed error rebuilt from the
event (so the client raises the class the core raised). A ``complete`` or
``prefill_only`` call gets only the terminal, as its reply or error.

When the client goes away (cancels, closes, dies), the actor runtime cancels
its handle; the callback given to :meth:`Deliveries.add` then cancels the
request in the core, which ends it at the next tick and frees its sequence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from llamad.errors import from_wire
from llamad.model.results import DoneEvent, ErrorEvent, Event

__all__ = ["Deliveries", "Delivery", "ReplyHandle", "StreamHandle"]

log = structlog.get_logger("llamad.model")


class _Handle(Protocol):
    @property
    def done(self) -> bool: ...

    def fail(self, error: BaseException) -> bool: ...

    def on_cancel(self, callback: Callable[[str], None]) -> None: ...


class StreamHandle(_Handle, Protocol):
    """What :class:`llamad.actors.StreamSender` offers a delivery."""

    def emit(self, body: Any = None, blobs: Any = ()) -> bool: ...

    def end(self, body: Any = None, blobs: Any = ()) -> bool: ...


class ReplyHandle(_Handle, Protocol):
    """What :class:`llamad.actors.PendingReply` offers a delivery."""

    def reply(self, body: Any = None, blobs: Any = ()) -> bool: ...


@dataclass(eq=False, slots=True)
class Delivery:
    request_id: str
    stream: StreamHandle | None
    reply: ReplyHandle | None

    def send(self, event: Event) -> bool:
        """Send ``event``; True when it was the terminal one."""
        if isinstance(event, DoneEvent):
            if self.stream is not None:
                self.stream.end(event.result)
            elif self.reply is not None:
                self.reply.reply(event.result)
            return True
        if isinstance(event, ErrorEvent):
            error = from_wire(
                {"code": event.code, "message": event.message, "details": event.details}
            )
            handle: _Handle | None = self.stream if self.stream is not None else self.reply
            if handle is not None:
                handle.fail(error)
            return True
        if self.stream is not None:
            self.stream.emit(event)
        return False


class Deliveries:
    """Open requests by id, and the client end each one answers to."""

    def __init__(self) -> None:
        self._open: dict[str, Delivery] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._open

    def add_stream(
        self, request_id: str, handle: StreamHandle, on_gone: Callable[[str], None]
    ) -> None:
        self._add(Delivery(request_id, handle, None), handle, on_gone)

    def add_reply(
        self, request_id: str, handle: ReplyHandle, on_gone: Callable[[str], None]
    ) -> None:
        self._add(Delivery(request_id, None, handle), handle, on_gone)

    def _add(self, delivery: Delivery, handle: _Handle, on_gone: Callable[[str], None]) -> None:
        request_id = delivery.request_id
        self._open[request_id] = delivery

        def gone(reason: str) -> None:
            # Only if this delivery is still the request's (an id may be reused
            # once its request ended).
            if self._open.get(request_id) is delivery:
                del self._open[request_id]
                log.info("model.client_gone", request_id=request_id, reason=reason)
                on_gone(request_id)

        handle.on_cancel(gone)

    def deliver(self, request_id: str, event: Event) -> None:
        delivery = self._open.get(request_id)
        if delivery is not None and delivery.send(event):
            self._open.pop(request_id, None)

    def forget(self, request_id: str) -> None:
        self._open.pop(request_id, None)
