"""Where a model is served, and the retry rule: the clients' connections.

A client holds one connection to the daemon's front (the control plane) and
one per routed model to that model's worker actor, found by the front's
``route`` answer (actor name and registry) and cached. :class:`Links` is
that set for the blocking client (one per thread: an actors client is
single-threaded); :class:`AsyncLinks` for the asyncio client. Both carry out
the same rule, side by side here so they cannot drift:

- **before sending**, a worker that is gone (no live registry record, or a
  send refused with ``unavailable`` while not connected: unloaded by
  keep_alive, restarting, the daemon restarted) is routed again (the front
  reloads an expired model) and the request retried once, the second time
  waiting up to ``connect_timeout`` for the worker;
- **once sent**, the outcome is the caller's: a worker that dies raises
  ``WorkerCrashed``, and a generation is never resent;
- a front op refused before sending (the daemon down or restarting) waits
  up to ``connect_timeout`` for the front once; ``route`` is idempotent and
  is asked again after a front crash.

The transport follows the front's: a client of an ``ipc://`` front reaches
the worker by name in the registry (its ipc socket); a client of a
``tcp://`` front, which may be on another host and cannot read the
registry, connects to the worker's own tcp port (``Route.tcp_port``) on the
host it reached the front through, with its CURVE keypair and the route's
server key when the daemon serves CURVE.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

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


class _Worker:
    """A connection to the worker a route names."""

    __slots__ = ("actor", "registry", "route")

    def __init__(self, route: Route, actor: Any, registry: Registry | None) -> None:
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


class Links:
    """One thread's connections of a blocking client (see the module doc)."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float | None,
        connect_timeout: float,
        name: str,
        curve: CurveClient | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.name = name
        self.curve = curve
        self.forks = FORKS[0]
        self._front: ActorClient | None = None
        self._workers: dict[str, _Worker] = {}

    def close(self) -> None:
        for w in self._workers.values():
            w.actor.close()
        self._workers.clear()
        if self._front is not None:
            self._front.close()
            self._front = None

    @property
    def front(self) -> ActorClient:
        if self._front is None:
            self._front = ActorClient(
                self.endpoint,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                client_name=self.name,
                curve=self.curve,
            )
        return self._front

    def front_call(self, op: str, body: Any, reply_type: Any, timeout: float | None) -> Any:
        front = self.front
        rtype = Any if reply_type is None else reply_type
        try:
            return front.call(op, body, timeout=timeout, reply_type=rtype)
        except Unavailable:
            if front.connected:
                raise  # the front itself answered (it is stopping)
        front.connect(timeout=self.connect_timeout)
        return front.call(op, body, timeout=timeout, reply_type=rtype)

    def route(self, model_id: str) -> Route:
        body = ops.model_ref(model_id)
        try:
            route: Route = self.front_call("route", body, Route, None)
        except WorkerCrashed:
            route = self.front_call("route", body, Route, None)
        return route

    def forget(self, model_id: str) -> None:
        """Drop the cached route (and connection) of ``model_id``."""
        w = self._workers.pop(model_id, None)
        if w is not None:
            w.actor.close()

    def on_worker(self, model_id: str, send: Callable[[ActorClient], T]) -> T:
        """``send`` the request to ``model_id``'s worker, by the retry rule."""
        for attempt in (1, 2):
            w = self._worker(model_id)
            actor: ActorClient = w.actor
            if not actor.connected:
                try:
                    if attempt == 1 and w.gone():
                        raise Unavailable(f"model {model_id!r} has no live worker")
                    actor.connect(timeout=self.connect_timeout)
                except (Unavailable, WorkerCrashed):
                    if attempt == 2:
                        raise
                    self.forget(model_id)
                    continue
            try:
                return send(actor)
            except Unavailable:
                # Connected means the worker itself answered (it is stopping):
                # the request reached it, so it is not sent again.
                if attempt == 2 or actor.connected:
                    raise
                self.forget(model_id)
        raise AssertionError("unreachable: the second attempt returns or raises")

    def _worker(self, model_id: str) -> _Worker:
        w = self._workers.get(model_id)
        if w is None:
            route = self.route(model_id)
            target, registry = _worker_target(self.endpoint, route, self.curve)
            actor = ActorClient(
                **target,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                client_name=self.name,
            )
            w = self._workers[model_id] = _Worker(route, actor, registry)
        return w


class AsyncLinks:
    """An asyncio client's connections (see the module doc); one ZeroMQ
    context (one I/O thread) for all of them."""

    def __init__(
        self,
        endpoint: str,
        *,
        timeout: float | None,
        connect_timeout: float,
        name: str,
        curve: CurveClient | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.name = name
        self.curve = curve
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._front: AsyncActorClient | None = None
        self._workers: dict[str, _Worker] = {}

    def close(self) -> None:
        for w in self._workers.values():
            w.actor.close()
        self._workers.clear()
        if self._front is not None:
            self._front.close()
            self._front = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    @property
    def context(self) -> zmq.Context[zmq.Socket[bytes]]:
        if self._ctx is None:
            self._ctx = zmq.Context()
        return self._ctx

    @property
    def front(self) -> AsyncActorClient:
        if self._front is None:
            self._front = AsyncActorClient(
                self.endpoint,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                client_name=self.name,
                context=self.context,
                curve=self.curve,
            )
        return self._front

    async def front_call(self, op: str, body: Any, reply_type: Any, timeout: float | None) -> Any:
        front = self.front
        rtype = Any if reply_type is None else reply_type
        try:
            return await front.call(op, body, timeout=timeout, reply_type=rtype)
        except Unavailable:
            if front.connected:
                raise
        await front.connect(timeout=self.connect_timeout)
        return await front.call(op, body, timeout=timeout, reply_type=rtype)

    async def route(self, model_id: str) -> Route:
        body = ops.model_ref(model_id)
        try:
            route: Route = await self.front_call("route", body, Route, None)
        except WorkerCrashed:
            route = await self.front_call("route", body, Route, None)
        return route

    def forget(self, model_id: str, only: _Worker | None = None) -> None:
        """Drop the cached route of ``model_id`` (if it is still ``only``: a
        concurrent task may have routed it again meanwhile)."""
        w = self._workers.get(model_id)
        if w is not None and (only is None or w is only):
            del self._workers[model_id]
            w.actor.close()

    async def on_worker(self, model_id: str, send: Callable[[AsyncActorClient], Awaitable[T]]) -> T:
        """As :meth:`Links.on_worker`."""
        for attempt in (1, 2):
            w = await self._worker(model_id)
            actor: AsyncActorClient = w.actor
            if not actor.connected:
                try:
                    if attempt == 1 and w.gone():
                        raise Unavailable(f"model {model_id!r} has no live worker")
                    await actor.connect(timeout=self.connect_timeout)
                except (Unavailable, WorkerCrashed):
                    if attempt == 2:
                        raise
                    self.forget(model_id, w)
                    continue
            try:
                return await send(actor)
            except Unavailable:
                if attempt == 2 or actor.connected:
                    raise
                self.forget(model_id, w)
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def _worker(self, model_id: str) -> _Worker:
        w = self._workers.get(model_id)
        if w is not None:
            return w
        route = await self.route(model_id)
        w = self._workers.get(model_id)  # another task may have routed it meanwhile
        if w is None:
            target, registry = _worker_target(self.endpoint, route, self.curve)
            actor = AsyncActorClient(
                **target,
                timeout=self.timeout,
                connect_timeout=self.connect_timeout,
                client_name=self.name,
                context=self.context,
            )
            w = self._workers[model_id] = _Worker(route, actor, registry)
        return w
