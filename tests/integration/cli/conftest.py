"""Fixtures for the CLI tests: the ``llamad`` command run as a subprocess
against a real daemon (one per module, the client tests' harness: the default
model, one thread, small save thresholds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from daemon_proc import DaemonProc


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProc]:
    proc = DaemonProc()
    try:
        proc.start()
        yield proc
    finally:
        proc.close()
