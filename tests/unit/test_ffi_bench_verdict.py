"""bench/ffi_bench.py judges its own bars, and a bar inside the measured spread is not met."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
ffi_bench = importlib.import_module("bench.ffi_bench")


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [
        ([0.96, 1.02, 1.10], "met"),
        ([0.95, 0.95, 0.95], "met"),
        ([0.93, 0.99, 1.05], "within noise"),  # median clears the bar, one round does not
        ([0.90, 0.94, 0.96], "within noise"),
        ([0.80, 0.90, 0.94], "BELOW BAR"),
    ],
)
def test_speed_verdict_is_met_only_when_the_whole_spread_clears_the_bar(
    ratios: list[float], expected: str
) -> None:
    assert ffi_bench.verdict(ratios, 0.95, at_least=True) == expected


@pytest.mark.parametrize(
    ("ratios", "expected"),
    [([1.1, 1.9], "met"), ([1.5, 2.3], "within noise"), ([2.1, 2.5], "ABOVE BAR")],
)
def test_upper_bound_verdict_is_met_only_when_the_whole_spread_stays_under(
    ratios: list[float], expected: str
) -> None:
    assert ffi_bench.verdict(ratios, 2.0, at_least=False) == expected


def test_a_recorded_run_needs_at_least_five_rounds() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.ffi_bench", "--rounds", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=50,
        check=False,
    )
    assert proc.returncode == 2
    assert "--rounds >= 5" in proc.stderr
