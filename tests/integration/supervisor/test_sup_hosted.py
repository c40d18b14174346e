"""A supervisor child hosted on a thread of its parent (``ChildSpec.hosted``, SPEC P9).

The daemon's ``cache_sup`` and ``model_sup`` run this way. Their parent must
see them as it sees a process: started once their own children run, stopped
in order, restarted after a crash or when silent past their liveness window,
their children dying with them; a hosted loop that cannot be stopped takes
the whole process down (``wedged``, run in a subprocess of its own).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import structlog

from llamad.actors import Registry
from llamad.supervisor import (
    ChildState,
    InvalidSpec,
    Supervisor,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)
from llamad.supervisor import hosted as hosted_mod
from llamad.supervisor.service import SupervisorClient
from llamad.supervisor.spec import ChildSpec, Start
from sup_helpers import EVENTUALLY, EventLog, pid_alive, toy, wait_until

pytestmark = [pytest.mark.timeout(120)]

SUPPORT = Path(__file__).resolve().parents[2] / "support"


def inner_spec(events: EventLog, *, ignore_term: bool = False) -> SupervisorSpec:
    worker = toy(events, "sleeper", "w", 0.0, ignore_term, shutdown=30.0)
    return SupervisorSpec("inner", SupFlags(intensity=5, period=60), (worker,))


def outer(events: EventLog, *, liveness: float | None = 5.0, **kw: object) -> Supervisor:
    child = supervisor_child(
        inner_spec(events, **kw),  # type: ignore[arg-type]
        liveness_timeout=liveness,
        hosted=True,
    )
    return Supervisor(SupervisorSpec("outer", SupFlags(intensity=5, period=60), (child,)))


def hosted_thread_ids() -> set[int]:
    return {t.native_id for t in threading.enumerate() if t.name == "hosted-inner" and t.native_id}


def running_inner(sup: Supervisor, not_pid: int | None = None) -> int:
    def check() -> int | None:
        (c,) = sup.which_children()
        ok = c.state is ChildState.RUNNING and c.pid is not None and c.pid != not_pid
        return c.pid if ok else None

    pid: int = wait_until(check, "inner running", EVENTUALLY)
    return pid


@pytest.fixture
def loop_breaks(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, threading.Event]]:
    """Switches that make the *inner* supervisor's loop raise or wedge on its next turn."""
    switches = {"crash": threading.Event(), "wedge": threading.Event(), "free": threading.Event()}
    original = Supervisor._check_liveness

    def check(self: Supervisor) -> None:
        if self.name == "inner" and switches["crash"].is_set():
            switches["crash"].clear()
            raise RuntimeError("a bug in the inner supervisor's loop")
        if self.name == "inner" and switches["wedge"].is_set():
            switches["free"].wait()
        original(self)

    monkeypatch.setattr(Supervisor, "_check_liveness", check)
    yield switches
    switches["free"].set()


def test_a_hosted_supervisor_is_a_thread_whose_children_are_processes_of_this_one(
    events: EventLog,
) -> None:
    with outer(events) as sup:
        pid = running_inner(sup)
        assert pid != os.getpid()
        assert pid in hosted_thread_ids()
        (w,) = events.wait_for("start", "w")
        assert w["pid"] != os.getpid()
        assert pid_alive(w["pid"])
        assert psutil.Process(w["pid"]).ppid() == os.getpid()
    # Stopped in order: its worker got SIGTERM and is gone; the thread ended.
    assert events.of("term", "w")
    assert not pid_alive(w["pid"])
    assert hosted_thread_ids() == set()


def test_a_hosted_supervisor_serves_its_api_under_its_name(
    events: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="hs-", dir="/tmp"))  # short: an ipc path
    monkeypatch.setenv("LLAMAD_RUNTIME_DIR", str(runtime))
    child = supervisor_child(
        inner_spec(events), liveness_timeout=5.0, hosted=True, service="inner.svc"
    )
    try:
        with Supervisor(SupervisorSpec("outer", SupFlags(), (child,))) as sup:
            running_inner(sup)
            with SupervisorClient("inner.svc", registry=Registry(), timeout=30) as client:
                (w,) = client.which_children()
                assert (w.id, w.state) == ("w", ChildState.RUNNING)
    finally:
        shutil.rmtree(runtime, ignore_errors=True)


