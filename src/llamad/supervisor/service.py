"""A supervisor's dynamic API as actor ops, so other processes can drive it.

The daemon's front starts and stops model workers under ``model_sup``, which
is a supervisor in its own process. :class:`SupervisorService` serves that
supervisor's ``start_child`` / ``terminate_child`` / ``restart_child`` /
``delete_child`` / ``which_children`` / ``count_children`` as ops of an actor
registered under a name; :class:`SupervisorClient` calls them and returns the
same types (and raises the same typed errors) as the in-process API.

The actor runs on its own thread and calls the supervisor's thread-safe API,
which executes on the supervisor's loop thread. Like an OTP supervisor, the
service answers one request at a time: a ``start_child`` that waits for a
model to load delays a ``which_children`` behind it.

For a nested supervisor, pass ``service="model_sup"`` to
:func:`~llamad.supervisor.spec.supervisor_child`; the service comes up after
the supervisor's initial children started and before it reports ready.

The ``events`` stream op is the subscription to the supervisor's decisions
(:mod:`llamad.supervisor.events`): each event of the stream is one
:data:`~llamad.supervisor.events.SupervisorEvent`, starting after the ``seq``
the subscriber names (``since=0``: every event still kept, so a test or a
reconnecting ``status`` misses nothing; no ``since``: only new ones). The
stream ends (``END``, body ``{"last_seq": n}``) when the service stops, after
the supervisor's final events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any

import msgspec
import structlog

from llamad.actors import (
    Actor,
    Client,
    Handler,
    OpKind,
    OpSpec,
    Registry,
    Request,
    StreamCall,
    StreamSender,
)
from llamad.supervisor import errors as _errors  # registers the error codes for clients
from llamad.supervisor.core import ChildCounts, ChildInfo, StartedChild
from llamad.supervisor.errors import ChildNotFound
from llamad.supervisor.events import SupervisorEvent
from llamad.supervisor.spec import ChildSpec
from llamad.supervisor.supervisor_proc import Supervisor

__all__ = ["EventSubscription", "SupervisorClient", "SupervisorService"]

log = structlog.get_logger("llamad.supervisor")

_ = _errors


class StartChildBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``start_child``: a full spec (static supervisors) or extra args (dynamic)."""

    spec: dict[str, Any] | None = None
    args: list[Any] | None = None
    child_id: str | None = None


class ChildRefBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``terminate_child``: a child id, or a pid."""

    child: str | int


class ChildIdBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``restart_child`` / ``delete_child``."""

    child_id: str


