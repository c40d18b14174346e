"""cache-meta SIGKILLed under load: its supervisor restarts it and nothing published is lost.

cache_sup runs as a real root supervisor process; writer threads publish rows
to all three tiers through real clients while the test SIGKILLs cache-meta
twice. Every save whose announce succeeded must be in the rebuilt index
(from the ``ram_file`` and ``disk`` scans, and the ``ram`` segments of this
daemon run) and load back byte-exact; writers caught mid-save see a typed
error or an abandoned publish, never a wrong answer. Anything else a writer
thread raises is recorded and fails the test, and every writer thread must
have finished: a thread stuck in a call would otherwise go unnoticed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llamad.actors.registry import Registry
from llamad.cache.client import CacheClient
from llamad.cache.publish import PublishOutcome, publish
from llamad.cache.settings import CacheSettings
from llamad.cache.tiers import Tier
from llamad.errors import LlamadError
from llamad.tiers import LOCAL_TIERS
from meta_fault_child import row_payload, row_spec
from meta_fixtures import cache_settings_fixture  # noqa: F401  (the cache_settings fixture)

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

CHILD = Path(__file__).resolve().parents[2] / "support" / "meta_fault_child.py"
TIERS = LOCAL_TIERS


def meta_pid(registry: Registry, not_pid: int | None, timeout: float = 60.0) -> int:
    """The pid of the live cache-meta, once it is not ``not_pid``."""
    deadline = time.monotonic() + timeout
    while True:
        entry = registry.lookup("cache-meta")
        if entry is not None and entry.pid != not_pid:
            return entry.pid
        assert time.monotonic() < deadline, "cache-meta did not come (back) up"
        time.sleep(0.02)


class Load:
    """Writer threads publishing distinct rows until stopped."""

    def __init__(self, settings: CacheSettings, threads: int = 2) -> None:
        self.settings = settings
        self.published: dict[bytes, int] = {}
        self.failures: list[str] = []
        self.crashes: list[str] = []  # anything but a typed error: a bug
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,)) for i in range(threads)]

    def run(self, index: int) -> None:
        try:
            self._publish_until_stopped(index)
        except BaseException as exc:  # a thread's exception is otherwise lost
            with self.lock:
                self.crashes.append(f"writer {index}: {exc!r}")
            self.stop.set()

    def _publish_until_stopped(self, index: int) -> None:
        tiers = {}
        for name in TIERS:
            cfg = self.settings.tier(name)
            assert cfg is not None
            tiers[name] = Tier(cfg)
        seed = index * 1_000_000
        with CacheClient.from_settings(self.settings, timeout=10.0, connect_timeout=10.0) as cache:
            while not self.stop.is_set():
                seed += 1
                tier = tiers[TIERS[seed % 3]]
                try:
                    done = publish(cache, tier, row_spec(seed), row_payload(seed))
                except LlamadError as exc:
                    with self.lock:
                        self.failures.append(exc.code)
                    self.stop.wait(0.05)
                    continue
                if done.outcome is PublishOutcome.PUBLISHED:
                    with self.lock:
                        self.published[done.key] = seed

    def count(self) -> int:
        with self.lock:
            return len(self.published)

    def wait_for(self, n: int, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.count() < n:
            assert not self.crashes, self.crashes
            assert time.monotonic() < deadline, f"only {self.count()} rows published"
            time.sleep(0.02)


def test_meta_killed_under_load_is_restarted_and_loses_no_published_row(
    cache_settings: CacheSettings, tmp_path: Path
) -> None:
    settings_file = tmp_path / "settings.json"
    settings_file.write_text(json.dumps(cache_settings.to_wire()))
    assert cache_settings.registry_root is not None
    registry = Registry(cache_settings.registry_root)
    sup = subprocess.Popen([sys.executable, os.fspath(CHILD), "sup", os.fspath(settings_file)])
    load = Load(cache_settings)
    try:
        try:
            pid = meta_pid(registry, None)
            for t in load.threads:
                t.start()
            for round_ in (1, 2):
                load.wait_for(15 * round_)
                os.kill(pid, signal.SIGKILL)
                pid = meta_pid(registry, pid)
            load.wait_for(load.count() + 10)
        finally:
            load.stop.set()
            for t in load.threads:
                if t.ident is not None:
                    t.join(60)
        stuck = [t.name for t in load.threads if t.is_alive()]
        assert not stuck, f"writer threads never finished: {stuck}"
        assert not load.crashes, load.crashes
        with CacheClient.from_settings(cache_settings) as cache:
            indexed = {bytes.fromhex(r["key"]) for r in cache.dump() if r["status"] == "available"}
            lost = set(load.published) - indexed
            assert not lost, f"{len(lost)} announced rows missing after the restarts"
            buf = bytearray(64 * 1024)
            for key, seed in load.published.items():
                ref = cache.lookup_exact(key)
                assert ref is not None
                with cache.pinned(ref):
                    n = cache.load_into(ref, buf)
                assert n is not None and bytes(buf[:n]) == row_payload(seed)
            assert cache.status()["reservations"] == 0
    finally:
        # Stopped however the test ends, so a failure is reported as itself
        # and not as a supervisor left running over the discarded cache.
        sup.send_signal(signal.SIGTERM)
        try:
            assert sup.wait(60) == 0
        finally:
            if sup.poll() is None:
                sup.kill()
                sup.wait()
    # Only typed errors reached the writers while cache-meta was down.
    assert set(load.failures) <= {"worker_crashed", "unavailable", "timeout"}
