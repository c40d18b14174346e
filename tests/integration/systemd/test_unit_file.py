"""The shipped unit and ``llamad install-unit``'s output, as systemd reads them.

``systemd-analyze verify`` loads a unit as PID 1 would (every directive
parsed, the ``ExecStart`` binary present and executable) without a running
systemd; a warning (an unknown key, a value it cannot parse) makes it print
and go on, so the tests demand an empty output as well as exit 0.
``systemd-analyze security --offline=true`` scores the sandbox: the tests
hold the score and the exact list of checks that stay open, each of them
explained in docs/internals/operations.md, so a weakened unit fails here.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad import paths
from llamad.cli.errors import EXIT_OK
from llamad.cli.main import main
from llamad.config import load_config
from llamad.daemon.unit import SHIPPED_EXEC, stop_timeout_s
from tools import tool

pytestmark = [pytest.mark.model, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "packaging" / "systemd" / "llamad.service"
EXAMPLE = REPO / "packaging" / "systemd" / "llamad.toml"

EXPOSURE_AT_MOST = 0.8
"""Measured with systemd 252 on the shipped unit (README, operations.md)."""
OPEN_CHECKS = {
    # Each one is a decision (docs/internals/operations.md, "What stays open").
    "SystemCallFilter=~@resources",  # ggml/libgomp call sched_setscheduler
    "RemoveIPC=",  # the ram_file tier outlives a restart
    "RootDirectory=/RootImage=",
    "RestrictAddressFamilies=~AF_UNIX",  # ipc endpoints
    "RestrictAddressFamilies=~AF_(INET|INET6)",  # tcp endpoints
    "ProtectProc=",  # clients of other users would be refused
    "ProcSubset=",  # boot_id, which process identity needs
    "DeviceAllow=",  # char-rtc:r, from ProtectClock
}


def analyze(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LC_ALL": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"}
    return subprocess.run(
        [tool("systemd-analyze"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def verified(unit: Path) -> None:
    proc = analyze("verify", str(unit))
    assert proc.returncode == 0 and proc.stdout + proc.stderr == "", (
        f"systemd-analyze verify {unit}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
    )


@pytest.fixture
def visible_dir() -> Iterator[Path]:
    """Not in /tmp, which install-unit refuses (the service's /tmp is private)."""
    path = Path(tempfile.mkdtemp(prefix="llamad-unit-file-", dir="/dev/shm"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def shipped_copy(tmp_path: Path) -> Path:
    """The shipped unit, its ExecStart binary (``/opt/llamad/.venv/bin/llamad``,
    absent here) moved to an executable stub: verify checks that it exists."""
    stub = tmp_path / "opt" / "llamad" / ".venv" / "bin" / "llamad"
    stub.parent.mkdir(parents=True)
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    text = SHIPPED.read_text()
    assert text.count(f"ExecStart={SHIPPED_EXEC[0]} ") == 1
    unit = tmp_path / "llamad.service"
    unit.write_text(text.replace(f"ExecStart={SHIPPED_EXEC[0]} ", f"ExecStart={stub} "))
    return unit


def test_the_shipped_unit_verifies(tmp_path: Path) -> None:
    verified(shipped_copy(tmp_path))


def test_verify_reports_a_directive_systemd_does_not_know(tmp_path: Path) -> None:
    # The check above can fail: a misspelt key passes with exit 0 and a warning.
    unit = shipped_copy(tmp_path)
    unit.write_text(unit.read_text().replace("ProtectClock=yes", "ProtectClocks=yes"))
    with pytest.raises(AssertionError, match="Unknown key"):
        verified(unit)


def test_install_unit_writes_a_unit_that_verifies_for_this_machine(
    tmp_path: Path, visible_dir: Path, installation_seen_by_the_service: None
) -> None:
    config = visible_dir / "llamad.toml"
    config.write_text(
        '[cache.policy]\nevict_save_timeout_ms = 60000\n[models.m]\npath = "default"\n'
    )
    assert main(["install-unit", "--dir", str(tmp_path), "--config", str(config)]) == EXIT_OK
    unit = tmp_path / "llamad.service"
    verified(unit)
    text = unit.read_text()
    assert f"ExecStart={sys.executable} -m llamad.daemon --config {config}\n" in text
    # 10 s gateway + 10 s front + (60 s saves + 10 s) workers + 10 s cache-meta + 30 s margin
    assert "TimeoutStopSec=130s\n" in text


def security(unit: Path) -> tuple[float, set[str]]:
    proc = analyze("security", "--offline=true", "--json=short", str(unit))
    assert proc.returncode == 0, proc.stderr
    checks = json.loads(proc.stdout)
    text = analyze("security", "--offline=true", str(unit)).stdout
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d)", text)
    assert match, text
    return float(match.group(1)), {c["name"] for c in checks if c["set"] is False}


def test_the_shipped_unit_keeps_its_security_score(tmp_path: Path) -> None:
    score, open_checks = security(SHIPPED)
    assert open_checks == OPEN_CHECKS
    assert score <= EXPOSURE_AT_MOST


@pytest.mark.parametrize("line", ["MemoryDenyWriteExecute=yes", "PrivateUsers=yes"])
def test_a_weakened_unit_fails_the_checks(tmp_path: Path, line: str) -> None:
    # The score has one decimal: a small weakening may leave it at 0.8, and
    # the list of open checks is what catches it.
    unit = tmp_path / "llamad.service"
    unit.write_text(SHIPPED.read_text().replace(line + "\n", ""))
    _, open_checks = security(unit)
    assert open_checks - OPEN_CHECKS == {line.partition("=")[0] + "="}


def test_a_unit_without_its_network_sandbox_scores_worse(tmp_path: Path) -> None:
    unit = tmp_path / "llamad.service"
    unit.write_text(SHIPPED.read_text().replace("PrivateNetwork=yes\n", ""))
    score, _ = security(unit)
    assert score > EXPOSURE_AT_MOST


def test_the_example_config_loads_and_its_shutdown_fits_the_shipped_unit(tmp_path: Path) -> None:
    # The example's directories exist only on a server set up as it says:
    # here they are moved to this machine's cache and a scratch directory.
    text = EXAMPLE.read_text().replace("/var/cache/llamad", str(paths.cache_root()))
    text = text.replace("/run/llamad", str(tmp_path / "run"))
    text = text.replace("/var/lib/llamad", str(tmp_path / "state"))
    config = tmp_path / "llamad.toml"
    config.write_text(text)
    loaded = load_config(config, env={})
    assert list(loaded.models) == ["smollm2"]
    assert loaded.endpoint == f"ipc://{tmp_path}/run/llamad.sock"
    stop = re.search(r"^TimeoutStopSec=(\d+)s$", SHIPPED.read_text(), re.MULTILINE)
    assert stop and stop_timeout_s(loaded) <= int(stop.group(1))
