"""``[kv_events]``: ipc sockets in the runtime directory by default, tcp on loopback only."""

from __future__ import annotations

import pytest

from config_helpers import Workspace
from llamad.cache.settings import CacheSettings

pytestmark = pytest.mark.timeout(60)


def test_on_by_default_with_ipc_sockets_in_the_runtime_dir(ws: Workspace) -> None:
    config = ws.loaded(ws.data())
    run = config.runtime_dir
    assert config.kv_events.enabled
    assert config.kv_events.endpoint == f"ipc://{run}/kv-events.sock"
    assert config.kv_events.replay_endpoint == f"ipc://{run}/kv-events-replay.sock"
    k = config.cache_settings().kv_events
    assert k is not None
    assert (k.endpoint, k.replay_endpoint, k.topic, k.block_size, k.buffer_steps) == (
        f"ipc://{run}/kv-events.sock",
        f"ipc://{run}/kv-events-replay.sock",
        "",
        16,
        10_000,
    )
    assert k.info_path == str(run / "kv_events.json")
    assert CacheSettings.from_wire(config.cache_settings().to_wire()) == config.cache_settings()


def test_every_key_reaches_the_publisher(ws: Workspace) -> None:
    config = ws.loaded(
        ws.data(
            {
                ("kv_events", "endpoint"): "tcp://127.0.0.1:5557",
                ("kv_events", "replay_endpoint"): "tcp://127.0.0.1:5558",
                ("kv_events", "topic"): "kv@a",
                ("kv_events", "block_size"): 32,
                ("kv_events", "buffer_steps"): 50,
            }
        )
    )
    k = config.cache_settings().kv_events
    assert k is not None
    assert (k.endpoint, k.replay_endpoint, k.topic, k.block_size, k.buffer_steps) == (
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
        "kv@a",
        32,
        50,
    )


def test_disabled_publishes_nothing(ws: Workspace) -> None:
    config = ws.loaded(ws.data({("kv_events", "enabled"): False}))
    assert config.cache_settings().kv_events is None


def test_tcp_beyond_loopback_needs_allow_remote(ws: Workspace) -> None:
    # The events carry every saved prompt's token ids.
    problems = ws.refused(ws.data({("kv_events", "endpoint"): "tcp://*:5557"}))
    assert "loopback" in problems["kv_events.endpoint"]
    assert "kv_events.allow_remote" in problems["kv_events.endpoint"]
    config = ws.loaded(
        ws.data({("kv_events", "endpoint"): "tcp://*:5557", ("kv_events", "allow_remote"): True})
    )
    assert config.kv_events.endpoint == "tcp://*:5557"


def test_bad_endpoints_are_refused_by_key(ws: Workspace) -> None:
    problems = ws.refused(
        ws.data(
            {
                ("kv_events", "endpoint"): "udp://x",
                ("kv_events", "block_size"): 0,
            }
        )
    )
    assert "kv_events.endpoint" in problems and "kv_events.block_size" in problems
    same = "tcp://127.0.0.1:5557"
    problems = ws.refused(
        ws.data({("kv_events", "endpoint"): same, ("kv_events", "replay_endpoint"): same})
    )
    assert "kv_events.replay_endpoint" in problems
