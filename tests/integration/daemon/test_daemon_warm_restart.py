"""With no configuration, the cache stays warm across a restart and a reboot (SPEC C12).

A real daemon (``python -m llamad.daemon``, no config file) serving the
default model, the way ``make run`` starts one: only its directories are
private (runtime and state directories, and a cache instance name of its own,
so its ``ram`` segments and its default ``ram_file`` directory under
``/dev/shm/llamad-<uid>/`` are its own), and the model runs one thread.
Everything else is the defaults: rows saved with no tier named land in
``ram``, a clean stop demotes them into ``ram_file`` (a link on
``/dev/shm``), and each gets a ``disk`` copy behind it.

Each test sends a prompt, waits for its finish save to be published (the
``saves_finish`` counter: the save is asynchronous, and a restart keeps
only what was published before it), restarts the daemon and sends the
prompt again: the repeat must be an exact hit restoring every prompt token
(the finish row holds prompt and reply, and is truncated to the prompt).
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from llamad.cache.client import CacheClient
from llamad.client.sync import Client
from llamad.config import DEFAULT_MODEL_ID
from llamad.model.results import Completion
from llamad.testing import Launcher

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(420)]

#: "Eventually" on a 2-core machine shared with other test runs.
EVENTUALLY = 120.0
MODEL = DEFAULT_MODEL_ID.upper()


def chat(topic: str, notes: int = 24) -> list[dict[str, str]]:
    """A chat of ``notes`` notes (~27 tokens each) about ``topic``: long enough
    for the default save policy (512 tokens), distinct from the first tokens."""
    places = ("river", "bridge", "market", "library", "tower", "harbour")
    body = " ".join(
        f"Note {i + 1}: the {places[i % len(places)]} of district {i // 6 + 1} "
        f"was built in {1500 + i * 3} and repaired {i % 5 + 1} times."
        for i in range(notes)
    )
    return [{"role": "user", "content": f"{topic}.\n{body}\nWhat do these notes describe?"}]


class Unconfigured:
    """The daemon with no configuration, its directories private (see the module
    doc), started through :class:`llamad.testing.Launcher`."""

    def __init__(self, **env: str) -> None:
        self.launcher = Launcher(
            prefix="lwr-",
            instance=f"wr-{uuid.uuid4().hex[:12]}",
            env={
                "LLAMAD_LOG_FORMAT": "json",
                # One thread, as every real-model test (and the default model's
                # path, which defining its table requires).
                f"LLAMAD_MODELS__{MODEL}__PATH": "default",
                f"LLAMAD_MODELS__{MODEL}__N_THREADS": "1",
                f"LLAMAD_MODELS__{MODEL}__N_THREADS_BATCH": "1",
                # A 512-row prompt chunk on one thread took over the default
                # 30 s beside the suite's second worker at load ~11; what this
                # module checks is the cache across restarts, not that bound.
                f"LLAMAD_MODELS__{MODEL}__DECODE_TIMEOUT_MS": "300000",
                **env,
            },
        )
        self.runtime = self.launcher.runtime
        # The default ram_file directory: this instance's, on /dev/shm.
        self.ram_file = self.launcher.ram_file_root
        self.endpoint = self.launcher.endpoint

    def start(self) -> Unconfigured:
        self.launcher.start().wait_routed([DEFAULT_MODEL_ID], timeout=EVENTUALLY)
        return self

    def stop(self) -> int:
        """SIGTERM (the clean stop: shutdown saves, demotions, the ram purge)."""
        return self.launcher.stop(EVENTUALLY)

    def client(self) -> Client:
        return Client(self.endpoint, connect_timeout=10.0, timeout=EVENTUALLY)

    def cache(self) -> CacheClient:
        return CacheClient(registry_root=self.launcher.registry_root, timeout=30.0)

    def copies(self, key: bytes) -> set[str]:
        """The tiers holding a copy of the row ``key`` now."""
        with self.cache() as cache:
            rows = [r for r in cache.dump() if r.get("key") == key.hex()]
        return {c["tier"] for c in rows[0]["copies"]} if rows else set()

    def close(self) -> None:
        # SIGKILL: what it would save on a clean stop is not wanted any more.
        self.launcher.kill()
        self.launcher.remove()


@pytest.fixture(scope="module")
def daemon() -> Iterator[Unconfigured]:
    d = Unconfigured()
    try:
        yield d.start()
    finally:
        d.close()


def ask(client: Client, messages: list[dict[str, str]]) -> Completion:
    return client.complete(DEFAULT_MODEL_ID, messages=messages, max_tokens=8, temperature=0.0)


def cold_and_saved(daemon: Unconfigured, messages: list[dict[str, str]]) -> tuple[Completion, int]:
    """The prompt sent once, and its finish save published; the completion and
    the prompt's token count."""
    with daemon.client() as client:
        prompt = client.apply_chat_template(DEFAULT_MODEL_ID, messages, add_generation_prompt=True)
        before = client.counters().get("saves_finish", 0)
        cold = ask(client, messages)
        assert cold.finish_key is not None
        deadline = time.monotonic() + EVENTUALLY
        while client.counters().get("saves_finish", 0) <= before:
            assert time.monotonic() < deadline, "the finish save was never published"
            time.sleep(0.05)
    return cold, len(prompt)


