"""The gateway's ASGI app: one route table per protocol, each built on first use.

A protocol is a module with ``routes(gate) -> list[BaseRoute]`` and
``render_error(status, code, message, param) -> Response`` (its error shape);
:data:`PROTOCOLS` names them with the path prefix they serve, whose unknown
paths are answered in that shape. Adding a protocol is one line here.

**Lazily.** A request goes to the protocol of the longest prefix its path
falls under (``/v1/messages`` is Anthropic's inside OpenAI's ``/v1/``; a path
under none is OpenAI's), and that protocol's module is imported and its
router (:class:`ProtocolApp`) built on the first request it gets. An idle gateway has
imported none of them (nor what they bring: the tool-call parsers, the JSON
schema converter, the Prometheus exposition), which keeps its resident
memory down (SPEC P9, ``docs/internals/gateway.md``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Router
from starlette.types import Receive, Scope, Send

from llamad.gateway.gate import ErrorRender, Gate

__all__ = ["PROTOCOLS", "GatewayApp", "Protocol", "ProtocolApp", "build_app"]


@dataclass(frozen=True)
class Protocol:
    """One protocol: the module with its ``routes`` and ``render_error``
    (``errors``: another module's error shape), and the prefix of its paths."""

    name: str
    module: str
    prefix: str
    errors: str | None = None

    def render_error(self) -> ErrorRender:
        error_render: ErrorRender = importlib.import_module(self.errors or self.module).render_error
        return error_render


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("openai", "llamad.gateway.openai", "/v1/"),
    Protocol(
        "openai-responses", "llamad.gateway.responses", "/v1/responses", "llamad.gateway.openai"
    ),
    Protocol("prometheus", "llamad.gateway.metrics", "/metrics"),
    Protocol("anthropic", "llamad.gateway.anthropic", "/v1/messages"),
    Protocol("ollama", "llamad.gateway.ollama", "/api/"),
)
"""Every protocol served; the first is the shape of errors outside every prefix."""

_CODES = {404: "not_found", 405: "method_not_allowed"}


class GatewayApp:
    """The ASGI app: each request to its protocol's router, built (its
    module imported) on the protocol's first request."""

    def __init__(self, gate: Gate, protocols: tuple[Protocol, ...] = PROTOCOLS) -> None:
        self.gate = gate
        self.protocols = protocols
        self._apps: dict[str, ProtocolApp] = {}

    def protocol_of(self, path: str) -> Protocol:
        """The protocol of the longest prefix ``path`` falls under (the first: none)."""
        matching = [p for p in self.protocols if path.startswith(p.prefix)]
        if not matching:
            return self.protocols[0]
        return max(matching, key=lambda p: len(p.prefix))

    def loaded(self) -> list[str]:
        """The protocols built so far (for tests)."""
        return sorted(self._apps)

    def app_of(self, protocol: Protocol) -> ProtocolApp:
        app = self._apps.get(protocol.name)
        if app is None:
            module = importlib.import_module(protocol.module)
            app = ProtocolApp(module.routes(self.gate), protocol.render_error())
            self._apps[protocol.name] = app
        return app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # (uvicorn runs with lifespan off and no websockets: http only.)
        await self.app_of(self.protocol_of(scope["path"]))(scope, receive, send)


class ProtocolApp:
    """One protocol's routes, and its error shape for a path or a method none
    of them serves (404, 405).

    A starlette ``Router`` alone, not a ``Starlette`` app: that one wraps
    every request in two middlewares (a 500 page for an exception the
    endpoint let out, and exception handlers) whose ``send`` relays every
    body chunk of a stream passes through. The endpoints catch every
    exception themselves (:class:`~llamad.gateway.gate.Guarded`), so what
    is left of those is the router's own refusals, rendered here."""

    def __init__(self, routes: list[BaseRoute], render: ErrorRender) -> None:
        self.router = Router(routes)
        self.render = render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # "app" in the scope: the router raises its 404 and 405 as
        # HTTPException (else it answers them in plain text itself).
        scope["app"] = self
        try:
            await self.router(scope, receive, send)
        except HTTPException as exc:
            status = exc.status_code
            code = _CODES.get(status, "bad_request" if status < 500 else "internal")
            message = f"{scope['method']} {scope['path']}: {exc.detail or code}"
            response = self.render(status, code, message, None)
            if exc.headers:
                response.headers.update(exc.headers)
            await response(scope, receive, send)


def build_app(gate: Gate, protocols: tuple[Protocol, ...] = PROTOCOLS) -> GatewayApp:
    """The app serving ``protocols`` over ``gate``."""
    return GatewayApp(gate, protocols)
