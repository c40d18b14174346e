"""``GET /metrics``: the daemon's metrics in Prometheus's text format (issue 19, item 6).

One read of the front's ``metrics`` through the gateway's
:class:`~llamad.AsyncClient` (every worker's status board, the cache's
counters and tiers: nothing waits on a busy worker), rendered by
:func:`llamad.client.prometheus.exposition` as ``text/plain; version=0.0.4``.
The catalogue, with each metric's vLLM name, is ``docs/internals/metrics.md``.

Like every route it goes through the gate: with ``[http.keys]`` set, a
scrape needs a key (Prometheus's ``authorization`` scrape option sends it as
``Authorization: Bearer``), since the metrics name the models and their
traffic. Errors are plain text with the status of :mod:`llamad.gateway.errors`.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute

from llamad.client.exposition import CONTENT_TYPE
from llamad.client.prometheus import exposition
from llamad.gateway.gate import Gate

__all__ = ["render_error", "routes"]


def render_error(status: int, code: str, message: str, param: str | None) -> Response:
    """An error as a scraper shows it: one line of text
    (:data:`llamad.gateway.gate.ErrorRender`)."""
    return PlainTextResponse(f"{code}: {message}\n", status)


def routes(gate: Gate) -> list[BaseRoute]:
    """``GET /metrics``, over ``gate``."""

    async def metrics(request: Request) -> Response:
        gate.caller(request)
        snapshot = await gate.metrics(request)
        return Response(exposition(snapshot), media_type=CONTENT_TYPE)

    return [gate.route("/metrics", metrics, render_error, ["GET"])]
