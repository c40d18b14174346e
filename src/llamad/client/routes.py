"""Where a model is served, and the retry rule: the clients' connections.

A client holds one connection to the daemon's front (the control plane) and
one per routed model to that model's worker actor, found by the front's
``route`` answer (actor name and registry) and cached. :class:`Links` is
that set for the blocking client (one per thread: an actors client is
single-threaded); :class:`AsyncLinks` for the asyncio client. Both carry out
one rule, whose decisions their common base makes (each adds only the
waiting, so they cannot drift):

- **before sending**, a worker that is gone (no live registry record, or a
  send refused with ``unavailable`` while not connected: unloaded by
  keep_alive, restarting, the daemon restarted) is routed again (the front
  reloads an expired model) and the request retried once, the second time
  waiting up to ``connect_timeout`` for the worker;
- **once sent**, the outcome is the caller's: a worker that dies raises
  ``WorkerCrashed``, and a generation is never resent;
- a front op refused before sending (the daemon down or restarting) waits
  up to ``connect_timeout`` for the front once; ``route`` is idempotent and
  is asked again after a front crash;
- ``connect_timeout`` bounds all the waiting for connections of one call,
  the retry's included: the retry waits for what its first attempt left
  (an endpoint that never answers fails after ``connect_timeout``, not
  twice that).

The transport follows the front's: a client of an ``ipc://`` front reaches
the worker by name in the registry (its ipc socket); a client of a
``tcp://`` front, which may be on another host and cannot read the
registry, connects to the worker's own tcp port (``Route.tcp_port``) on the
host it reached the front through, with its CURVE keypair and the route's
server key when the daemon serves CURVE.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Generic, Protocol, TypeVar

import zmq

from llamad.actors.aio_client import AsyncActorClient
from llamad.actors.client import Client as ActorClient
from llamad.actors.curve import CurveClient
from llamad.actors.registry import Registry
from llamad.actors.sockets import FORKS
from llamad.client import bodies as ops
from llamad.errors import Unavailable, WorkerCrashed
from llamad.front.wire import Route

__all__ = ["AsyncLinks", "Links"]

T = TypeVar("T")


class _Actor(Protocol):
    @property
    def connected(self) -> bool: ...

    def close(self) -> None: ...


A = TypeVar("A", bound=_Actor)


class _Worker(Generic[A]):
    """A connection to the worker a route names."""

    __slots__ = ("actor", "registry", "route")

    def __init__(self, route: Route, actor: A, registry: Registry | None) -> None:
        self.route = route
        self.actor = actor
        self.registry = registry

    def gone(self) -> bool:
        """Not connected, and no live process is registered under the route's
        name (a worker reached over tcp is probed by its connect instead)."""
        return self.registry is not None and self.registry.lookup(self.route.actor) is None


def _worker_target(
    front_endpoint: str, route: Route, curve: CurveClient | None
) -> tuple[dict[str, Any], Registry | None]:
    """How to reach the worker ``route`` names: the actors client's arguments
    and, for a worker found by name, its registry (see the module doc)."""
    if front_endpoint.startswith("tcp://") and route.tcp_port is not None:
        host = front_endpoint[len("tcp://") :].rpartition(":")[0]
        worker_curve = None
        if curve is not None and route.server_key is not None:
            # The route came over the front's authenticated channel.
            worker_curve = curve.for_server(route.server_key)
        return {"endpoint": f"tcp://{host}:{route.tcp_port}", "curve": worker_curve}, None
    registry = Registry(route.registry_root)
    return {"name": route.actor, "registry": registry}, registry


class _Links(Generic[A]):
    """A client's connections and the retry rule's decisions (see the module
    doc); :class:`Links` and :class:`AsyncLinks` add the waiting."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float | None,
        connect_timeout: float,
        name: str,
        curve: CurveClient | None = None,
        wait_front: bool = True,
    ) -> None:
        self.endpoint = endpoint
        self.wait_front = wait_front
        """Whether a front op refused before sending waits for the front
        (``connect_timeout``); a client of several daemons goes to another
        one instead."""
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.name = name
        self.curve = curve
        self.forks = FORKS[0]
        """The process image that made these connections (a forked child's
        copies are not its own to use or close)."""
        self._front: A | None = None
        self._workers: dict[str, _Worker[A]] = {}

    def _actor(self, target: dict[str, Any]) -> A:
        """A new actors client for ``target`` (its endpoint or name)."""
        raise NotImplementedError

    def close(self) -> None:
        for w in self._workers.values():
            w.actor.close()
        self._workers.clear()
        if self._front is not None:
            self._front.close()
            self._front = None

    @property
    def front(self) -> A:
        if self._front is None:
            self._front = self._actor({"endpoint": self.endpoint, "curve": self.curve})
        return self._front

    def forget(self, model_id: str, only: _Worker[A] | None = None) -> None:
        """Drop the cached route (and connection) of ``model_id`` (if it is still
        ``only``: a concurrent task may have routed it again meanwhile)."""
        w = self._workers.get(model_id)
        if w is not None and (only is None or w is only):
            del self._workers[model_id]
            w.actor.close()

    def _routed(self, model_id: str, route: Route) -> _Worker[A]:
        """Cache ``route``'s worker connection for ``model_id``."""
        target, registry = _worker_target(self.endpoint, route, self.curve)
        w = self._workers[model_id] = _Worker(route, self._actor(target), registry)
        return w

    def _connectable(self, model_id: str, w: _Worker[A], attempt: int) -> None:
        """Before connecting: on the first attempt, a worker with no live
        registry record is gone (unloaded, restarting): route it again."""
        if attempt == 1 and w.gone():
            raise Unavailable(f"model {model_id!r} has no live worker")

    def _again(self, model_id: str, w: _Worker[A], attempt: int, *, sent: bool) -> bool:
        """Whether a request refused on ``attempt`` is routed again and retried:
        only the first attempt, and only when it did not reach the worker (a
        connect that failed, or a send refused while not connected; a
        connected worker answered ``unavailable`` itself: it is stopping)."""
        if attempt == 2 or (sent and w.actor.connected):
            return False
        self.forget(model_id, w)
        return True

    def _waits(self, wait: bool | None) -> bool:
        return self.wait_front if wait is None else wait

    @staticmethod
    def _front_again(front: A) -> bool:
        """Whether a front op refused with ``unavailable`` is retried: only
        when it was not sent (the front itself answered when connected: it is
        stopping)."""
        return not front.connected

    def _connect_left(self, started: float) -> float:
        """What is left of ``connect_timeout`` to a call that began waiting for
        a connection at ``started`` (``time.monotonic()``); 0 when spent."""
        return max(0.0, started + self.connect_timeout - time.monotonic())


