"""Supervisor fault tests share the toys and fixtures of the integration tests."""

from sup_helpers import events, no_zombies, toys_on_child_path

__all__ = ["events", "no_zombies", "toys_on_child_path"]
