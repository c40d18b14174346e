"""Fixtures for the client tests: one real daemon per module, serving the default model.

``daemon_proc.start_served(**options)`` starts ``python -m llamad.daemon`` with the
model table's ``options`` (``max_queue=0``, ...) and stops it with SIGTERM.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from daemon_proc import start_served
from served import Served


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from start_served()
