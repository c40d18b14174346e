"""The public clients of a daemon (SPEC D3; ``docs/internals/client.md``).

- :mod:`~llamad.client.sync`: :class:`Client`, blocking;
- :mod:`~llamad.client.aio`: :class:`AsyncClient`, on an asyncio loop;
- :mod:`~llamad.client.stream`, :mod:`~llamad.client.aio_stream`: a running
  ``infer`` request as an iterator of typed events;
- :mod:`~llamad.client.asks`: each method's request as data (no I/O),
  and :mod:`~llamad.client.bodies`, the request bodies, validated; both
  shared by the two clients;
- :mod:`~llamad.client.base`: the state the two clients, and the two
  streams, share apart from the waiting;
- :mod:`~llamad.client.routes`: where a model is served, and the retry rule.

A client loads no cache, model-worker, psutil or crc32c module
(``tests/unit/client/test_client_imports.py`` holds the list).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

if TYPE_CHECKING:
    from llamad.client.aio import AsyncClient
    from llamad.client.aio_stream import AsyncStream
    from llamad.client.bodies import AdapterInfo
    from llamad.client.stream import Stream
    from llamad.client.sync import Client

__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.client.aio": ("AsyncClient",),
        "llamad.client.aio_stream": ("AsyncStream",),
        "llamad.client.bodies": ("AdapterInfo",),
        "llamad.client.stream": ("Stream",),
        "llamad.client.sync": ("Client",),
    },
)

__all__ = ["AdapterInfo", "AsyncClient", "AsyncStream", "Client", "Stream"]