def test_a_crashed_hosted_loop_takes_its_children_down_and_is_restarted(
    events: EventLog, loop_breaks: dict[str, threading.Event]
) -> None:
    with structlog.testing.capture_logs() as logs, outer(events) as sup:
        first = running_inner(sup)
        (w,) = events.wait_for("start", "w")
        loop_breaks["crash"].set()
        running_inner(sup, not_pid=first)
        assert not pid_alive(w["pid"])  # killed by the crashing supervisor's cleanup
        assert len(events.wait_for("start", "w", count=2)) == 2
    exited = next(e for e in logs if e["event"] == "child.exited" and e["pid"] == first)
    assert (exited["reason"], exited["exit"]) == ("abnormal", "exit 1")
    restarted = [e for e in logs if e["event"] == "child.restarted" and e["child"] == "inner"]
    assert len(restarted) == 1


def test_a_silent_hosted_supervisor_is_killed_with_its_children_and_restarted(
    events: EventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its beat stops while its loop still turns: the parent judges it hung,
    # kills it (its children at once, no shutdown policy) and starts it again.
    silent = threading.Event()
    original = hosted_mod.PipeBeat.beat

    def beat(self: hosted_mod.PipeBeat, sup: object) -> None:
        if not silent.is_set():
            original(self, sup)

    monkeypatch.setattr(hosted_mod.PipeBeat, "beat", beat)
    with structlog.testing.capture_logs() as logs, outer(events, liveness=1.0) as sup:
        first = running_inner(sup)
        (w,) = events.wait_for("start", "w")
        silent.set()
        wait_until(lambda: any(e["event"] == "child.hung" for e in logs), "inner hung")
        silent.clear()
        running_inner(sup, not_pid=first)
        assert not pid_alive(w["pid"])
    assert w["pid"] not in [e["pid"] for e in events.of("term", "w")], "killed, not asked to stop"
    exited = next(e for e in logs if e["event"] == "child.exited" and e["pid"] == first)
    assert (exited["exit"], exited["cause"]) == ("signal SIGKILL", "hung")


def test_a_kill_cuts_a_graceful_stop_short(events: EventLog) -> None:
    # The worker ignores SIGTERM and may take 30 s to stop: a kill during
    # that stop must not wait for it.
    sup = Supervisor(inner_spec(events, ignore_term=True))
    sup.start()
    (w,) = events.wait_for("start", "w")
    sup.request_stop()
    events.wait_for("term", "w")
    sup.request_kill()
    assert sup.wait(10.0) is not None, "the kill waited for the worker's shutdown"
    assert not pid_alive(w["pid"])


def test_only_a_supervisor_child_can_be_hosted(events: EventLog) -> None:
    with pytest.raises(InvalidSpec, match="hosted"):
        ChildSpec("w", Start("sup_toys:sleeper", (events.path, "w")), hosted=True)
    with pytest.raises(InvalidSpec, match="hosted"):
        spec = supervisor_child(inner_spec(events), hosted=True)
        ChildSpec(spec.id, spec.start, type=spec.type, hosted=True, env={"A": "1"})
    wire = supervisor_child(inner_spec(events), hosted=True).to_wire()
    assert ChildSpec.from_wire(wire).hosted is True


def test_a_wedged_hosted_loop_takes_the_process_down_and_every_child_with_it(
    tmp_path: Path,
) -> None:
    events = EventLog(tmp_path / "events.jsonl")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SUPPORT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(SUPPORT / "hosted_wedge_root.py"), events.path],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    (w,) = events.of("start", "w")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "sup.hosted_wedged" in proc.stdout + proc.stderr
    wait_until(lambda: not pid_alive(w["pid"]), "the worker gone by its parent-death signal")
