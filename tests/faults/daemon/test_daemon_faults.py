"""Faults in a running daemon: SIGKILL a worker, cache-meta, the front, the root; model_sup
stopped and started again; a model whose worker fails on every load. One daemon for the
module, broken a piece at a time (the root last)."""

from __future__ import annotations

import os
import select
import shutil
import signal
import threading
from collections.abc import Iterator

import psutil
import pytest

from daemon_harness import GREEDY, Daemon, prompt_text, wait_gone, wait_until
from llamad import paths
from llamad.actors import Registry
from llamad.errors import RequestTimeout, Unavailable
from llamad.front.wire import ModelFailed, ModelState
from llamad.llama_ffi.errors import TruncatedGGUF
from llamad.model.results import CacheHitKind, FinishReason
from llamad.model.worker_client import WorkerClient
from llamad.supervisor import ChildInfo
from llamad.supervisor.service import SupervisorClient

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = Daemon({"a": {}, "victim": {"path": "PLACEHOLDER"}})
    # The victim's own copy of the model, so the test can damage it.
    victim = d.models_dir / "victim.gguf"
    shutil.copyfile(paths.default_model_path(), victim)
    d.config.write_text(d.config.read_text().replace("PLACEHOLDER", str(victim)))
    try:
        d.start(wait_for=["a", "victim"])
        yield d
    finally:
        d.cleanup()


def _kill(pid: int) -> None:
    """SIGKILL ``pid`` and return once it is gone."""
    fd = os.pidfd_open(pid)
    try:
        os.kill(pid, signal.SIGKILL)
        assert select.select([fd], [], [], 10)[0], f"{pid} survived SIGKILL"
    finally:
        os.close(fd)


def test_a_killed_worker_is_restarted_and_the_next_request_succeeds(daemon: Daemon) -> None:
    before = daemon.info("a")
    assert before.pid is not None
    _kill(before.pid)
    after = wait_until(
        lambda: (i := daemon.info("a")).state is ModelState.READY and i.pid != before.pid and i,
        "a's worker to be restarted",
    )
    assert after.restarts == 1 and after.last_exit == "signal SIGKILL"
    route = daemon.route("a")
    assert Registry(route.registry_root).lookup(route.actor).pid == after.pid  # type: ignore[union-attr]
    reply = daemon.worker("a").complete(prompt_text(21), max_tokens=3, **GREEDY)
    assert reply.stats.completion_tokens == 3
    (model_sup,) = [s for s in daemon.status().supervisors if s.name == "model_sup"]
    (row,) = [c for c in model_sup.children if c.id == "model.a"]
    assert row.restarts == 1 and row.last_exit == "signal SIGKILL"


def test_cache_meta_killed_mid_request_the_request_completes_and_the_cache_returns(
    daemon: Daemon,
) -> None:
    worker = daemon.worker("a")
    meta = daemon.child_pid("cache-meta")
    outcome: list[object] = []

    def request() -> None:
        with WorkerClient("a", registry=Registry(daemon.registry_root)) as w:
            outcome.append(w.complete(prompt_text(22, words=120), max_tokens=24, **GREEDY))

    t = threading.Thread(target=request)
    t.start()
    wait_until(lambda: (b := daemon.board("a")) is not None and b.status.pending_len, "busy")
    _kill(meta)
    t.join(120)
    (done,) = outcome
    assert getattr(done, "finish_reason", None) in (FinishReason.LENGTH, FinishReason.STOP)
    wait_until(
        lambda: (e := Registry(daemon.registry_root).lookup("cache-meta")) and e.pid != meta,
        "cache-meta to be restarted",
    )
    prompt = prompt_text(23)
    cold = worker.complete(prompt, max_tokens=4, **GREEDY)
    daemon.wait_saved(cold.finish_key)
    assert worker.complete(prompt, max_tokens=4, **GREEDY).cache_hit_kind is CacheHitKind.EXACT


