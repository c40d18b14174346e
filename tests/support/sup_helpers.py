"""Shared fixtures and helpers for the supervisor integration and fault tests."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from llamad.supervisor import ChildSpec, Restart, Start
from llamad.testing import wait_until

TOYS_DIR = Path(__file__).resolve().parent

#: Generous: "eventually" checks must hold on a loaded 2-core machine.
EVENTUALLY = 30.0


@pytest.fixture(scope="session", autouse=True)
def toys_on_child_path() -> Iterator[None]:
    """Children import ``sup_toys`` by name: put this folder on their path."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(TOYS_DIR), *([old] if old else [])])
    yield
    if old is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = old


def zombie_children() -> list[psutil.Process]:
    zombies = []
    for proc in psutil.Process().children():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                zombies.append(proc)
        except psutil.NoSuchProcess:
            pass
    return zombies


@pytest.fixture(autouse=True)
def no_zombies() -> Iterator[None]:
    """After every test, no child of the test process is left unreaped."""
    yield
    deadline = time.monotonic() + 5.0
    while zombie_children() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert zombie_children() == []


class EventLog:
    """The JSON-lines file the toys append to."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def of(self, event: str, name: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.read() if e["event"] == event and name in (None, e["name"])]

    def sequence(self, *events: str) -> list[tuple[str, str]]:
        """``(event, name)`` pairs of the given kinds, in file order."""
        return [(e["event"], e["name"]) for e in self.read() if e["event"] in events]

    def wait_for(
        self, event: str, name: str | None = None, count: int = 1, timeout: float = EVENTUALLY
    ) -> list[dict[str, Any]]:
        return wait_until(
            lambda: (found := self.of(event, name)) and len(found) >= count and found,
            f"{count} x {event} {name or ''}",
            timeout,
        )


@pytest.fixture
def events(tmp_path: Path) -> EventLog:
    return EventLog(tmp_path / "events.jsonl")


def toy(
    log: EventLog, function: str, name: str, *args: Any, restart: str = "permanent", **spec: Any
) -> ChildSpec:
    """A child spec running ``sup_toys.<function>(log, name, *args)``."""
    return ChildSpec(
        name,
        Start(f"sup_toys:{function}", (log.path, name, *args)),
        restart=Restart(restart),
        **spec,
    )


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie has finished running)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
