"""Supervisor fault tests share the toys and fixtures of the integration tests."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "integration" / "supervisor"))

from sup_helpers import events, no_zombies, toys_on_child_path

__all__ = ["events", "no_zombies", "toys_on_child_path"]
