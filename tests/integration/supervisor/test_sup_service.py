"""Other processes drive a supervisor over the actor runtime (the daemon front → model_sup)."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.actors import Client, Registry
from llamad.errors import BadRequest
from llamad.supervisor import (
    ChildAlreadyStarted,
    ChildNotFound,
    ChildSpec,
    ChildState,
    InvalidSpec,
    SimpleOneForOne,
    Start,
    Supervisor,
    SupervisorSpec,
    SupFlags,
    supervisor_child,
)
from llamad.supervisor.service import SupervisorClient, SupervisorService
from sup_helpers import EventLog, pid_alive, toy, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private registry; short, because ipc socket paths are limited to 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="llsup"))
    monkeypatch.setenv("LLAMAD_RUNTIME_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def model_sup(events: EventLog) -> SupervisorSpec:
    template = ChildSpec("model", Start("sup_toys:sleeper", (events.path,)), restart="transient")
    return SupervisorSpec("model_sup", SupFlags(strategy="simple_one_for_one"), (template,))


def test_front_starts_and_stops_workers_under_model_sup_in_its_own_process(
    events: EventLog, runtime: Path
) -> None:
    root = SupervisorSpec(
        "root", SupFlags(), (supervisor_child(model_sup(events), service="model_sup"),)
    )
    with Supervisor(root), SupervisorClient("model_sup") as front:
        child_id, pid = front.start_child(["smollm2"], child_id="smollm2")
        assert (child_id, events.of("start", "smollm2")[0]["pid"]) == ("smollm2", pid)
        auto_id, _ = front.start_child(["llama-8b"])
        assert auto_id == "model-1"
        infos = front.which_children()
        assert (infos[0].id, infos[0].pid, infos[0].state) == ("smollm2", pid, ChildState.RUNNING)
        assert front.count_children().active == 2
        with pytest.raises(ChildAlreadyStarted):
            front.start_child(["again"], child_id="smollm2")
        with pytest.raises(SimpleOneForOne):
            front.restart_child("smollm2")
        front.terminate_child("smollm2")
        assert not pid_alive(pid)
        with pytest.raises(ChildNotFound):
            front.pid_of("smollm2")
        assert [c.id for c in front.which_children()] == ["model-1"]


def test_worker_restart_is_visible_to_the_front(events: EventLog, runtime: Path) -> None:
    root = SupervisorSpec(
        "root", SupFlags(), (supervisor_child(model_sup(events), service="model_sup"),)
    )
    with Supervisor(root), SupervisorClient("model_sup") as front:
        _, pid = front.start_child(["smollm2"], child_id="smollm2")
        os.kill(pid, signal.SIGKILL)
        new_pid = wait_until(
            lambda: (c := front.which_children()[0]).pid not in (None, pid) and c.pid,
            "smollm2 restarted under the same id",
        )
        assert pid_alive(new_pid)


def test_bad_requests_get_typed_errors_and_the_service_keeps_serving(
    events: EventLog, runtime: Path
) -> None:
    with Supervisor(SupervisorSpec("static", SupFlags(), ())) as sup:
        service = SupervisorService(sup, "static_sup")
        service.start()
        try:
            with Client(name="static_sup", registry=Registry()) as raw:
                with pytest.raises(InvalidSpec) as e:
                    raw.call("start_child", {"spec": {"id": "x", "start": {"target": "nope"}}})
                assert e.value.field == "spec.start.target"
                with pytest.raises(BadRequest):
                    raw.call("start_child", {"spec": "not a mapping", "colour": 1})
                with pytest.raises(ChildNotFound):
                    raw.call("terminate_child", {"child": "ghost"})
            with SupervisorClient("static_sup") as client:
                _, pid = client.start_child(toy(events, "sleeper", "a"))
                assert client.which_children()[0].pid == pid
                client.terminate_child("a")
                assert client.which_children()[0].state is ChildState.UNDEFINED
                assert client.restart_child("a") != pid
                client.terminate_child("a")
                client.delete_child("a")
                assert client.count_children().specs == 0
        finally:
            service.stop()
