"""cache-meta with [kv_events] whose socket cannot be bound still serves, without events."""

from __future__ import annotations

import msgspec

from llamad.cache.kv_publish import KvEventsSettings
from llamad.cache.meta_proc import MetaServer
from llamad.cache.settings import CacheSettings


def test_a_socket_that_cannot_bind_leaves_the_cache_serving(
    cache_settings: CacheSettings,
) -> None:
    settings = msgspec.structs.replace(
        cache_settings,
        kv_events=KvEventsSettings(endpoint="ipc:///nonexistent-dir-llamad/kv.sock"),
    )
    server = MetaServer(settings)
    try:
        assert server.kv_events is None
        assert server.meta.observer is None
        server.start()
        server.step(0)
    finally:
        server.close()