def test_a_killed_front_is_restarted_with_its_table_and_workers_kept(daemon: Daemon) -> None:
    _, runtime = daemon.load("rt", n_ctx=512)
    pids = {m: daemon.info(m).pid for m in ("a", "victim", "rt")}
    front = daemon.child_pid("llamad.front")
    _kill(front)
    # Workers serve on while the front is down (streams never pass through it).
    reply = WorkerClient("a", registry=Registry(daemon.registry_root)).complete(
        prompt_text(24), max_tokens=2, **GREEDY
    )
    assert reply.stats.completion_tokens == 2
    route = daemon.route("rt")  # the same client: it reconnects to the new front
    assert daemon.child_pid("llamad.front") != front
    assert route.actor == "model.rt"
    for model_id, pid in pids.items():
        info = daemon.info(model_id)
        assert info.state is ModelState.READY and info.pid == pid
    assert daemon.info("rt").n_ctx == runtime.n_ctx == 512  # a run-time load, remembered
    (root,) = [s for s in daemon.status().supervisors if s.name == "llamad"]
    assert {c.id: c.restarts for c in root.children} == {
        "cache_sup": 0,
        "model_sup": 0,
        "front": 1,
        "gateway": 0,
    }


def test_a_model_failing_on_every_load_is_given_up_reported_and_others_serve(
    daemon: Daemon,
) -> None:
    victim = daemon.models_dir / "victim.gguf"
    pid = daemon.info("victim").pid
    assert pid is not None
    with victim.open("r+b") as fh:  # every later load finds a truncated file
        fh.truncate(victim.stat().st_size // 2)
    _kill(pid)
    failed = daemon.wait_state("victim", ModelState.FAILED, timeout=120)
    assert "restarts within" in (failed.error or "")
    assert failed.pid is None
    with pytest.raises(ModelFailed) as refused:
        daemon.route("victim")
    assert refused.value.details["model_id"] == "victim"
    assert "restarts within" in refused.value.details["error"]
    with pytest.raises(TruncatedGGUF):  # load_model tries again, and says why not
        daemon.load("victim", path=str(victim))

    # Given up for good: model_sup holds no child for it, so nothing is left
    # that would restart a worker (the front, the only other starter, holds it
    # FAILED: route and load_model above refused), and model_sup did not escalate.
    def children() -> tuple[list[str]] | None:
        sup = SupervisorClient("llamad.model_sup", registry=Registry(daemon.registry_root))
        try:
            return ([c.id for c in sup.which_children()],)
        except (Unavailable, RequestTimeout):  # a loaded machine: it answers late
            return None
        finally:
            sup.close()

    (ids,) = wait_until(children, "model_sup's children")
    assert "model.victim" not in ids
    assert Registry(daemon.registry_root).lookup("model.victim") is None
    reply = daemon.worker("a").complete(prompt_text(25), max_tokens=2, **GREEDY)
    assert reply.stats.completion_tokens == 2
    (root,) = [s for s in daemon.status().supervisors if s.name == "llamad"]
    assert {c.id: c.restarts for c in root.children}["model_sup"] == 0


def test_model_sup_is_a_thread_of_the_root_and_the_front_loads_its_models_after_it_restarts(
    daemon: Daemon,
) -> None:
    # model_sup is hosted on a thread of the root (SPEC P9): no process of
    # its own, its workers the root's children. A crash of its loop or a kill
    # for silence is test_sup_hosted.py's; here the root stops it (its
    # workers end with it) and starts it again, and the front must notice
    # and load every model it should serve.
    old = daemon.info("a").pid
    assert old is not None
    root = psutil.Process(daemon.pid)
    (sup,) = [c for c in _root_children(daemon) if c.id == "model_sup"]
    assert sup.pid in {t.id for t in root.threads()}
    worker = psutil.Process(old)
    assert worker.ppid() == daemon.pid
    with SupervisorClient("llamad.root", registry=Registry(daemon.registry_root)) as rootsup:
        rootsup.terminate_child("model_sup")
        assert wait_gone([worker], timeout=30) == []
        rootsup.restart_child("model_sup")
    wait_until(lambda: daemon.info("a").pid not in (None, old), "a's worker to be loaded again")
    reply = daemon.worker("a").complete(prompt_text(26), max_tokens=2, **GREEDY)
    assert reply.stats.completion_tokens == 2
    daemon.wait_state("rt", ModelState.READY)  # a run-time load comes back too
    assert daemon.info("victim").state is ModelState.FAILED  # given up stays given up


def _root_children(daemon: Daemon) -> list[ChildInfo]:
    with SupervisorClient("llamad.root", registry=Registry(daemon.registry_root)) as rootsup:
        return rootsup.which_children()


def test_a_killed_root_leaves_no_process_within_two_seconds(daemon: Daemon) -> None:
    tree = daemon.tree()
    assert len(tree) >= 4  # cache-meta, the front, two workers at least
    daemon.kill()
    assert wait_gone(tree, timeout=2.0) == []
