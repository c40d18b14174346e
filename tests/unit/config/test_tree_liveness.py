"""Every supervised part of the daemon's tree has a liveness window (issue 17): a
part that stops (SIGSTOP, stuck in a call) is found hung and restarted by its
supervisor. Read off the tree a config builds, nested supervisors included."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from config_helpers import Workspace
from llamad.daemon.tree import daemon_spec
from llamad.supervisor.spec import SUPERVISOR_ENTRY, ChildSpec, SupervisorSpec

pytestmark = pytest.mark.timeout(60)


def _parts(spec: SupervisorSpec, path: str = "") -> Iterator[tuple[str, ChildSpec]]:
    """Every child spec of ``spec`` and of the supervisors under it, by path."""
    for child in spec.children:
        where = f"{path}/{child.id}"
        yield where, child
        if child.start.target == SUPERVISOR_ENTRY:
            yield from _parts(SupervisorSpec.from_wire(child.start.kwargs["spec"]), where)


def test_every_supervised_part_has_a_liveness_window(ws: Workspace) -> None:
    windows = {
        where: child.liveness_timeout
        for where, child in _parts(daemon_spec(ws.loaded(ws.data()), started_at=0.0))
    }
    assert windows == {
        "/cache_sup": 30.0,
        "/cache_sup/cache-meta": 10.0,
        "/model_sup": 30.0,
        "/model_sup/model-worker": 5.0,
        "/front": 15.0,
        "/gateway": 15.0,
    }


def test_cache_meta_takes_its_window_from_the_config(ws: Workspace) -> None:
    config = ws.loaded(ws.data({("cache", "liveness_s"): "2s"}))
    windows = dict(_parts(daemon_spec(config, started_at=0.0)))
    assert windows["/cache_sup/cache-meta"].liveness_timeout == 2.0
