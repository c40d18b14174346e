"""Fixtures for the client tests: one real daemon per module, serving the default model.

``start_served(**options)`` starts ``python -m llamad.daemon`` with the
model table's ``options`` (``max_queue=0``, ...) and stops it with SIGTERM.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from daemon_proc import DaemonProc
from served import Served

__all__ = ["start_served"]


def start_served(**options: Any) -> Iterator[DaemonProc]:
    daemon = DaemonProc(**options)
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from start_served()