def assert_exact_repeat(
    daemon: Unconfigured, messages: list[dict[str, str]], cold: Completion, n_prompt: int
) -> Completion:
    with daemon.client() as client:
        warm = ask(client, messages)
    assert warm.cache_hit_kind.value == "exact", (warm.cache_hit_kind, warm.cache_miss)
    assert warm.cache_delta.read == n_prompt
    assert warm.stats.prefill_tokens == 0
    assert warm.reply == cold.reply
    return warm


def test_a_restart_keeps_the_cache_warm(daemon: Unconfigured) -> None:
    messages = chat("Notes about an old city")
    cold, n_prompt = cold_and_saved(daemon, messages)
    assert cold.cache_hit_kind.value == "cold"
    assert daemon.stop() == 0
    daemon.start()
    # The clean stop demoted the row into ram_file before ram was purged, and
    # the start linked it back into ram.
    assert cold.finish_key is not None
    key = cold.finish_key
    deadline = time.monotonic() + EVENTUALLY  # the mover is asynchronous
    while not {"ram", "ram_file"} <= daemon.copies(key):
        assert time.monotonic() < deadline, daemon.copies(key)
        time.sleep(0.05)
    warm = assert_exact_repeat(daemon, messages, cold, n_prompt)
    assert warm.cache_delta.sources.ram == n_prompt


def test_a_reboot_keeps_the_cache_warm_from_disk(daemon: Unconfigured) -> None:
    messages = chat("Notes about a harbour town")
    cold, n_prompt = cold_and_saved(daemon, messages)
    assert daemon.stop() == 0
    # A reboot: the tmpfs (ram segments and ram_file) is gone; the disk stays.
    shutil.rmtree(daemon.ram_file)
    daemon.start()
    assert cold.finish_key is not None
    assert daemon.copies(cold.finish_key) == {"disk"}
    assert_exact_repeat(daemon, messages, cold, n_prompt)


def test_a_small_ram_quota_demotes_older_rows_into_ram_file(tmp_path: Path) -> None:
    # Room in ram for one of these rows (~16 MB each), not two.
    d = Unconfigured(LLAMAD_CACHE__RAM__QUOTA="24MiB")
    try:
        d.start()
        first_chat, second_chat = chat("Notes about a river valley"), chat("Notes about a mine")
        first, n_first = cold_and_saved(d, first_chat)
        assert first.finish_key is not None and "ram" in d.copies(first.finish_key)
        second, _ = cold_and_saved(d, second_chat)
        assert second.finish_key is not None
        # The mover demotes asynchronously: wait for its counter.
        with d.client() as client:
            deadline = time.monotonic() + EVENTUALLY
            while client.counters().get("demotions", 0) < 1:
                assert time.monotonic() < deadline, "nothing was demoted"
                time.sleep(0.05)
            counters: Mapping[str, Any] = client.counters()
        assert counters["moves_linked"] >= 1  # ram and ram_file share /dev/shm
        assert "ram" not in d.copies(first.finish_key)
        assert "ram_file" in d.copies(first.finish_key)
        assert "ram" in d.copies(second.finish_key)
        assert_exact_repeat(d, first_chat, first, n_first)
        assert d.stop() == 0
    finally:
        d.close()
