"""The HTTP gateway: the ecosystem's protocols over llamad's public client (issue 19).

A child of the root like the front (:mod:`llamad.daemon.tree`), in its own
process: starlette on uvicorn (uvloop, httptools). It talks to the daemon only
through :class:`llamad.AsyncClient`, so a request over HTTP is a client
request like any other: routed by the front, streamed straight from the worker.

- :mod:`~llamad.gateway.proc`: the supervised entry point (bind, serve, heartbeat);
- :mod:`~llamad.gateway.app`: the ASGI app, one starlette router per protocol;
- :mod:`~llamad.gateway.gate`: every request's way into the daemon (keys,
  tenants' cache salts, limits, timeouts, disconnect → cancel);
- :mod:`~llamad.gateway.errors`: llamad's error codes as HTTP statuses;
- :mod:`~llamad.gateway.openai`: the OpenAI routes and their translation;
- :mod:`~llamad.gateway.metrics`: ``GET /metrics`` (Prometheus text).
- :mod:`~llamad.gateway.anthropic`: Anthropic's Messages API (``/v1/messages``);
- :mod:`~llamad.gateway.ollama`: Ollama's API (``/api/...``);
- :mod:`~llamad.gateway.calls`: tool calls read out of a reply, held back from a stream;
- :mod:`~llamad.gateway.decode`: a JSON body as a msgspec Struct, faults naming the field.

``docs/internals/gateway.md`` describes it.
"""
