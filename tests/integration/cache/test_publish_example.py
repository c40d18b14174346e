"""The standalone cache example runs end to end and cleans up after itself (SPEC C11)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from llamad.tiers import LOCAL_TIERS

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def test_standalone_example_saves_resolves_loads_and_prints_counters() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "cache_standalone.py"),
         "--tokens", "1024", "--bytes-per-token", "4096"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )  # fmt: skip
    out, _ = proc.communicate(timeout=150)
    assert proc.returncode == 0, out
    for tier in LOCAL_TIERS:
        assert re.search(rf"^  {tier} +\d+ tokens -> published", out, re.M), out
    assert "prefix hit on 1024 tokens from disk" in out, out
    counters = dict(re.findall(r"^  (\w+) +(\d+)$", out, re.M))
    assert counters["saves_cold"] == "3"
    assert counters["hits_longest_prefix"] == "1"
    assert counters["corrupt_files"] == "0"
    assert int(counters["load_total_ns"]) > 0
    leftovers = [
        *Path("/dev/shm").glob(f"llamad-ram.demo{proc.pid}.*"),
        *Path("/dev/shm").glob(f"llamad-demo-demo{proc.pid}"),
    ]
    assert leftovers == []
