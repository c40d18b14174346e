"""Supervisor integration tests: real child processes running the toys in sup_toys.py."""

from sup_helpers import events, no_zombies, toys_on_child_path

__all__ = ["events", "no_zombies", "toys_on_child_path"]
