"""The gateway's starlette app: one route table per protocol, over one :class:`Gate`.

A protocol is a module with ``routes(gate) -> list[BaseRoute]`` and
``render_error(status, code, message, param) -> Response`` (its error shape);
:data:`PROTOCOLS` lists them with the path prefix whose unknown paths are
answered in that shape. Adding a protocol is one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from llamad.gateway import anthropic, metrics, ollama, openai, responses
from llamad.gateway.gate import ErrorRender, Gate

__all__ = ["PROTOCOLS", "Protocol", "build_app"]


@dataclass(frozen=True)
class Protocol:
    """One protocol: its routes, its error shape, and the prefix of its paths."""

    name: str
    routes: Callable[[Gate], list[BaseRoute]]
    render_error: ErrorRender
    prefix: str


PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("openai", openai.routes, openai.render_error, "/v1/"),
    Protocol("openai-responses", responses.routes, openai.render_error, "/v1/responses"),
    Protocol("prometheus", metrics.routes, metrics.render_error, "/metrics"),
    Protocol("anthropic", anthropic.routes, anthropic.render_error, "/v1/messages"),
    Protocol("ollama", ollama.routes, ollama.render_error, "/api/"),
)
"""Every protocol served; the first is the shape of errors outside every prefix."""

_CODES = {404: "not_found", 405: "method_not_allowed"}


def build_app(gate: Gate, protocols: tuple[Protocol, ...] = PROTOCOLS) -> Starlette:
    """The app serving ``protocols`` over ``gate``."""
    routes: list[BaseRoute] = []
    for p in protocols:
        routes.extend(p.routes(gate))

    def shape(path: str) -> ErrorRender:
        # The longest prefix: /v1/messages is Anthropic's inside OpenAI's /v1/.
        matching = [p for p in protocols if path.startswith(p.prefix)]
        if not matching:
            return protocols[0].render_error
        return max(matching, key=lambda p: len(p.prefix)).render_error

    async def http_error(request: Request, exc: Any) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        code = _CODES.get(status, "bad_request" if status < 500 else "internal")
        message = f"{request.method} {request.url.path}: {getattr(exc, 'detail', '') or code}"
        return shape(request.url.path)(status, code, message, None)

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error})
    app.state.gate = gate
    return app
