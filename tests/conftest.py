"""What every test shares: structlog's configuration is put back after each test,
and bench results are recorded into a temporary folder.

A test that runs ``llamad.cli.main.main`` in this process runs ``logs.configure``
(a level filter, a renderer printing to the ``sys.stderr`` of that moment,
often a ``redirect_stderr`` buffer). Left in place, it made every later
``structlog.testing.capture_logs`` see nothing below WARNING, and
supervisor tests waiting for an info event failed only in a full run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

import llamad
from llamad.cli import install as cli_install


@pytest.fixture(autouse=True, scope="session")
def _bench_records_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A bench result a test records (``bench.common.record``) lands in a
    temporary folder, never in bench/results."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LLAMAD_BENCH_RESULTS", str(tmp_path_factory.mktemp("bench-results")))
        yield


@pytest.fixture(autouse=True)
def _structlog_restored() -> Iterator[None]:
    configured = structlog.is_configured()
    saved = structlog.get_config()
    yield
    if configured:
        structlog.configure(**saved)
    else:
        structlog.reset_defaults()


@pytest.fixture
def installation_seen_by_the_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """``llamad install-unit`` refuses an installation under /tmp (the service's
    /tmp is private: test_install_unit_refuses_a_config_in_a_private_tmp and
    test_paths_in_a_home_are_bound_and_a_private_tmp_is_refused check that). A
    checkout cloned there, as the clean-clone CI check does, is taken as
    installed elsewhere, so the rest of the unit rendered for it is checked."""
    here = [sys.prefix, sys.base_prefix, str(Path(llamad.__file__).resolve().parents[1])]
    private = cli_install._PRIVATE
    if any(os.path.realpath(p).startswith(tuple(d + "/" for d in private)) for p in here):
        monkeypatch.setattr(cli_install, "_PRIVATE", ())
