"""Run the ``llamad`` command as a user does: a subprocess, its stdout and stderr apart."""

from __future__ import annotations

import os
import subprocess
import sys

__all__ = ["cli_env", "llamad", "llamad_command"]


def cli_env() -> dict[str, str]:
    """The environment without the caller's ``LLAMAD_*`` settings (but where
    the default model lives)."""
    keep = ("LLAMAD_CACHE_DIR", "LLAMAD_DEFAULT_MODEL")
    return {k: v for k, v in os.environ.items() if not k.startswith("LLAMAD_") or k in keep}


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
    """``llamad --endpoint ENDPOINT ARGS...``, its output captured (``env``: added
    to the environment)."""
    return subprocess.run(
        llamad_command(endpoint, *args),
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**cli_env(), **(env or {})},
        check=False,
        stdin=None if input is not None else subprocess.DEVNULL,
    )
