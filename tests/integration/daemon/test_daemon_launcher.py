"""The daemon harness (``llamad.testing.Launcher``) against the real daemon: a refused
start fails readiness at once with the daemon's own words; a daemon SIGKILLed leaves
things behind that the launcher finds and removes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from llamad.testing import DaemonFailed, Launcher, wait_gone

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    d = Launcher(prefix="llt-")
    try:
        yield d
    finally:
        d.close()


def test_a_refused_config_fails_readiness_at_once_with_the_daemons_log(
    launcher: Launcher,
) -> None:
    launcher.write_config(
        f'[daemon]\nruntime_dir = "{launcher.runtime}"\nstate_dir = "{launcher.state}"\n'
        "no_such_key = 1\n"
    )
    launcher.start()
    with pytest.raises(DaemonFailed) as info:
        # Far longer than the daemon takes to refuse: the failure must not wait.
        launcher.wait_routed(["smollm2"], timeout=280)
    message = str(info.value)
    assert "exited with status 78" in message  # EXIT_CONFIG
    assert "daemon.no_such_key" in message
    assert not launcher.runtime.exists()
    launcher.remove()
    assert launcher.leftovers() == []


@pytest.mark.model
def test_a_killed_daemon_leaves_its_instances_files_and_remove_takes_them(
    launcher: Launcher,
) -> None:
    # No config file: the cache's defaults (ram_file on /dev/shm under the
    # instance's default root) and the default model, on one thread.
    launcher.env.update(
        LLAMAD_MODELS__SMOLLM2__PATH="default",
        LLAMAD_MODELS__SMOLLM2__N_THREADS="1",
        LLAMAD_MODELS__SMOLLM2__N_THREADS_BATCH="1",
    )
    route = launcher.start().wait_routed(["smollm2"], timeout=240)["smollm2"]
    assert route.actor == "model.smollm2"
    tree = launcher.tree()
    assert len(tree) >= 3  # cache-meta, the worker, front
    launcher.kill()
    assert wait_gone(tree, 10) == []
    # Nothing was stopped cleanly: the ram tier's lock file and the ram_file
    # tier's directory outlive the daemon, beside its private directory.
    left = launcher.leftovers()
    assert launcher.base in left
    assert any(p.name.startswith(f"llamad-ram.{launcher.instance}.") for p in left), left
    launcher.remove()
    assert launcher.leftovers() == []
