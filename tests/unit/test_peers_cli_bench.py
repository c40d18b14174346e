"""`llamad bench peers` runs one quick, unrecorded round of bench/peers_bench.py."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from llamad.cli import main as cli

pytestmark = pytest.mark.timeout(30)


def _ran(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> list[str]:
    seen: list[list[str]] = []

    def fake_run(command: list[str], **_: Any) -> subprocess.CompletedProcess[bytes]:
        seen.append(command)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)
    args = cli.build_parser().parse_args(argv)
    assert args.run(args) == 0
    assert len(seen) == 1
    return seen[0]


def test_bench_peers_runs_the_peers_bench_quick_and_never_records(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    command = _ran(monkeypatch, ["bench", "peers", "--skip", "llama-cpp-python"])
    assert command[:3] == [sys.executable, "-m", "bench.peers_bench"]
    assert "--quick" in command and "--no-record" in command
    assert command[-2:] == ["--skip", "llama-cpp-python"]


def test_bench_without_peers_still_runs_the_worker_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    command = _ran(monkeypatch, ["bench", "x"])
    assert command == [sys.executable, "-m", "bench.worker_bench", "--quick", "x"]


def test_bench_passes_options_that_come_right_after_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    command = _ran(monkeypatch, ["bench", "--rounds", "1"])
    assert command == [sys.executable, "-m", "bench.worker_bench", "--quick", "--rounds", "1"]


def test_bench_help_reaches_the_benchmark_script(monkeypatch: pytest.MonkeyPatch) -> None:
    command = _ran(monkeypatch, ["bench", "-h"])
    assert command == [sys.executable, "-m", "bench.worker_bench", "--quick", "-h"]