class EventsBody(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``events``: stream events with a ``seq`` above ``since`` (``None``: new ones only)."""

    since: Annotated[int, msgspec.Meta(ge=0)] | None = None


OPS = (
    OpSpec("start_child", OpKind.CALL, body=StartChildBody, doc="start a child; its id and pid"),
    OpSpec("terminate_child", OpKind.CALL, body=ChildRefBody, doc="stop a child"),
    OpSpec("restart_child", OpKind.CALL, body=ChildIdBody, doc="start a kept spec again"),
    OpSpec("delete_child", OpKind.CALL, body=ChildIdBody, doc="forget a kept spec"),
    OpSpec("which_children", OpKind.CALL, body=None, doc="children in start order"),
    OpSpec("count_children", OpKind.CALL, body=None, doc="specs, active, types"),
    OpSpec("events", OpKind.STREAM, body=EventsBody, doc="the supervisor's decisions"),
)


class SupervisorService:
    """Serve ``supervisor``'s dynamic API as actor ``name`` on a background thread."""

    def __init__(
        self,
        supervisor: Supervisor,
        name: str,
        *,
        registry: Registry | None = None,
        endpoint: str | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.name = name
        self._registry = registry
        self._endpoint = endpoint
        self._actor: Actor | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.endpoint = ""
        #: Open ``events`` streams and the last ``seq`` each has been sent.
        #: Touched only on the actor's thread.
        self._subscribers: dict[StreamSender, int] = {}

    def start(self) -> str:
        """Bind and register the actor (on its thread); return its endpoint."""
        self._thread = threading.Thread(target=self._serve, name=f"sup-service-{self.name}")
        self._thread.daemon = True
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            self._thread.join()
            raise self._error
        return self.endpoint

    def stop(self) -> None:
        """Stop serving (requests in flight are failed by the actor) and join."""
        if self._actor is not None:
            self._actor.request_stop()
        if self._thread is not None:
            self._thread.join()

    def _serve(self) -> None:
        # ZeroMQ state is created, used and closed on this one thread.
        actor = Actor(self.name, endpoint=self._endpoint, registry=self._registry)
        handlers: dict[str, Handler] = {
            "start_child": self._start_child,
            "terminate_child": self._terminate_child,
            "restart_child": self._restart_child,
            "delete_child": self._delete_child,
            "which_children": self._which_children,
            "count_children": self._count_children,
            "events": self._events,
        }
        for spec in OPS:
            actor.add_op(spec, handlers[spec.name])
        try:
            self.endpoint = actor.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._actor = actor
        # The feed calls this on the supervisor's loop thread; waking the
        # actor is thread-safe, and the loop below then forwards new events.
        unsubscribe: Callable[[], None] = self.supervisor.events.subscribe(actor.wake)
        self._ready.set()
        log.info("sup.service_started", sup=self.supervisor.name, actor=self.name)
        try:
            while not actor.stop_requested:
                actor.poll(None)
                self._forward_events()
        finally:
            # Unsubscribed before the actor closes its wake pipe, so the
            # supervisor never writes to a closed (maybe reused) fd.
            unsubscribe()
            # The supervisor's final events (sup.stopped) are published before
            # the service is stopped: subscribers get them, then a clean end.
            if actor.running:
                self._forward_events()
                last = self.supervisor.events.last_seq
                for sender in list(self._subscribers):
                    sender.end({"last_seq": last})
            self._subscribers.clear()
            actor.close()
            log.info("sup.service_stopped", sup=self.supervisor.name, actor=self.name)

    def _forward_events(self) -> None:
        feed = self.supervisor.events
        for sender, sent in list(self._subscribers.items()):
            if sender.done:
                del self._subscribers[sender]
                continue
            last = sent
            for event in feed.since(sent):
                if not sender.emit(event):
                    break
                last = event.seq
            self._subscribers[sender] = last

    # -- handlers (run on the service thread) --------------------------------

    def _start_child(self, req: Request[StartChildBody]) -> StartedChild:
        body = req.body
        child: ChildSpec | Sequence[Any] = (
            ChildSpec.from_wire(body.spec, "spec") if body.spec is not None else body.args or []
        )
        return self.supervisor.start_child(child, child_id=body.child_id)

    def _terminate_child(self, req: Request[ChildRefBody]) -> None:
        self.supervisor.terminate_child(req.body.child)

    def _restart_child(self, req: Request[ChildIdBody]) -> dict[str, Any]:
        return {"pid": self.supervisor.restart_child(req.body.child_id)}

    def _delete_child(self, req: Request[ChildIdBody]) -> None:
        self.supervisor.delete_child(req.body.child_id)

    def _which_children(self, req: Request[None]) -> list[ChildInfo]:
        return self.supervisor.which_children()

    def _count_children(self, req: Request[None]) -> ChildCounts:
        return self.supervisor.count_children()

    def _events(self, req: Request[EventsBody]) -> None:
        since = req.body.since
        sender = req.stream()
        self._subscribers[sender] = self.supervisor.events.last_seq if since is None else since

        def forget(reason: str) -> None:
            self._subscribers.pop(sender, None)

        sender.on_cancel(forget)
        # Kept events go out now, not at the next publication.
        self._forward_events()


class SupervisorClient:
    """Call a :class:`SupervisorService` by actor name (or endpoint).

    Methods mirror :class:`~llamad.supervisor.supervisor_proc.Supervisor`'s and raise
    the same typed errors. Not thread-safe (like the actor client it wraps).
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        endpoint: str | None = None,
        registry: Registry | None = None,
        timeout: float | None = None,
    ) -> None:
        # No call timeout by default: a start waits for the child to report
        # ready, bounded by its own start_timeout. A caller that gives up early
        # does not cancel the start; the child may still come up.
        self._client = Client(endpoint, name=name, registry=registry, timeout=timeout)

    def start_child(
        self, child: ChildSpec | Sequence[Any], *, child_id: str | None = None
    ) -> StartedChild:
        """Start a child; its id and pid once it is ready (as ``Supervisor.start_child``)."""
        if isinstance(child, ChildSpec):
            body: dict[str, Any] = {"spec": child.to_wire(), "child_id": child_id}
        else:
            body = {"args": list(child), "child_id": child_id}
        reply: StartedChild = self._client.call("start_child", body, reply_type=StartedChild)
        return reply

    def terminate_child(self, child: str | int) -> None:
        self._client.call("terminate_child", {"child": child})

    def restart_child(self, child_id: str) -> int:
        reply = self._client.call("restart_child", {"child_id": child_id})
        return int(reply["pid"])

    def delete_child(self, child_id: str) -> None:
        self._client.call("delete_child", {"child_id": child_id})

    def which_children(self) -> list[ChildInfo]:
        rows: list[ChildInfo] = self._client.call(
            "which_children", None, reply_type=list[ChildInfo]
        )
        return rows

    def count_children(self) -> ChildCounts:
        counts: ChildCounts = self._client.call("count_children", None, reply_type=ChildCounts)
        return counts

    def subscribe(
        self, since: int | None = None, *, timeout: float | None = None
    ) -> EventSubscription:
        """Stream the supervisor's events with a ``seq`` above ``since``.

        ``since=0`` replays every event the supervisor still keeps (then the
        new ones); ``None`` streams new events only. ``timeout`` bounds each
        wait for the next event (:class:`~llamad.errors.RequestTimeout`).
        """
        stream = self._client.stream(
            "events", {"since": since}, timeout=timeout, event_type=SupervisorEvent
        )
        return EventSubscription(stream)

    def pid_of(self, child_id: str) -> int:
        """The pid ``child_id`` runs as now (it changes when the child restarts)."""
        for info in self.which_children():
            if info.id == child_id and info.pid is not None:
                return info.pid
        raise ChildNotFound(f"no running child {child_id!r}", details={"child": child_id})

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SupervisorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventSubscription:
    """An open ``events`` stream: iterate for :data:`SupervisorEvent` values.

    Iteration stops when the service ends the stream (the supervisor
    stopped); leaving a ``with`` block or :meth:`cancel` unsubscribes.
    """

    def __init__(self, stream: StreamCall) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[SupervisorEvent]:
        return self

    def __next__(self) -> SupervisorEvent:
        event: SupervisorEvent = next(self._stream).body
        return event

    def cancel(self) -> None:
        self._stream.cancel()

    def __enter__(self) -> EventSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