class Links(_Links[ActorClient]):
    """One thread's connections of a blocking client (see the module doc)."""

    def _actor(self, target: dict[str, Any]) -> ActorClient:
        return ActorClient(
            **target,
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
            client_name=self.name,
        )

    def front_call(
        self,
        op: str,
        body: Any,
        reply_type: Any,
        timeout: float | None,
        *,
        wait: bool | None = None,
    ) -> Any:
        """``op`` on the front; refused before sending, it waits for the front
        once (``wait``, by default :attr:`wait_front`)."""
        front = self.front
        rtype = Any if reply_type is None else reply_type
        started = time.monotonic()
        try:
            return front.call(op, body, timeout=timeout, reply_type=rtype)
        except Unavailable:
            left = self._connect_left(started)
            if not self._waits(wait) or not self._front_again(front) or left <= 0:
                raise
        front.connect(timeout=left)
        return front.call(op, body, timeout=timeout, reply_type=rtype)

    def route(self, model_id: str) -> Route:
        body = ops.model_ref(model_id)
        try:
            route: Route = self.front_call("route", body, Route, None)
        except WorkerCrashed:
            route = self.front_call("route", body, Route, None)
        return route

    def on_worker(self, model_id: str, send: Callable[[ActorClient], T]) -> T:
        """``send`` the request to ``model_id``'s worker, by the retry rule."""
        started = time.monotonic()
        for attempt in (1, 2):
            w = self._worker(model_id)
            if not w.actor.connected:
                try:
                    self._connectable(model_id, w, attempt)
                    w.actor.connect(timeout=self._connect_left(started))
                except (Unavailable, WorkerCrashed):
                    if self._again(model_id, w, attempt, sent=False):
                        continue
                    raise
            try:
                return send(w.actor)
            except Unavailable:
                if not self._again(model_id, w, attempt, sent=True):
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _worker(self, model_id: str) -> _Worker[ActorClient]:
        w = self._workers.get(model_id)
        return w if w is not None else self._routed(model_id, self.route(model_id))


class AsyncLinks(_Links[AsyncActorClient]):
    """An asyncio client's connections (see the module doc); one ZeroMQ
    context (one I/O thread) for all of them."""

    _ctx: zmq.Context[zmq.Socket[bytes]] | None = None

    def close(self) -> None:
        super().close()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        if self._ctx is None:
            self._ctx = zmq.Context()
        return self._ctx

    def _actor(self, target: dict[str, Any]) -> AsyncActorClient:
        return AsyncActorClient(
            **target,
            timeout=self.timeout,
            connect_timeout=self.connect_timeout,
            client_name=self.name,
            context=self.context,
        )

    async def front_call(
        self,
        op: str,
        body: Any,
        reply_type: Any,
        timeout: float | None,
        *,
        wait: bool | None = None,
    ) -> Any:
        """As :meth:`Links.front_call`."""
        front = self.front
        rtype = Any if reply_type is None else reply_type
        started = time.monotonic()
        try:
            return await front.call(op, body, timeout=timeout, reply_type=rtype)
        except Unavailable:
            left = self._connect_left(started)
            if not self._waits(wait) or not self._front_again(front) or left <= 0:
                raise
        await front.connect(timeout=left)
        return await front.call(op, body, timeout=timeout, reply_type=rtype)

    async def route(self, model_id: str) -> Route:
        body = ops.model_ref(model_id)
        try:
            route: Route = await self.front_call("route", body, Route, None)
        except WorkerCrashed:
            route = await self.front_call("route", body, Route, None)
        return route

    async def on_worker(self, model_id: str, send: Callable[[AsyncActorClient], Awaitable[T]]) -> T:
        """As :meth:`Links.on_worker`."""
        started = time.monotonic()
        for attempt in (1, 2):
            w = await self._worker(model_id)
            if not w.actor.connected:
                try:
                    self._connectable(model_id, w, attempt)
                    await w.actor.connect(timeout=self._connect_left(started))
                except (Unavailable, WorkerCrashed):
                    if self._again(model_id, w, attempt, sent=False):
                        continue
                    raise
            try:
                return await send(w.actor)
            except Unavailable:
                if not self._again(model_id, w, attempt, sent=True):
                    raise
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _worker(self, model_id: str) -> _Worker[AsyncActorClient]:
        w = self._workers.get(model_id)
        if w is not None:
            return w
        route = await self.route(model_id)
        w = self._workers.get(model_id)  # another task may have routed it meanwhile
        return w if w is not None else self._routed(model_id, route)
