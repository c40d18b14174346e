"""`make run`'s demo serves the default model cold, then warm, token-identically."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.model
@pytest.mark.timeout(180)
def test_demo_prints_cold_and_warm_completion_with_identical_replies() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "llamad.demo", "--max-tokens", "16"],
        capture_output=True,
        text=True,
        timeout=170,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "cold     time to first token" in out
    assert "warm     time to first token" in out
    assert "warm reply is token-identical to the cold one" in out
    reply = next(line for line in out.splitlines() if line.startswith("reply"))
    assert len(reply.split("'", 1)[-1].strip("'\"")) > 0
