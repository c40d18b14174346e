"""The control plane through the client: loading, listing, unloading, keep_alive,
status and the cache operations, and the front's refusals as their classes."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from daemon_proc import DaemonProc
from llamad import (
    BadRequest,
    CacheHitKind,
    Client,
    ConfigError,
    DaemonStatus,
    GcReport,
    ModelFileError,
    ModelInfo,
    ModelNotFound,
    ModelState,
    ModelStatus,
    NotGGUF,
    PathNotAllowed,
    paths,
)
from served import prompt_text, wait_until

pytestmark = [pytest.mark.timeout(300), pytest.mark.model]

SMALL = {"n_ctx": 512, "n_threads": 1, "n_threads_batch": 1}


@pytest.fixture(scope="module")
def client(served: DaemonProc) -> Iterator[Client]:
    with Client(served.endpoint, timeout=120, connect_timeout=30) as c:
        yield c


def test_load_model_reports_progress_then_serves_and_unload_forgets_it(
    served: DaemonProc, client: Client
) -> None:
    fractions: list[float] = []
    info = client.load_model("extra", "default", progress=fractions.append, **SMALL)
    assert isinstance(info, ModelInfo)
    assert info.model_id == "extra"
    assert info.state is ModelState.READY
    assert info.n_ctx == 512
    assert fractions, "the load streams its progress"
    assert fractions == sorted(fractions)
    assert all(0.0 <= f <= 1.0 for f in fractions)
    assert {m.model_id for m in client.list_models()} >= {"extra", served.model_id}
    assert client.model_info("extra").state is ModelState.READY
    assert client.complete("extra", "Hi", max_tokens=1).stats.completion_tokens == 1
    client.unload("extra")
    with pytest.raises(ModelNotFound):
        client.complete("extra", "Hi", max_tokens=1)


def test_a_model_unloaded_by_keep_alive_is_reloaded_by_the_next_request_and_hits(
    served: DaemonProc, client: Client
) -> None:
    client.load_model("idle", "default", keep_alive=1, **SMALL)
    prompt = prompt_text(600)
    first = client.complete("idle", prompt, max_tokens=2, temperature=0.0)
    served.wait_saved(first.finish_key)
    wait_until(
        lambda: client.model_info("idle").state is ModelState.UNLOADED,
        "keep_alive to unload the model",
    )
    assert served.worker_pid("idle") is None
    # The client still holds its old route; the request routes again and the
    # front loads the model first.
    again = client.complete("idle", prompt, max_tokens=2, temperature=0.0)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert again.reply == first.reply
    client.unload("idle")


def test_set_keep_alive_changes_when_an_idle_model_unloads(
    served: DaemonProc, client: Client
) -> None:
    client.load_model("kept", "default", **SMALL)
    assert client.model_info("kept").keep_alive_s is None
    assert client.complete("kept", "Hi", max_tokens=1).stats.completion_tokens == 1
    info = client.set_keep_alive("kept", 0.5)
    assert info.keep_alive_s == 0.5
    wait_until(
        lambda: client.model_info("kept").state is ModelState.UNLOADED,
        "the keep_alive set at run time to unload the model",
    )
    # Kept, unloaded: the next request loads it again.
    assert client.complete("kept", "Hi", max_tokens=1).stats.completion_tokens == 1
    assert client.set_keep_alive("kept", None).keep_alive_s is None
    with pytest.raises(ModelNotFound):
        client.set_keep_alive("never-loaded", 1.0)
    with pytest.raises(BadRequest):
        client.set_keep_alive("kept", -1.0)
    client.unload("kept")


def test_the_front_refuses_bad_loads_with_their_own_classes(
    served: DaemonProc, client: Client
) -> None:
    with pytest.raises(PathNotAllowed):
        client.load_model("outside", "/etc/hostname", **SMALL)
    junk = served.models_dir / "junk.gguf"
    junk.write_bytes(b"this is not a gguf file" * 100)
    with pytest.raises(NotGGUF):
        client.load_model("junk", str(junk), **SMALL)
    long = served.models_dir / ("m" * 300 + ".gguf")  # a name over NAME_MAX
    with pytest.raises(ModelFileError) as too_long:
        client.load_model("long", str(long), **SMALL)
    assert "too long a path" in too_long.value.message
    with pytest.raises(ConfigError) as info:
        client.load_model("bad", str(paths.default_model_path()), n_ctx="big")
    assert "n_ctx" in info.value.message
    with pytest.raises(ModelNotFound):
        client.model_info("never-loaded")
    assert client.complete(served.model_id, "Hi", max_tokens=1).stats.completion_tokens == 1


def test_status_counters_eviction_and_gc(served: DaemonProc, client: Client) -> None:
    client.complete(served.model_id, prompt_text(601), max_tokens=2)
    status = client.status()
    assert isinstance(status, DaemonStatus)
    assert status.pid == served.pid
    assert served.model_id in {m.info.model_id for m in status.models}
    mine = client.status(served.model_id)
    assert isinstance(mine, ModelStatus)
    assert mine.worker is not None
    assert mine.worker.pid == served.worker_pid()
    with pytest.raises(ModelNotFound):
        client.status("never-loaded")
    counters = client.counters()
    assert counters["misses"] >= 1
    # Any count is taken, clamped: this one means all that can go.
    freed = client.evict_bytes(sys.maxsize)
    assert freed > 0
    with pytest.raises(BadRequest):
        client.evict_bytes(-1)
    assert isinstance(client.gc(), GcReport)
    assert client.counters()["evictions"] >= 1
