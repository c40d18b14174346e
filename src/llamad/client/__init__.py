"""The public clients of a daemon (SPEC D3; ``docs/internals/client.md``).

- :mod:`~llamad.client.sync`: :class:`Client`, blocking;
- :mod:`~llamad.client.aio`: :class:`AsyncClient`, on an asyncio loop;
- :mod:`~llamad.client.stream`, :mod:`~llamad.client.aio_stream`: a running
  ``infer`` request as an iterator of typed events;
- :mod:`~llamad.client.bodies`: what each method sends and how its answer is
  read (no I/O), shared by both clients;
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
