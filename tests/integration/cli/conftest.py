"""Fixtures for the CLI tests: the ``llamad`` command run as a subprocess
against a real daemon (one per module, the client tests' harness: the default
model, one thread, small save thresholds)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# The client tests' daemon harness (tests/integration/client/daemon_proc.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "client"))

from daemon_proc import DaemonProc


@pytest.fixture(scope="module")
def daemon() -> Iterator[DaemonProc]:
    proc = DaemonProc()
    try:
        proc.start()
        yield proc
    finally:
        proc.close()
