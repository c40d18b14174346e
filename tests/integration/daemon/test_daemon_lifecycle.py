"""The daemon's life: defaults, SIGTERM (shutdown saves, exit 0, nothing left), a restart
over the same disk tier (the first request is a warm hit)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from daemon_harness import EVENTUALLY, GREEDY, Daemon, prompt_text, still_running
from llamad.actors import Client, Registry
from llamad.cache.kvc import SaveReason, read_meta
from llamad.model.results import CacheHitKind, FinishReason, TokenEvent
from llamad.model.worker_client import WorkerClient
from llamad.testing import Launcher

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


def _reasons(kvc_dir: Path) -> list[SaveReason]:
    reasons = []
    for path in sorted(kvc_dir.rglob("*.kvc")):
        fd = os.open(path, os.O_RDONLY)
        try:
            reasons.append(read_meta(fd).reason)
        finally:
            os.close(fd)
    return reasons


ENDLESS = 'root ::= "la " root'


def test_sigterm_saves_what_workers_hold_exits_0_and_a_restart_hits_warm_from_disk() -> None:
    d = Daemon({"m": {"cache": {"save_tier": "disk"}}})
    try:
        d.start(wait_for=["m"])
        route = d.route("m")
        tree = d.tree()
        assert (
            len(tree) >= 3
        )  # cache-meta, the worker, front (the supervisors are threads of the root)
        with WorkerClient("m", registry=Registry(route.registry_root)) as worker:
            stream = worker.infer(prompt_text(11), max_tokens=100_000, grammar=ENDLESS, **GREEDY)
            events = iter(stream)
            for _ in range(3):
                assert isinstance(next(events), TokenEvent)
            assert d.proc is not None
            d.proc.send_signal(signal.SIGTERM)
            list(events)  # the worker ends it when its turn to stop comes
            result = stream.result
        assert result is not None and result.finish_reason is FinishReason.CANCELLED
        assert d.stop() == 0
        assert still_running(tree) == []
        assert SaveReason.SHUTDOWN in _reasons(d.state / "kvc")

        d.start(wait_for=["m"])  # the same config, state dir and disk tier
        held = result.context_tokens[: result.committed_tokens]
        warm = d.worker("m").complete(held, max_tokens=1, **GREEDY)
        assert warm.cache_hit_kind is CacheHitKind.EXACT
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_with_no_config_the_default_model_is_served_on_the_default_endpoint() -> None:
    # No file, no overrides: only the directories a service manager would give
    # (the launcher's: LLAMAD_RUNTIME_DIR, STATE_DIRECTORY, a cache instance).
    d = Launcher(
        env={
            "LLAMAD_DAEMON__THREADS__CORES": "1",
            "LLAMAD_CACHE__RAM_FILE__QUOTA": "0",  # nothing left in /dev/shm
        }
    )
    assert d.config is None
    client = Client(f"ipc://{d.runtime}/llamad.sock", timeout=EVENTUALLY, connect_timeout=5.0)
    try:
        routes = d.start().wait_routed(["smollm2"], front=client, timeout=EVENTUALLY)
        assert routes["smollm2"].actor == "model.smollm2"
        assert d.runtime.stat().st_mode & 0o777 == 0o700
        assert d.state.stat().st_mode & 0o777 == 0o700
        assert d.stop() == 0
    finally:
        client.close()
        d.close()
