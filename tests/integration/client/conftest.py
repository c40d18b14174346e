"""Fixtures for the client tests: a served model and clients of it.

``start_served`` runs the real daemon when ``llamad.daemon`` exists and
otherwise the stand-in front over a real worker tree.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from served import Served
from standin_front import StandInFront

__all__ = ["start_served"]


class _StandIn(Served):
    def __init__(self, **tree: Any) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="lmc-", dir="/tmp"))
        self.front = StandInFront(f"ipc://{self._dir}/llamad.sock", **tree).start()
        super().__init__(self.front.endpoint, self.front.tree.registry.root, "smol")

    def close(self) -> None:
        self.front.close()


def start_served(**tree: Any) -> Iterator[Served]:
    served = _StandIn(**tree)
    try:
        yield served
    finally:
        served.close()


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    yield from start_served()
