"""Run the ``llamad`` command as a user does: a subprocess, its stdout and stderr apart."""

from __future__ import annotations

import subprocess
import sys

from llamad.testing import scrubbed_env

__all__ = ["llamad", "llamad_command"]


def llamad_command(endpoint: str | None, *args: str) -> list[str]:
    base = [sys.executable, "-m", "llamad.cli"]
    return [*base, "--endpoint", endpoint, *args] if endpoint else [*base, *args]


def llamad(
    endpoint: str | None,
    *args: str,
    input: str | None = None,
    timeout: float = 120.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``llamad --endpoint ENDPOINT ARGS...``, its output captured, in an
    environment without the caller's ``LLAMAD_*`` settings (``env``: added)."""
    return subprocess.run(
        llamad_command(endpoint, *args),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=scrubbed_env(env),
        check=False,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
