"""System tools some tests run (``scripts/tools.py`` lists and installs them).

A missing tool fails the test that needs it, with the command that installs
it: a suite that skipped them would pass without checking what they check.
"""

from __future__ import annotations

import shutil

import pytest


def tool(command: str) -> str:
    """The path of ``command``; the test fails when it is not installed."""
    path = shutil.which(command)
    if path is None:
        pytest.fail(
            f"{command} is not installed: `make setup` installs it "
            "(scripts/tools.py --install), or install it by hand",
            pytrace=False,
        )
    return path
