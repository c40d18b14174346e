"""The daemon as a whole: the front routes, loads, unloads and reports; workers serve.

One daemon for the module (three configured models on the default model, one
thread each); the tests use models of their own or only read shared state.
The public client is engineer J's: here the front is called through a plain
actors client and workers through :class:`WorkerClient`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from daemon_harness import GREEDY, Daemon, prompt_text, wait_until
from llamad.actors import Registry
from llamad.errors import ConfigError, ModelNotFound
from llamad.front.wire import LoadProgress, ModelInfo, ModelState, PathNotAllowed
from llamad.llama_ffi.errors import NotGGUF
from llamad.model.results import CacheHitKind, TokenEvent
from llamad.model.status_board import load_progress_path, read_load_progress
from llamad.model.worker_client import WorkerClient

pytestmark = [pytest.mark.model, pytest.mark.timeout(240)]

ENDLESS = 'root ::= "la " root'


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = Daemon(
        {
            "smol": {},
            "other": {"n_ctx": 768},
            # n_ctx: an endless request must outlast keep_alive by far. At 512
            # it reached the context's end (468 tokens) in 4.85-5.0 s on a quiet
            # machine, inside the 5 s the keep-alive test streams for.
            "idle": {"n_ctx": 2048, "keep_alive": "3s"},
        },
        max_message_bytes="1MiB",
    )
    try:
        d.start(wait_for=["smol", "other"])
        yield d
        assert d.stop() == 0
    finally:
        d.cleanup()


def test_route_names_the_worker_and_a_completion_goes_to_it_directly(daemon: Daemon) -> None:
    route = daemon.route("smol")
    entry = Registry(route.registry_root).lookup(route.actor)
    assert route.actor == "model.smol"
    assert entry is not None and entry.instance == route.instance
    worker = daemon.worker("smol")
    prompt = prompt_text(1)
    cold = worker.complete(prompt, max_tokens=8, **GREEDY)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    daemon.wait_saved(cold.finish_key)
    warm = worker.complete(prompt, max_tokens=8, **GREEDY)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.reply == cold.reply


def test_load_model_streams_progress_then_its_model_info(daemon: Daemon) -> None:
    events, info = daemon.load("extra", n_ctx=512)
    fractions = [e.fraction for e in events]
    assert fractions, "no progress event"
    assert fractions == sorted(fractions) and fractions[0] >= 0.0 and fractions[-1] == 1.0
    assert info.state is ModelState.READY and info.n_ctx == 512 and info.pid is not None
    assert daemon.route("extra").actor == "model.extra"
    assert Registry(daemon.registry_root).lookup("model.extra").pid == info.pid  # type: ignore[union-attr]
    # The worker itself reported its load (the front reads what it wrote).
    report = read_load_progress(load_progress_path(daemon.registry_root, "model.extra"))
    assert report is not None and report.pid == info.pid and report.fraction == 1.0
    listed = daemon.front.call("list_models", {}, reply_type=list[ModelInfo])
    assert [m.model_id for m in listed] == ["extra", "idle", "other", "smol"]


def test_unload_then_reload_keeps_the_cache(daemon: Daemon) -> None:
    daemon.load("swap", n_ctx=512)
    prompt = prompt_text(2)
    cold = daemon.worker("swap").complete(prompt, max_tokens=6, **GREEDY)
    assert cold.cache_hit_kind is CacheHitKind.COLD
    daemon.wait_saved(cold.finish_key)
    pid = daemon.info("swap").pid
    assert daemon.front.call("unload", {"model_id": "swap"}) is None
    assert Registry(daemon.registry_root).lookup("model.swap") is None
    with pytest.raises(ModelNotFound):  # loaded at run time: unload forgets it
        daemon.info("swap")
    _, info = daemon.load("swap", n_ctx=512)
    assert info.pid != pid
    warm = daemon.worker("swap").complete(prompt, max_tokens=6, **GREEDY)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.reply == cold.reply


def test_two_models_serve_at_once_with_separate_namespaces(daemon: Daemon) -> None:
    prompt = prompt_text(3)
    first = daemon.worker("smol").complete(prompt, max_tokens=4, **GREEDY)
    daemon.wait_saved(first.finish_key)
    # Same file, another n_ctx: another KV layout, so none of smol's rows.
    other = daemon.worker("other").complete(prompt, max_tokens=4, **GREEDY)
    assert other.cache_hit_kind is CacheHitKind.COLD
    daemon.wait_saved(other.finish_key)
    again = daemon.worker("other").complete(prompt, max_tokens=4, **GREEDY)
    assert again.cache_hit_kind is CacheHitKind.EXACT
    assert daemon.info("smol").pid != daemon.info("other").pid


def test_keep_alive_unloads_an_idle_model_and_the_next_route_reloads_it_warm(
    daemon: Daemon,
) -> None:
    prompt = prompt_text(4)
    cold = daemon.worker("idle").complete(prompt, max_tokens=6, **GREEDY)
    daemon.wait_saved(cold.finish_key)
    pid = daemon.info("idle").pid
    unloaded = daemon.wait_state("idle", ModelState.UNLOADED, timeout=30)
    assert unloaded.pid is None
    assert Registry(daemon.registry_root).lookup("model.idle") is None
    route = daemon.route("idle")  # loads it again before answering
    info = daemon.info("idle")
    assert info.state is ModelState.READY and info.pid not in (None, pid)
    assert Registry(route.registry_root).lookup(route.actor).pid == info.pid  # type: ignore[union-attr]
    warm = daemon.worker("idle").complete(prompt, max_tokens=6, **GREEDY)
    assert warm.cache_hit_kind is CacheHitKind.EXACT
    assert warm.reply == cold.reply


def test_keep_alive_never_unloads_a_model_while_a_request_runs(daemon: Daemon) -> None:
    route = daemon.route("idle")
    with WorkerClient("idle", registry=Registry(route.registry_root)) as worker:
        stream = worker.infer(prompt_text(6), max_tokens=100_000, grammar=ENDLESS, **GREEDY)
        events = iter(stream)
        started = time.monotonic()
        while time.monotonic() - started < 5.0:  # longer than its keep_alive of 3 s
            assert isinstance(next(events), TokenEvent)
        assert daemon.info("idle").state is ModelState.READY
        stream.cancel()
    daemon.wait_state("idle", ModelState.UNLOADED, timeout=30)


def test_refused_loads_are_typed_and_the_daemon_keeps_serving(daemon: Daemon) -> None:
    with pytest.raises(PathNotAllowed) as outside:
        daemon.load("bad", path="/etc/hostname")
    assert outside.value.details["field"] == "models.bad.path"
    junk = daemon.models_dir / "junk.gguf"
    junk.write_bytes(b"this is not a model file at all" * 100)
    with pytest.raises(NotGGUF):
        daemon.load("bad", path=str(junk))
    with pytest.raises(ConfigError) as option:
        daemon.load("bad", n_ctx=-4, n_seqmax=2)
    keys = {e["key"] for e in option.value.details["errors"]}
    assert keys == {"models.bad.n_ctx", "models.bad.n_seqmax"}
    with pytest.raises(ModelNotFound):
        daemon.route("nobody")
    with pytest.raises(ModelNotFound):
        daemon.info("bad")
    reply = daemon.worker("smol").complete(prompt_text(5), max_tokens=3, **GREEDY)
    assert reply.stats.completion_tokens == 3


def test_status_reports_models_workers_supervisors_and_tiers(daemon: Daemon) -> None:
    status = daemon.status()
    assert status.pid == daemon.pid
    models = {m.info.model_id: m for m in status.models}
    smol = models["smol"]
    assert smol.info.state is ModelState.READY
    assert smol.worker is not None and smol.worker.pid == smol.info.pid
    sups = {s.name: s for s in status.supervisors}
    assert set(sups) == {"llamad", "cache_sup", "model_sup"}
    assert [c.id for c in sups["llamad"].children] == ["cache_sup", "model_sup", "front", "gateway"]
    assert all(c.state == "running" for c in sups["llamad"].children)
    assert [c.id for c in sups["cache_sup"].children] == ["cache-meta"]
    assert "model.smol" in {c.id for c in sups["model_sup"].children}
    assert set(status.tiers) == {"ram", "disk"}
    assert status.tiers["ram"].quota == 256 << 20
    # The front reads the shared counters: a hit this test makes shows there
    # (cache-meta's at its next stats flush, so polled). A repeat sent back to
    # back reuses the live KV the first request left (the worker counts
    # hits_live); a later one goes to cache-meta, which files it under the
    # lookup that found it (exact, or the longest-prefix walk).
    hits = ("hits_exact", "hits_longest_prefix", "hits_resume", "hits_live")
    before = daemon.front.call("counters", {})
    worker = daemon.worker("smol")
    prompt = prompt_text(7)
    cold = worker.complete(prompt, max_tokens=4, **GREEDY)
    daemon.wait_saved(cold.finish_key)
    after_save = daemon.front.call("counters", {})
    assert worker.complete(prompt, max_tokens=4, **GREEDY).cache_hit_kind is CacheHitKind.EXACT
    counters = wait_until(
        lambda: (
            (c := daemon.front.call("counters", {}))
            and sum(c[h] for h in hits) > sum(after_save[h] for h in hits)
            and c
        ),
        "the warm repeat's hit in the counters",
    )
    assert counters["saves_finish"] > before["saves_finish"]
    assert "bytes_ram" in counters
    assert status.tiers["ram"].bytes > 0  # the rows saved by the tests before
    gc = daemon.front.call("gc", {})
    assert set(gc) == {"evicted", "bytes_freed", "missing", "reaped"}
    assert daemon.front.call("evict_bytes", {"n": 0, "tiers": ["disk"]}) == 0
    # Any count the wire carries, clamped (this client does not clamp it first).
    assert daemon.front.call("evict_bytes", {"n": 2**64 - 1, "tiers": ["disk"]}) >= 0
    wait_until(lambda: daemon.board("smol") is not None, "smol's board")


def test_the_front_drops_frames_over_the_configured_size_and_keeps_serving(
    daemon: Daemon,
) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(daemon.endpoint)
        # Under the actors' default limits (64 MiB frames, 1 MiB headers) this
        # would be read and answered too_large; over [security]'s 1 MiB, ZeroMQ
        # drops the connection before allocating it, and nothing answers.
        sock.send(b"\x95" + b"x" * (2 << 20))
        assert sock.poll(1000) == 0
    finally:
        sock.close()
        ctx.term()
    assert daemon.route("smol").actor == "model.smol"


def test_a_configured_model_stays_known_after_unload_and_reloads_its_own_table(
    daemon: Daemon,
) -> None:
    assert daemon.front.call("unload", {"model_id": "other"}) is None
    info = daemon.info("other")
    assert info.state is ModelState.UNLOADED and info.pid is None
    # No path: the configured table (n_ctx 768, not the default 4096).
    stream = daemon.front.stream("load_model", {"model_id": "other"}, event_type=LoadProgress)
    list(stream)
    reloaded = msgspec.convert(stream.result, ModelInfo)
    assert reloaded.state is ModelState.READY and reloaded.n_ctx == 768
    assert daemon.route("other").actor == "model.other"
