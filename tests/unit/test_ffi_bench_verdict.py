"""bench/ffi_bench.py judges its own bars from every round's samples, and a bar inside the
measured spread is not met."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from bench.common import show

import bench_samples as samples

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


def test_the_report_judges_the_per_round_ratios_of_the_recorded_samples() -> None:
    def row(text: str, name: str) -> list[str]:
        line = next(x for x in text.splitlines() if x.startswith(f"| {name} "))
        return [c.strip() for c in line.strip("|").split("|")]

    # Each round's ratio of medians: tg128 1.00 and 1.02, both clear 0.95.
    text = show(*samples.ffi(tg_ratios=(1.0, 1.02)))
    assert row(text, "tg128")[4:] == ["1.010", "1.000-1.020", "met"]
    assert row(text, "tg128+greedy")[6] == "info: peer does not sample"
    assert row(text, "pp512")[1] == "512"
    # One round below the bar: the median clears it, the spread does not.
    assert row(text := show(*samples.ffi(tg_ratios=(0.9, 1.0, 1.1))), "tg128")[6] == (
        "within noise"
    )
    assert row(show(*samples.ffi(tg_ratios=(0.8, 0.9))), "tg128")[6] == "BELOW BAR"
    # The state: unpack / copy per round, at most 2x.
    assert row(text, "unpack / plain copy, per round (bar <= 2)")[1] == "1.50 (1.50-1.50) met"
    over = show(*samples.ffi(unpack_ms=8.4))
    assert row(over, "unpack / plain copy, per round (bar <= 2)")[1] == "2.10 (2.10-2.10) ABOVE BAR"
