"""bench/peers P2: what the after-restart reads find in the page cache; when pages are dropped."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # bench/ is a package at the repository root
    sys.path.insert(0, str(ROOT))
scenarios = importlib.import_module("bench.peers.scenarios")
llamad_sys = importlib.import_module("bench.peers.llamad_sys")
workload = importlib.import_module("bench.peers.workload")
peers_report = importlib.import_module("bench.peers_report")


class FakeLlamad:
    """The LlamadDaemon calls ttft_round makes, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.client = SimpleNamespace(tokenize=lambda model, text: list(range(len(text))))

    def first_token(self, model: str, ids: list[int]) -> tuple[float, Any]:
        self.calls.append((model, len(ids)))
        stats = SimpleNamespace(restore_ms=1.0, prefill_ms=1.0, prefill_tokens=0, queue_ms=0.0)
        return 1.0, SimpleNamespace(stats=stats, cache_delta=SimpleNamespace(read=len(ids)))

    def restart(self) -> None:
        self.calls.append("restart")

    def drop_disk_pages(self) -> int:
        self.calls.append("drop")
        return 1

    def saves(self) -> int:
        return 0

    def wait_saved(self, before: int) -> None:
        pass

    def largest_ram_row(self) -> int:
        return 0


def test_every_size_is_read_after_the_restart_before_any_pages_are_dropped() -> None:
    fake = FakeLlamad()
    sizes = (512, 1024, 2048)
    rig = SimpleNamespace(
        llamad=fake,
        sizes=SimpleNamespace(ttft=sizes),
        server=None,
        lcpp_ram=None,
        lcpp_disk=None,
        tokenize=lambda text: list(range(len(text))),
    )
    res = peers_report.Results(rounds=1, sizes=sizes)
    scenarios.ttft_round(rig, res, 0, [scenarios.LLAMAD])
    after = fake.calls[fake.calls.index("restart") + 1 :]
    disk = [(scenarios.DISK, n) for n in sizes]
    # A drop between sizes would make the next sizes' "restart" reads cold ones.
    assert after == [*disk, "drop", *disk]


def test_pages_are_dropped_only_once_the_startup_prefetch_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cache_client = importlib.import_module("llamad.cache.client")
    events: list[str] = []
    states = iter(["running", "running", "done"])

    class FakeCache:
        def __init__(self, **kwargs: Any) -> None:
            assert kwargs["registry_root"].name == "actors"

        def __enter__(self) -> FakeCache:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def status(self) -> dict[str, Any]:
            state = next(states)
            events.append(state)
            return {"prefetch": {"state": state}}

    monkeypatch.setattr(cache_client, "CacheClient", FakeCache)
    monkeypatch.setattr(
        llamad_sys.os, "posix_fadvise", lambda fd, off, n, advice: events.append("drop")
    )
    table = llamad_sys.ModelTable("disk", 4096, 4, 2, "disk", ("disk",))
    daemon = llamad_sys.LlamadDaemon("t", [table], 2)
    try:
        (daemon.base / "state" / "kvc").mkdir(parents=True)
        (daemon.base / "state" / "kvc" / "1.kvc").write_bytes(b"x" * 4096)
        daemon.proc = SimpleNamespace()  # running, as far as the drop is concerned
        assert daemon.drop_disk_pages() == 1
    finally:
        daemon.proc = None
        daemon.remove()
    assert events == ["running", "running", "done", "drop"]
